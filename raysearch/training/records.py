"""The keys of a trial's reports and config that the trainable writes and the tracking reads.

A trial reports dicts to Ray Tune (``tune.report``); besides its metrics they carry these keys,
and its final checkpoint holds :data:`ARTIFACT_FILES`. A repeated sweep's trial configs carry
:data:`CONFIG_ID_KEY` and :data:`SEED_INDEX_KEY`. They are defined here, below both the
trainable (which writes them) and the MLflow tracking (which reads them), so that neither
imports the other. Plain constants: this module imports nothing.
"""

__all__ = ["ARTIFACT_FILES", "CHECKPOINT_SKIPPED", "CLASS_IOU", "COMPLETED", "CONFIDENCE_PLOT",
           "CONFIG_ID_KEY", "DEGENERATE_CALIBRATORS", "DIVERGED", "EPOCH_HISTORY", "LOGITS_FILE",
           "NODE_ID", "RELIABILITY", "RELIABILITY_PLOT", "RESUMED_FROM", "SEED_INDEX_KEY",
           "SHIFT_PLOT", "SHIFT_TABLE", "WEIGHTS_FILE"]

#: Parquet file (in the final checkpoint and the MLflow run) with val/test logits and labels.
LOGITS_FILE = "logits.parquet"
#: Dataset-shift results (``--shift-eval`` or ``--shift-data``): a table and a plot.
SHIFT_TABLE = "shift.csv"
SHIFT_PLOT = "shift.png"
#: Segmentation trials: per-class IoU (validation and test) and the confidence maps of a few
#: validation images (image | ground truth | prediction | confidence, as MbLS Fig. 3).
CLASS_IOU = "class_iou.csv"
CONFIDENCE_PLOT = "confidence_maps.png"

#: Result key set to True in the last report of a trial that ran all its epochs.
COMPLETED = "completed"
#: Result key holding the error message of a trial whose training loss became NaN/inf.
DIVERGED = "diverged"
#: Result key holding the test reliability-diagram bins (lists) in the last report.
RELIABILITY = "test_reliability"
#: Reliability diagram of the test set, drawn by the trial, in its final checkpoint.
RELIABILITY_PLOT = "reliability.png"
#: The final weights (the model's state dict) of a trial of a sweep run with ``--log-weights``.
WEIGHTS_FILE = "weights.pt"
#: Files of the final checkpoint that the tracking callback attaches to the trial's run.
ARTIFACT_FILES = (LOGITS_FILE, RELIABILITY_PLOT, SHIFT_TABLE, SHIFT_PLOT, CLASS_IOU,
                  CONFIDENCE_PLOT, WEIGHTS_FILE)
#: Result key holding the ID of the Ray node that trained (rank 0's node in a DDP trial).
NODE_ID = "node_id"
#: Result key, in every report of an attempt that resumed from a checkpoint: the epoch of that
#: checkpoint (the attempt trains from the next epoch on).
RESUMED_FROM = "resumed_from_epoch"
#: Result key, in the first report of an attempt whose checkpoint from Tune could not be read:
#: one line naming that ``state.pt`` and why, and the older checkpoint the attempt resumed
#: from instead (or that it started from scratch).
CHECKPOINT_SKIPPED = "checkpoint_skipped"
#: Result key, in the last report of a trial whose validation split is perfectly classified: the
#: post-hoc calibrators whose fit had no finite optimum (``degenerate``), comma-separated
#: (``"ts,ts+cw"``); the tracking sets it as the run's tag ``raysearch.calibrator_degenerate``.
DEGENERATE_CALIBRATORS = "calibrator_degenerate"
#: Result key: the epochs trained since the previous report and not reported on their own, a
#: list of ``{"epoch": e, "train_...": ..., "val_...": ...}`` (the tracking callback logs each at
#: ``step=e``). A report's own epoch is its top-level ``epoch`` and metrics.
EPOCH_HISTORY = "epoch_history"
#: Trial-config key of a repeated sweep: the sampled configuration a trial belongs to.
CONFIG_ID_KEY = "_config_id"
#: Trial-config key of a repeated sweep: k of the configuration's seed ``seed + k``.
SEED_INDEX_KEY = "_seed_index"
