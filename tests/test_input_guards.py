"""The guards against bad inputs of issue 39, one function at a time.

YAML that expands without limit, the key a ``train:`` error names, sweep names, options that can
never take effect, a storage folder that cannot be written, a tracking store another process
holds locked, what a trial needs of the Ray cluster, and folder walks into a symlink loop.
Their command-line cases (one line, exit 2, nothing written) are in tests/test_bad_inputs.py.
"""

from __future__ import annotations

import os
import re
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from clusters import stop_process
from formats import write_image_tree, write_tiny_imagenet
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

from raysearch.training.data import DatasetError, load_dataset
from raysearch.tune.cluster import trial_bundles, unmet_resources
from raysearch.tune.recipes import load_recipe
from raysearch.tune.settings import Resources, SweepSettings
from raysearch.tune.spaces import SpaceError, load_space
from raysearch.tune.storage import MAX_NAME_CHARS, check_storage, check_sweep_name

# --------------------------------------------------------------------------------------------
# YAML: no aliases, no huge or deeply nested files
# --------------------------------------------------------------------------------------------

#: Nine aliases per level, nine levels, inside a section that takes any key: 9**9 (387
#: million) strings once a check walks (or prints) the value of ``model.l8``.
_LAUGHS = "method: ce\nmodel:\n  name: mlp\n  l0: &l0 [lol, lol, lol, lol, lol]\n" + "".join(
    f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))


def test_chained_aliases_are_refused_before_they_expand(tmp_path):
    space = tmp_path / "laughs.yaml"
    space.write_text(_LAUGHS)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(SpaceError) as info:
        load_space(str(space))
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert str(info.value) == (
        f"{space}: line 5, column 12: YAML aliases (*l0) are not allowed in raysearch files "
        "(chained aliases expand without limit); write the value out")
    assert grown_kib < 50_000  # KiB: the document was never built


def test_a_recipe_with_aliases_is_refused(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("description: &d quick\nsource: *d\ntrain:\n  epochs: 2\n")
    with pytest.raises(SpaceError, match=r"r\.yaml: line 2, column 9: YAML aliases \(\*d\)"):
        load_recipe(str(recipe))


def test_an_anchor_without_alias_is_plain_yaml(tmp_path):
    space = tmp_path / "anchor.yaml"
    space.write_text("method: acls\nparams:\n  margin: &m {low: 1.0, high: 10.0}\n")
    assert list(load_space(str(space)).methods) == ["acls"]


def test_a_huge_file_is_refused_unread(tmp_path):
    space = tmp_path / "huge.yaml"
    space.write_text("method: ce\ndescription: '" + "x" * (1 << 20) + "'\n")
    with pytest.raises(SpaceError, match=r"huge\.yaml: 1048603 bytes; a raysearch YAML file "
                                         r"is at most 1048576 bytes$"):
        load_space(str(space))


def test_an_exported_config_with_aliases_or_duplicate_keys_is_refused(tmp_path):
    from raysearch.config import RunConfig

    laughs = tmp_path / "best.yaml"
    laughs.write_text("config:\n" + "".join("  " + line + "\n" for line in _LAUGHS.splitlines()))
    with pytest.raises(ValueError, match=r"best\.yaml: line 6, column 14: YAML aliases \(\*l0\)"):
        RunConfig.from_yaml(laughs)
    twice = tmp_path / "twice.yaml"
    twice.write_text("config:\n  method: ce\n  method: focal\n")
    with pytest.raises(ValueError, match=r"twice\.yaml: malformed YAML at line 3, column 3: "
                                         r"found duplicate key 'method'"):
        RunConfig.from_yaml(twice)


def test_a_deeply_nested_file_is_one_line(tmp_path):
    space = tmp_path / "deep.yaml"
    space.write_text("method: ce\ndescription: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(SpaceError, match=r"deep\.yaml: the YAML is nested too deeply$"):
        load_space(str(space))


# --------------------------------------------------------------------------------------------
# train: the key an error names is the key at fault
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("train", "message"), [
    # lr is at fault; epochs comes first and was named before
    ("epochs: 3\n  lr: -1.0", "train.lr: `lr` must be > 0, got -1.0"),
    ("batch_size: 16\n  momentum: 2.0", "train.momentum: `momentum` must be in [0, 1), got 2.0"),
    ("lr: 0.1\n  epochs: -2", "train.epochs: `epochs` must be >= 1, got -2"),
    # two keys at fault on their own: the first of them
    ("lr: -1.0\n  momentum: 2.0", "train.lr: `lr` must be > 0, got -1.0"),
    # two keys at fault together: the one checked, with its partner
    ("nesterov: true\n  momentum: 0.0",
     "train.nesterov: `nesterov` needs `momentum` > 0 (with train.momentum = 0.0)"),
    ("momentum: {low: 0.0, high: 0.9}\n  nesterov: true",
     "train.momentum: `nesterov` needs `momentum` > 0 (with train.nesterov = true)"),
    ("epochs: 5\n  nesterov: true\n  momentum: {low: 0.0, high: 0.9}",
     "train.nesterov: `nesterov` needs `momentum` > 0 (with train.momentum at its low end 0.0)"),
    ("schedule: multistep\n  epochs: 5",
     "train.schedule: `schedule: multistep` needs `milestones`, e.g. \"150,250\""),
])
def test_a_train_error_names_the_key_at_fault(tmp_path, train, message):
    space = tmp_path / "t.yaml"
    space.write_text(f"method: ce\ntrain:\n  {train}\n")
    with pytest.raises(SpaceError) as info:
        load_space(str(space))
    assert str(info.value) == f"{space}: {message}"


# --------------------------------------------------------------------------------------------
# Sweep names and settings that can never take effect
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "problem"), [
    ("../escape", "holds '/'"), ("a/b", "holds '/'"), ("..", "starts with '.'"),
    (".hidden", "starts with '.'"), ("-x", "starts with '-'"), ("", "is empty"),
    ("a b", "holds ' '"), ("it's", "holds \"'\""), ("tab\there", "holds '\\t'"),
    ("x" * (MAX_NAME_CHARS + 1), f"is longer than {MAX_NAME_CHARS} characters"),
])
def test_a_sweep_name_is_one_folder_of_sane_length(name, problem):
    with pytest.raises(ValueError, match="^sweep name ") as info:
        check_sweep_name(name)
    assert problem in str(info.value)
    assert "\n" not in str(info.value)
    # a sweep recorded before the rule (or by the Python API) still resumes under its name
    assert SweepSettings.from_record({"name": name}).name == name


