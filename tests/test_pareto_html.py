"""raysearch.tracking.pareto_html: the sweep's interactive Pareto front (``pareto.html``).

A hand-made trials table of four trials (what ``finalize_sweep`` draws: complete rows with
``on_front`` and ``selected`` from :func:`annotate_selection`), written to a page that is read
back as Plotly's figure JSON, then opened from ``file://`` in a headless Chromium (the DevTools
helpers of tests/test_ui.py) to check that it draws, switches metric pairs, hovers the run
names and requests nothing from the network.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from raysearch.tracking.pareto_html import metric_pairs, pareto_html
from raysearch.tracking.sweeps import annotate_selection

NAMES = ["demo-000-ce", "demo-001-mbls", "demo-002-acls", "demo-003-ls"]


def _frame() -> pd.DataFrame:
    """Four complete trials; the front and the selection derived by hand below.

    Validation (accuracy, ECE): t0 (0.90, 0.05), t1 (0.92, 0.03), t2 (0.93, 0.04),
    t3 (0.91, 0.02). t1 dominates t0 (higher accuracy, lower ECE); t1, t2 and t3 are not
    dominated (each trades accuracy for ECE), so the front is {t1, t2, t3}, by ECE t3, t1, t2.
    Tolerance 0.015: best accuracy 0.93, eligible accuracy >= 0.915 -> {t1, t2}; lowest ECE
    among them: t1 (0.03) is selected.
    Test (accuracy, ECE): t0 (0.89, 0.06), t1 (0.90, 0.05), t2 (0.92, 0.07), t3 (0.88, 0.03):
    t1 dominates t0, so the test front is, by ECE, t3 (0.03), t1 (0.05), t2 (0.07).
    """
    frame = pd.DataFrame({
        "trial": NAMES, "run_id": [f"r{i}" for i in range(4)],
        "trial_id": [f"id{i}" for i in range(4)], "status": "FINISHED", "complete": True,
        "outcome": "complete", "method": ["ce", "mbls", "acls", "ls"],
        "lr": [0.1, 0.05, 0.02, 0.01], "alpha": [float("nan"), 10.0, 0.1, float("nan")],
        "val_accuracy": [0.90, 0.92, 0.93, 0.91], "val_ece": [0.05, 0.03, 0.04, 0.02],
        "val_nll": [0.35, 0.30, 0.28, 0.33], "val_ece_sem": float("nan"),
        "test_accuracy": [0.89, 0.90, 0.92, 0.88], "test_ece": [0.06, 0.05, 0.07, 0.03],
        "val_overconfidence": [0.2, 0.1, 0.1, 0.1], "config": "{}",
    })
    return annotate_selection(frame, tolerance=0.015)


def _figure(page: str) -> tuple[list[dict], dict]:
    """The (data, layout) handed to ``Plotly.newPlot`` in a written page."""
    decoder = json.JSONDecoder()
    at = page.index("Plotly.newPlot(") + len("Plotly.newPlot(")
    values = []
    for _ in range(3):  # the div id, the data, the layout
        while page[at] in " \n,":
            at += 1
        value, at = decoder.raw_decode(page, at)
        values.append(value)
    _, data, layout = values
    return data, layout


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    frame = _frame()
    assert list(frame["on_front"]) == [False, True, True, True]
    assert list(frame["selected"]) == [False, True, False, False]
    return pareto_html(frame, tmp_path_factory.mktemp("pareto") / "pareto.html",
                       title="sweep demo")


def test_page_names_every_trial_and_marks_the_front_and_the_selected(page):
    text = page.read_text(encoding="utf-8")
    for name in NAMES:
        assert name in text
    assert "<title>sweep demo</title>" in text
    data, layout = _figure(text)
    by_name = {trace["name"]: trace for trace in data}
    assert set(by_name) == {"ce", "mbls", "acls", "ls", "Pareto front", "selected"}
    star = by_name["selected"]
    assert star["marker"]["symbol"] == "star"
    assert star["x"] == [0.03]
    assert star["y"] == [0.92]
    assert "<b>demo-001-mbls</b> (selected, on the Pareto front)" in star["text"][0]
    front = by_name["Pareto front"]
    assert front["x"] == [0.02, 0.03, 0.04]
    assert front["y"] == [0.91, 0.92, 0.93]
    # the hover text: run name, params (a NaN param left out), metrics in percent / plain
    hover = by_name["ce"]["text"][0]
    assert hover.startswith("<b>demo-000-ce</b><br>outcome: complete")
    assert "params: method=ce, lr=0.1<br>" in hover
    assert "val_accuracy=90.00%, val_ece=5.00%, val_nll=0.35" in hover
    assert "test: test_accuracy=89.00%, test_ece=6.00%" in hover
    assert by_name["ce"]["marker"]["line"]["width"] == [0]  # not on the front: no outline
    assert by_name["mbls"]["marker"]["line"]["width"] == [2]
    assert layout["xaxis"]["title"]["text"] == "val ECE"
    assert layout["yaxis"]["title"]["text"] == "val accuracy"
    assert layout["xaxis"]["tickformat"] == ".1%"


def test_dropdown_lists_the_metric_pairs_with_their_fronts(page):
    data, layout = _figure(page.read_text(encoding="utf-8"))
    buttons = layout["updatemenus"][0]["buttons"]
    labels = [b["label"] for b in buttons]
    # val_overconfidence is not a calibration error; val_ece_sem is a spread, not a metric
    assert labels == ["val accuracy vs val ECE", "val accuracy vs val NLL",
                      "test accuracy vs test ECE"]
    names = [trace["name"] for trace in data]
    restyle, relayout = buttons[2]["args"]
    front = restyle["x"][names.index("Pareto front")], restyle["y"][names.index("Pareto front")]
    assert front == ([0.03, 0.05, 0.07], [0.88, 0.90, 0.92])
    assert restyle["x"][names.index("selected")] == [0.05]  # the validation pick, on test
    assert relayout["xaxis.title.text"] == "test ECE"
    nll = buttons[1]["args"]
    # NLL (nats) is not a fraction: plain ticks; its front: t2 (0.93, 0.28) dominates all
    assert nll[1]["xaxis.tickformat"] == ".3~g"
    assert nll[1]["xaxis.title.text"] == "val NLL (nats)"
    assert nll[0]["x"][names.index("Pareto front")] == [0.28]


def test_page_loads_nothing_from_the_network(page):
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc\s*=", text)
    assert "<link" not in text
    assert "@import" not in text
    # plotly.js, inlined, holds URL strings of map styles and the like that a scatter plot
    # never fetches; outside it nothing names a URL (no CDN, no MathJax)
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", text, flags=re.S)
    library = max(scripts, key=len)
    assert "plotly.js v" in library[:200]
    outside = text.replace(library, "")
    assert not re.search(r"https?://", outside), re.findall(r"https?://\S{0,40}", outside)
    assert "mathjax" not in outside.lower().replace("mathjaxconfig: 'local'", "")


def test_metric_pairs_follow_the_selection_and_post_hoc_columns():
    frame = pd.DataFrame({"val_miou": [0.5], "val_ece": [0.1], "val_ece_ts": [0.05],
                          "val_miou_ts": [0.5], "test_miou": [0.4], "test_ks": [0.02],
                          "test_brier": [float("nan")], "val_ece_mean": [0.1]})
    assert metric_pairs(frame, "val_miou", "val_ece_ts") == [
        ("val_miou", "val_ece_ts"), ("val_miou", "val_ece"), ("test_miou", "test_ks")]


def test_repeated_sweep_draws_sem_error_bars(tmp_path):
    frame = _frame().assign(val_accuracy_sem=[0.01, 0.02, 0.0, 0.005],
                            val_ece_sem=[0.003, float("nan"), 0.001, 0.002])
    data, _ = _figure(pareto_html(frame, tmp_path / "p.html").read_text(encoding="utf-8"))
    mbls = next(trace for trace in data if trace["name"] == "mbls")
    assert mbls["error_y"] == {"array": [0.02], "type": "data", "visible": True}
    assert mbls["error_x"]["array"] == [None]  # NaN: no bar


def test_bad_tables_are_refused(tmp_path):
    with pytest.raises(ValueError, match="has no rows"):
        pareto_html(_frame().iloc[0:0], tmp_path / "p.html")
    with pytest.raises(ValueError, match="no column 'selected'"):
        pareto_html(_frame().drop(columns="selected"), tmp_path / "p.html")
    with pytest.raises(ValueError, match="no column 'val_ece_ts'"):
        pareto_html(_frame(), tmp_path / "p.html", ece_key="val_ece_ts")


def test_no_text_of_the_table_ends_the_pages_script(tmp_path):
    # a method or param value with "</script>" is written as JSON escapes (as Plotly writes
    # them): the page keeps exactly its own two closing tags and the figure reads back whole
    frame = _frame()
    frame["method"] = ["ce", "a</script><b>x", "acls", "ls"]
    frame["note"] = ["</script>", "ok", "<i>", "&"]
    text = pareto_html(frame, tmp_path / "p.html").read_text(encoding="utf-8")
    assert text.count("</script>") == 2
    data, layout = _figure(text)
    assert [t["name"] for t in data][:4] == ["ce", "a</script><b>x", "acls", "ls"]
    assert "note=&lt;/script&gt;" in data[0]["text"][0]
    assert layout["updatemenus"][0]["buttons"][0]["label"] == "val accuracy vs val ECE"



def test_rows_are_read_by_position_whatever_the_index(tmp_path):
    # the table finalize_sweep draws keeps the trials table's index (failed rows left out):
    # the page of a table indexed 7, 3, 12, 5 is the page of the same rows indexed 0..3
    frame = _frame()
    shuffled = frame.set_axis([7, 3, 12, 5])
    plain = pareto_html(frame, tmp_path / "plain.html", title="t").read_text(encoding="utf-8")
    moved = pareto_html(shuffled, tmp_path / "moved.html", title="t").read_text(
        encoding="utf-8")
    assert moved == plain
    data, _ = _figure(moved)
    mbls = next(trace for trace in data if trace["name"] == "mbls")
    assert mbls["marker"]["line"]["width"] == [2]  # row 1 (index 3) is on the front
    assert mbls["text"][0].startswith("<b>demo-001-mbls</b> (selected, on the Pareto front)")


def test_every_dropdown_entry_and_hover_text_of_a_long_table(tmp_path):
    # 2,500 trials: hover texts and pairs are made as the page is written (a thousand rows at
    # a time); every trial is hovered once, in its method's trace, in row order
    n = 2500
    frame = pd.concat([_frame()] * (n // 4 + 1), ignore_index=True).iloc[:n]
    frame = frame.assign(trial=[f"t{i:04d}" for i in range(n)],
                         val_ece=[0.01 + i / 1e5 for i in range(n)])
    data, layout = _figure(pareto_html(frame, tmp_path / "p.html").read_text(
        encoding="utf-8"))
    ce = next(trace for trace in data if trace["name"] == "ce")
    assert [t[3:8] for t in ce["text"]] == [f"t{i:04d}" for i in range(0, n, 4)]
    assert ce["x"] == [round(0.01 + i / 1e5, 6) for i in range(0, n, 4)]
    buttons = layout["updatemenus"][0]["buttons"]
    assert [b["label"] for b in buttons] == ["val accuracy vs val ECE",
                                             "val accuracy vs val NLL",
                                             "test accuracy vs test ECE"]
    assert all(len(b["args"][0]["x"]) == len(data) for b in buttons)

# ---------------------------------------------------------------------------------------------
# the page in a real headless Chromium

from test_ui import _Browser, _chromium  # noqa: E402

#: Recorded before any script of the page runs: uncaught errors and console.error calls.
_RECORD_ERRORS = """
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e)));
window.addEventListener('unhandledrejection', e => window.__errors.push(String(e.reason)));
const __error = console.error;
console.error = (...a) => { window.__errors.push(a.map(String).join(' ')); __error(...a); };
"""


@pytest.mark.skipif(_chromium() is None, reason="no Chromium on PATH (chromium, "
                    "chromium-browser): the pareto.html browser test needs one (.ci/run "
                    "installs it with apt-get when it can)")
def test_page_draws_in_chromium_without_errors(page, tmp_path):
    browser = _Browser(_chromium(), tmp_path / "chromium-profile")
    try:
        try:
            browser.open_page()
        except (RuntimeError, TimeoutError) as exc:
            pytest.skip(f"{_chromium()} did not start headless: {exc}")
        browser.call("Page.enable")
        browser.call("Page.addScriptToEvaluateOnNewDocument", {"source": _RECORD_ERRORS})
        browser.goto(page.as_uri())
        browser.wait_for("document.querySelector('#pareto svg.main-svg .scatterlayer')"
                         " !== null && document.querySelectorAll('.scatterlayer .point')"
                         ".length >= 5", "the Pareto plot", timeout=30)
        # 4 trials + 1 star (the front is a line); the legend names every method
        assert browser.js("document.querySelectorAll('.scatterlayer .point').length") == 5
        legend = browser.js("document.querySelector('.legend').textContent")
        for name in ("ce", "mbls", "acls", "ls", "Pareto front", "selected"):
            assert name in legend
        # hover the star: its label names the selected trial's run
        browser.js("Plotly.Fx.hover('pareto', [{curveNumber: 5, pointNumber: 0}])")
        hover = browser.wait_for("document.querySelector('.hoverlayer').textContent",
                                 "the hover label", timeout=10)
        assert "demo-001-mbls" in hover
        assert "lr=0.05" in hover
        # the dropdown, with a real mouse: open it, pick the test pair
        browser.click(".updatemenu-header")
        browser.wait_for("document.querySelectorAll('.updatemenu-dropdown-button').length === 3",
                         "the dropdown's buttons", timeout=10)
        browser.click(".updatemenu-dropdown-button:nth-of-type(3)")
        browser.wait_for("document.getElementById('pareto').layout.xaxis.title.text"
                         " === 'test ECE'", "the test pair", timeout=10)
        assert browser.js("document.getElementById('pareto').data[4].x") == [0.03, 0.05, 0.07]
        assert browser.js("document.querySelector('.xtitle').textContent") == "test ECE"
        assert browser.js("window.__errors") == []
        fetched = browser.js("performance.getEntriesByType('resource').map(e => e.name)")
        assert not [u for u in fetched if not u.startswith("file:")], fetched
    finally:
        browser.close()
