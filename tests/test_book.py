"""The sweep's MLflow writer thread (writes in order, after their delay; flush ends it), the
driver's frozen heap while Tune runs and its trimmed heap."""

from __future__ import annotations

import threading
import time

import pytest
from mlflow.tracking import MlflowClient

from raysearch.tracking import book as book_module
from raysearch.tracking.book import _SweepBook


def _book(tmp_path) -> _SweepBook:
    return _SweepBook(MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}"))


def test_a_write_waits_its_delay_then_runs_in_order(tmp_path, monkeypatch):
    # Tune's loop queues a trial's last writes while it starts the next trial on the same
    # worker; the writer leaves the driver's GIL to it for WRITE_DELAY_S
    monkeypatch.setattr(book_module, "WRITE_DELAY_S", 60.0)
    book = _book(tmp_path)
    done: list[int] = []
    ran = threading.Event()
    book.submit(lambda: done.append(1), "t1")
    book.submit(lambda: (done.append(2), ran.set()), "t2")
    assert not ran.wait(0.5)  # 60 s to go
    assert done == []
    t0 = time.monotonic()
    book.flush()  # the end of a sweep (or a resume) does not wait for the delays
    assert done == [1, 2]
    assert time.monotonic() - t0 < 30.0
    # after a flush, writes wait their delay again
    book.submit(lambda: done.append(3), "t3")
    time.sleep(0.3)
    assert done == [1, 2]
    book.close()  # closing runs what is queued, without the delay
    assert done == [1, 2, 3]
    assert not book.writer.is_alive()


def test_a_write_queued_long_ago_runs_without_waiting(tmp_path, monkeypatch):
    monkeypatch.setattr(book_module, "WRITE_DELAY_S", 0.2)
    book = _book(tmp_path)
    ran = threading.Event()
    book.submit(ran.set, "t1")
    assert ran.wait(10.0)
    assert book.failed_writes == 0
    book.close()


def test_the_heap_of_a_sweep_is_frozen_while_tune_runs_and_given_back():
    import gc

    from raysearch.tune.heap import frozen_heap

    before = gc.get_freeze_count()
    kept = [object() for _ in range(10)]  # objects that exist when the sweep starts
    with frozen_heap():
        assert gc.get_freeze_count() >= before + len(kept)  # no collection walks them
    assert gc.get_freeze_count() == before  # all collectable again afterwards
    try:
        with frozen_heap():
            raise KeyboardInterrupt  # Ctrl-C in Tune's loop
    except KeyboardInterrupt:
        pass
    assert gc.get_freeze_count() == before


def test_frozen_heap_blocks_nest_and_only_the_outermost_gives_the_heap_back():
    import gc

    from raysearch.tune.heap import frozen_heap

    before = gc.get_freeze_count()
    with frozen_heap():
        outer = gc.get_freeze_count()
        with frozen_heap():
            late = [object() for _ in range(10)]  # made inside: stays out of the freeze
            assert gc.get_freeze_count() == outer
        assert gc.get_freeze_count() == outer  # the inner block's end unfroze nothing
        assert len(late) == 10
    assert gc.get_freeze_count() == before


def test_the_ends_imports_start_once_every_trial_started_and_one_ended(tmp_path):
    import sys

    from raysearch.tracking.callback import MlflowSweepCallback
    from raysearch.tracking.export import warm_end_imports

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    experiment = client.create_experiment("warm")
    parent = client.create_run(experiment).info.run_id
    callback = MlflowSweepCallback(client, experiment, parent, "warm", configs=None, total=2)
    book = callback.book
    book.started["t1"] = time.monotonic()
    # one of two trials started: the other will need a worker
    book.warm_end(callback.total, warm_end_imports)
    assert book.warming is None
    book.started["t2"] = time.monotonic()
    book.warm_end(callback.total, warm_end_imports)
    thread = book.warming
    assert thread is not None
    assert thread.name == "raysearch-warm"
    thread.join(60.0)
    assert not thread.is_alive()
    assert {"raysearch.training.plots", "plotly.io"} <= set(sys.modules)
    book.warm_end(callback.total, warm_end_imports)  # once per sweep
    assert book.warming is thread
    callback.close()


def test_an_ended_trial_keeps_only_its_run_id_start_and_number(tmp_path):
    # a 10,000-trial sweep's driver keeps no per-epoch state of the trials that ended
    book = _book(tmp_path)
    for tid in ("t1", "t2"):
        book.children[tid] = f"run-{tid}"
        book.started[tid] = 1.0
        book.steps[tid] = 3
        book.nodes[tid] = "node-a"
        book.resumed[tid] = 2
        book.last_line[tid] = 1.0
        book.artifact_uris[tid] = f"file:///art/{tid}"
    book.release("t1")
    assert book.children == {"t1": "run-t1", "t2": "run-t2"}  # the end's selection reads them
    assert set(book.started) == {"t1", "t2"}  # a trial that ended is not started again
    for running in (book.steps, book.nodes, book.resumed, book.last_line, book.artifact_uris):
        assert set(running) == {"t2"}
    book.close()


def test_trimming_hands_freed_heap_pages_back_to_the_system():
    import sys

    from raysearch.tune.heap import HeapTrim, trim_free_memory

    if not sys.platform.startswith("linux") or not trim_free_memory():
        pytest.skip("no glibc malloc_trim on this platform: HeapTrim does nothing here "
                    "(Linux/glibc only)")

    def resident_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    # 200 MiB of 2-KiB blocks (malloc's heap, not mmap) with every 64th kept: freed, the rest
    # stays resident, as a long sweep's driver heap does
    blocks = [bytearray(2048) for _ in range(100_000)]
    kept = blocks[::64]
    before = resident_mib()
    del blocks
    freed = resident_mib()
    assert trim_free_memory()
    after = resident_mib()
    assert freed - after > 0.5 * 195, (before, freed, after)  # most of it back, not before
    assert len(kept) == 1563

    trim = HeapTrim(every=3)  # trims once every third ended trial
    for _ in range(7):
        trim.on_trial_complete(0, [], None)
    trim.on_trial_error(0, [], None)
    assert (trim.ended, trim.trims) == (8, 2)
    with pytest.raises(ValueError, match="every"):
        HeapTrim(every=0)