@pytest.mark.parametrize("name", ["acls-20261127-101500", "run_1.2", "x" * MAX_NAME_CHARS,
                                  "lr=0.1,wd=5e-4", "é-ü", "a+b@c"])
def test_good_sweep_names(name):
    assert check_sweep_name(name) == name
    assert SweepSettings(name=name).name == name


def test_a_default_name_from_an_odd_file_name_is_valid(tmp_path):
    from raysearch.tune.sweep_record import default_sweep_name

    space = tmp_path / ".my space (v2).yaml"
    space.write_text("method: ce\n")
    name = default_sweep_name(load_space(str(space)))
    assert check_sweep_name(name) == name
    assert name.startswith("my_space__v2_-")


@pytest.mark.parametrize(("values", "message"), [
    ({"scheduler_metric": "val_ece"}, "--scheduler-metric val_ece has no effect without "
                                      "--scheduler asha"),
    ({"scheduler": "asha", "scheduler_metric": "val_ece_ts"},
     "--scheduler-metric val_ece_ts: the trials report no metric val_ece_ts every epoch"),
    ({"scheduler": "asha", "scheduler_metric": "val_nl"},
     "--scheduler-metric val_nl: the trials report no metric val_nl every epoch (did you "
     "mean nll?)"),
    ({"shift_samples": 100}, "--shift-samples has no effect without --shift-eval or "
                             "--shift-data"),
    ({"cpus_per_worker": 2}, "--cpus-per-worker and --gpus-per-worker size DDP workers"),
    ({"gpus_per_worker": 1}, "--cpus-per-worker and --gpus-per-worker size DDP workers"),
    ({"epochs": 3, "checkpoint_every": 5}, "--checkpoint-every 5 has no effect with --epochs 3"),
    ({"experiment": ""}, "--experiment must name an MLflow experiment, got an empty name"),
    ({"experiment": "  "}, "--experiment must name an MLflow experiment, got an empty name"),
])
def test_settings_that_can_never_take_effect(values, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        SweepSettings(**values)


def test_settings_that_do_take_effect():
    assert SweepSettings(scheduler="asha", scheduler_metric="nll").scheduler_metric == "val_nll"
    assert SweepSettings(scheduler="asha", scheduler_metric="val_brier").scheduler_metric == \
        "val_brier"
    SweepSettings(scheduler="asha", scheduler_metric="top2", metrics=("tests.x:top2",))
    SweepSettings(workers_per_trial=2, cpus_per_worker=0.5, gpus_per_worker=0)
    SweepSettings(epochs=3, checkpoint_every=3)
    SweepSettings(shift_data="/x", shift_samples=10)


def test_an_empty_experiment_name_creates_nothing(tmp_path):
    """What ``raysearch train --experiment ''`` meets: no experiment, no run."""
    from raysearch.tracking import ensure_experiment, get_client

    client, uri = get_client(f"sqlite:///{tmp_path / 'mlruns.db'}")
    with pytest.raises(ValueError, match="^--experiment must name an MLflow experiment, got an "
                                         "empty name$"):
        ensure_experiment(client, " ", uri)
    assert [e.name for e in client.search_experiments()] == ["Default"]


# --------------------------------------------------------------------------------------------
# Storage: probed for writing, nothing left behind
# --------------------------------------------------------------------------------------------


def test_the_storage_probe_leaves_nothing_behind(tmp_path):
    check_storage(str(tmp_path / "a" / "b"))
    assert list(tmp_path.iterdir()) == []  # the folders made for the probe are gone
    (tmp_path / "kept").mkdir()
    check_storage(str(tmp_path / "kept"))
    assert list((tmp_path / "kept").iterdir()) == []


def test_a_storage_folder_that_cannot_be_written(tmp_path):
    if os.geteuid() == 0:  # root writes through permissions; nobody writes into /proc/<pid>
        folder = Path(f"/proc/{os.getpid()}")
    else:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
    with pytest.raises(ValueError, match=f"^storage path {folder} cannot be written: "):
        check_storage(str(folder))


# --------------------------------------------------------------------------------------------
# A tracking store held locked by another process
# --------------------------------------------------------------------------------------------

_HOLD_LOCK = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("CREATE TABLE IF NOT EXISTS held (x)")
con.execute(f"BEGIN {sys.argv[2]}")
print("locked", flush=True)
time.sleep(300)
"""


def hold_lock(db: Path, kind: str) -> subprocess.Popen:
    """A process holding `db` locked (``EXCLUSIVE``: no reader; ``IMMEDIATE``: no writer)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(db), kind],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.parametrize(("kind", "write", "refused"), [
    ("EXCLUSIVE", False, True), ("EXCLUSIVE", True, True), ("IMMEDIATE", False, False),
    ("IMMEDIATE", True, True),
])
def test_a_store_locked_by_another_process(tmp_path, kind, write, refused):
    from raysearch.tracking.runs import probe_tracking_store

    db = tmp_path / "mlruns.db"
    holder = hold_lock(db, kind)
    try:
        if not refused:
            probe_tracking_store(f"sqlite:///{db}", write=write, timeout=0.5)
            return
        with pytest.raises(ValueError, match="is locked by another process") as info:
            probe_tracking_store(f"sqlite:///{db}", write=write, timeout=0.5)
    finally:
        stop_process(holder)
    assert str(info.value) == (
        f"tracking store {db} is locked by another process (SQLite: database is locked, after "
        "0.5 s): wait until it lets go or use another --tracking-uri")
    probe_tracking_store(f"sqlite:///{db}", write=True)  # free again


