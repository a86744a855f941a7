"""A user's own model, dataset, loss, calibrator and metric for raysearch.

Used from the folder that holds this package (no installation needed)::

    raysearch sweep space.yaml --metric tabular_calib.metrics:confidence_gap

or installed (``pip install .``), by the short names its entry points declare
(``tabular_mlp``, ``synthetic_table``, ``poly1``, ``vector_scaling``).
"""

__version__ = "0.1.0"
