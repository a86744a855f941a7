"""raysearch.tracking.sweeps: writing a trials table to Parquet and marking its selection.

:func:`write_parquet` writes a table 1,000 rows at a time (one row group each) with one schema
for the whole table; :func:`annotate_selection` returns a new table and leaves the caller's as
it was (pandas' copy-on-write: it copies no column it does not change).
"""

from __future__ import annotations

import math

import pandas as pd
import pyarrow.parquet as pq

from raysearch.tracking.sweeps import annotate_selection, write_parquet


def test_a_long_table_reads_back_whole_from_its_row_groups(tmp_path):
    n = 2345
    frame = pd.DataFrame({
        "trial": [f"t{i}" for i in range(n)],
        # no value in the first row group: its type comes from the whole column
        "variant": pd.Series([None] * 1500 + ["official"] * (n - 1500), dtype=object),
        # ints and strings in one param column are stored as strings
        "margin": pd.Series([i if i % 2 else f"m{i}" for i in range(n)], dtype=object),
        "complete": [i % 3 != 0 for i in range(n)],
        "val_ece": [i / n for i in range(n)],
    })
    path = write_parquet(frame, tmp_path / "trials.parquet")
    assert pq.ParquetFile(path).metadata.num_row_groups == 3  # ceil(2345 / 1000)
    back = pd.read_parquet(path)
    assert list(back.columns) == list(frame.columns)
    assert back["trial"].tolist() == frame["trial"].tolist()
    assert back["variant"].isna().sum() == 1500
    assert back["variant"].iloc[1500:].tolist() == ["official"] * (n - 1500)
    assert back["margin"].tolist() == [str(v) for v in frame["margin"]]
    assert back["complete"].tolist() == frame["complete"].tolist()
    assert back["val_ece"].tolist() == frame["val_ece"].tolist()
    # the caller's table is not changed (its mixed column stays as it was)
    assert frame["margin"].iloc[1] == 1
    # an empty table is a file with the columns and no rows
    empty = pd.read_parquet(write_parquet(frame.iloc[0:0], tmp_path / "empty.parquet"))
    assert list(empty.columns) == list(frame.columns)
    assert empty.empty


def test_the_selection_leaves_the_callers_table_as_it_was():
    # val (accuracy, ECE): a (0.90, 0.05), b (0.92, 0.03), c (0.93, 0.04), d failed.
    # b dominates a; front {b, c}; tolerance 0.015 -> accuracy >= 0.915: {b, c}, lowest ECE b
    frame = pd.DataFrame({
        "trial": ["a", "b", "c", "d"], "complete": [True, True, True, False],
        "config": ["{}"] * 4, "lr": [0.1, 0.2, 0.3, 0.4],
        "val_accuracy": [0.90, 0.92, 0.93, math.nan], "val_ece": [0.05, 0.03, 0.04, 0.01],
        "on_front": [True] * 4,  # a stale mark (a table read back) is replaced
    })
    before = frame.copy(deep=True)
    out = annotate_selection(frame, tolerance=0.015)
    assert out["on_front"].tolist() == [False, True, True, False]
    assert out["selected"].tolist() == [False, True, False, False]
    assert out["lr"].tolist() == [0.1, 0.2, 0.3, 0.4]
    pd.testing.assert_frame_equal(frame, before)
    assert "selected" not in frame