def test_a_store_that_is_not_a_database(tmp_path):
    from raysearch.tracking.runs import probe_tracking_store

    db = tmp_path / "notes.db"
    db.write_text("not a database, " * 100)
    with pytest.raises(ValueError, match=f"^tracking store {db} cannot be read: SQLite: file "
                                         "is not a database$"):
        probe_tracking_store(f"sqlite:///{db}")
    probe_tracking_store(f"sqlite:///{tmp_path / 'missing.db'}")  # MLflow creates it
    assert not (tmp_path / "missing.db").exists()
    with sqlite3.connect(tmp_path / "ok.db") as con:
        con.execute("CREATE TABLE t (x)")
    probe_tracking_store(f"sqlite:///{tmp_path / 'ok.db'}", write=True)


# --------------------------------------------------------------------------------------------
# What a trial needs of the Ray cluster (the numbers of ray.nodes() / cluster_resources())
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("resources", "nodes", "message"), [
    (Resources(cpus_per_trial=4), [{"CPU": 2.0}],
     "--cpus-per-trial 4 needs 4 CPUs per trial but this machine has 2"),
    (Resources(cpus_per_trial=6), [{"CPU": 4.0}, {"CPU": 4.0}],
     "--cpus-per-trial 6 needs 6 CPUs on one node but the largest node of this machine has 4"),
    (Resources(gpus_per_trial=0.5), [{"CPU": 8.0}],
     "--gpus-per-trial 0.5 needs 0.5 GPU per trial but this machine has 0; leave the GPU "
     "options out to train on the CPU"),
    (Resources(cpus_per_trial=16, gpus_per_trial=1), [{"CPU": 8.0, "GPU": 1.0}],
     "--cpus-per-trial 16 needs 16 CPUs per trial but this machine has 8"),
    (Resources(workers_per_trial=3, cpus_per_worker=4), [{"CPU": 8.0}],
     "--workers-per-trial 3 --cpus-per-worker 4 needs 12 CPUs per trial but this machine "
     "has 8"),
    (Resources(workers_per_trial=2, cpus_per_worker=1, gpus_per_worker=2),
     [{"CPU": 8.0, "GPU": 1.0}] * 5,
     "--workers-per-trial 2 --gpus-per-worker 2 needs 2 GPU on one node but the largest node "
     "of this machine has 1"),
    (Resources(workers_per_trial=4, cpus_per_worker=4, gpus_per_worker=1),
     [{"CPU": 8.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 2.0}], None),
    (Resources(cpus_per_trial=0.5, gpus_per_trial=0.25), [{"CPU": 1.0, "GPU": 1.0}], None),
])
def test_what_a_trial_needs_of_the_cluster(resources, nodes, message):
    total = {kind: sum(node.get(kind, 0.0) for node in nodes) for kind in ("CPU", "GPU")}
    bundles, options = trial_bundles(resources)
    assert unmet_resources(bundles, options, "this machine", nodes=nodes,
                           total=total) == message


@pytest.mark.integration
def test_a_cluster_waits_for_an_autoscaler_then_says_so(ray_session, caplog):
    from raysearch.tune.cluster import check_resources

    resources = Resources(cpus_per_trial=1000)
    with pytest.raises(ValueError, match="^--cpus-per-trial 1000 ") as info:
        check_resources(resources, "127.0.0.1:6379", wait_s=1.0)
    assert str(info.value).startswith(
        "--cpus-per-trial 1000 needs 1000 CPUs per trial but the Ray cluster has ")
    assert str(info.value).endswith(", after waiting 1 s for an autoscaler to add nodes "
                                    "(RAYSEARCH_RESOURCE_WAIT_S sets how long)")
    assert "waiting up to 1 s for an autoscaler to add nodes" in caplog.text
    check_resources(Resources(cpus_per_trial=1), "127.0.0.1:6379", wait_s=1.0)  # fits


# --------------------------------------------------------------------------------------------
# Folder walks and symlink loops
# --------------------------------------------------------------------------------------------


def test_the_walk_lists_what_torchvision_lists(tmp_path):
    from raysearch.training.data._vision_common import _image_samples

    root = tmp_path / "tree"
    write_image_tree(root, per_class=3)
    (root / "cat" / "deeper").mkdir()
    (root / "cat" / "deeper" / "x.PNG").write_bytes(b"")
    (root / "cat" / "notes.txt").write_text("not an image\n")
    (root / "bee" / "ants").symlink_to(root / "ant")  # a link elsewhere is followed
    _, class_to_idx = find_classes(str(root))
    expected = make_dataset(str(root), class_to_idx, extensions=IMG_EXTENSIONS)
    assert _image_samples("imagefolder", root, class_to_idx, IMG_EXTENSIONS) == expected
    assert len(expected) == 3 * 3 + 1 + 3


@pytest.mark.parametrize(("link", "target"), [("cat/again", "."), ("cat/up", ".."),
                                          ("ant/a/b/top", "../../..")])
def test_an_imagefolder_tree_with_a_symlink_loop(tmp_path, link, target):
    root = tmp_path / "tree"
    write_image_tree(root, classes=("ant", "cat"), per_class=2)
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(target)
    with pytest.raises(DatasetError) as info:
        load_dataset("imagefolder", data_dir=str(root), seed=0)
    assert str(info.value) == (
        f"imagefolder: the link {root / link} leads to {(root / link).resolve()}, a folder it "
        "is in (a symlink loop); remove it")


def test_tiny_imagenet_with_a_symlink_loop(tmp_path):
    write_tiny_imagenet(tmp_path)
    train = next((tmp_path / "tiny-imagenet-200" / "train").iterdir())
    (train / "images" / "loop").symlink_to("..")
    with pytest.raises(DatasetError, match=r"^tiny_imagenet: the link .*/images/loop leads to "):
        load_dataset("tiny_imagenet", data_dir=str(tmp_path), seed=0)


def test_newsgroups_reads_its_groups_one_level_deep(tmp_path):
    """20 Newsgroups lists each group folder once: a loop inside one is never entered."""
    from test_beyond_cifar import write_bydate

    write_bydate(tmp_path, per_group=10)
    (tmp_path / "20news-bydate-train" / "sci.space" / "loop").symlink_to("..")
    data = load_dataset("newsgroups20", data_dir=str(tmp_path), seed=0, val_fraction=0.2)
    assert len(data.train) + len(data.val) == 10 * 4
