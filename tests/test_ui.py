"""`raysearch ui` and raysearch.tracking.ui: links into MLflow's model-training view.

The end-to-end test runs a real sweep, serves its store with `raysearch ui`, and opens the
printed link in a real headless Chromium (driven over the DevTools protocol on a pipe, so it
waits for what the single-page app renders instead of for a fixed time).
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from raysearch.cli.commands import main
from raysearch.tracking import ui

SWEEP = "ui-e2e"
N_TRIALS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def _assert_one_line_error(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    err = result.stderr.strip()
    assert err.startswith("error: "), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in err, (needle, err)


def _add_run(client, exp_id, name, start, tags=None):
    run = client.create_run(exp_id, run_name=name, start_time=start, tags=tags or {})
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite store with experiment 'raysearch': an old and a new sweep, a child, a plain run.

    Module-scoped: a fresh store costs seconds of migrations. Tests only read it (one adds an
    artifact to the old sweep).
    """
    tmp_path = tmp_path_factory.mktemp("ui_store")
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("raysearch", artifact_location=(tmp_path / "art").as_uri())
    client.create_experiment("empty", artifact_location=(tmp_path / "art2").as_uri())
    old = _add_run(client, exp, "old", 1_000, {"raysearch.sweep": "old"})
    new = _add_run(client, exp, "new", 2_000, {"raysearch.sweep": "new"})
    # children carry the sweep tag too, and start after their parent
    _add_run(client, exp, "new-000-ce", 3_000, {"raysearch.sweep": "new",
                                                 "mlflow.parentRunId": new})
    _add_run(client, exp, "trained", 4_000)  # `raysearch train`: no sweep
    return {"uri": uri, "client": client, "exp": exp, "old": old, "new": new}


# ---------------------------------------------------------------------------------------------
# links


def test_run_link_puts_the_view_query_inside_the_hash_route():
    # verified in Chromium against mlflow ui 3.17: before the '#' the query is ignored
    assert (ui.run_link("http://127.0.0.1:5000/", "1", "abc")
            == "http://127.0.0.1:5000/#/experiments/1/runs/abc?workflowType=machine_learning")


def test_run_link_to_an_artifact_preview():
    assert (ui.run_link("http://h:1", "3", "abc", artifact="pareto.png")
            == "http://h:1/#/experiments/3/runs/abc/artifacts/pareto.png"
               "?workflowType=machine_learning")


def test_experiment_link_opens_the_runs_table():
    assert (ui.experiment_link("https://mlflow.example.org/", "7")
            == "https://mlflow.example.org/#/experiments/7/runs?workflowType=machine_learning")


def test_links_refuse_bad_input():
    with pytest.raises(ValueError, match="base_url"):
        ui.run_link("127.0.0.1:5000", "1", "abc")
    with pytest.raises(ValueError, match="run_id"):
        ui.run_link("http://h:1", "1", "")
    with pytest.raises(ValueError, match="experiment_id"):
        ui.experiment_link("http://h:1", "1/runs")


def test_ui_base_url():
    assert ui.ui_base_url("http://10.0.0.5:5000/") == "http://10.0.0.5:5000"
    assert ui.ui_base_url("https://mlflow.example.org") == "https://mlflow.example.org"
    assert ui.ui_base_url("sqlite:////data/mlruns.db") == "http://127.0.0.1:5000"
    assert ui.ui_base_url("sqlite:////data/mlruns.db", "localhost", 5001) == "http://localhost:5001"
    assert ui.ui_base_url("postgresql://u@db/mlflow", "0.0.0.0", 8080) == "http://127.0.0.1:8080"
    assert ui.ui_base_url("sqlite:////data/mlruns.db", "::", 5000) == "http://[::1]:5000"


def test_ui_module_imports_no_ray():
    code = ("import sys, raysearch.tracking.ui\n"
            "print('ray' in sys.modules, 'raysearch.cli.commands' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False False"


def test_tracking_reexports_the_ray_free_names():
    from raysearch import tracking
    from raysearch.tracking import runs

    assert tracking.SWEEP_TAG is runs.SWEEP_TAG
    assert tracking.find_sweep is runs.find_sweep
    code = "import sys, raysearch.tracking.runs\nprint('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


# ---------------------------------------------------------------------------------------------
# store look-ups


def test_latest_sweep_is_the_newest_parent_run(store):
    run = ui.latest_sweep(store["client"], "raysearch")
    assert run.info.run_id == store["new"]
    assert ui.latest_sweep(store["client"], "empty") is None
    with pytest.raises(ValueError, match=r"'nope'.*known: Default, empty, raysearch"):
        ui.latest_sweep(store["client"], "nope")


def test_has_artifact(store, tmp_path):
    client = store["client"]
    (tmp_path / "pareto.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    client.log_artifact(store["old"], str(tmp_path / "pareto.png"))
    assert ui.has_artifact(client, store["old"], "pareto.png")
    assert not ui.has_artifact(client, store["new"], "pareto.png")
    assert not ui.has_artifact(client, "0" * 32, "pareto.png")  # unknown run: False, no raise


def test_require_store(tmp_path):
    ui.require_store("http://127.0.0.1:1")  # servers are not checked here
    with pytest.raises(ValueError, match="no MLflow store at"):
        ui.require_store(f"sqlite:///{tmp_path / 'none.db'}")
    with pytest.raises(ValueError, match="no MLflow store folder"):
        ui.require_store((tmp_path / "none").as_uri())
    assert not (tmp_path / "none.db").exists()


def test_start_refuses_a_port_in_use(store):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 is in use"):
            ui.start_mlflow_ui(store["uri"], port=port)


def test_start_reports_a_server_that_dies():
    # mlflow ui exits at once on a store URI it does not support
    proc = None
    try:
        with pytest.raises(RuntimeError, match=r"mlflow ui exited \(code \d+\) before it "
                                               r"answered.*nosuchscheme"):
            proc = ui.start_mlflow_ui("nosuchscheme://x/y", port=_free_port(), timeout=60)
    finally:
        if proc is not None:
            ui.stop_mlflow_ui(proc)


def test_stop_kills_a_server_that_ignores_sigterm():
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # as start_mlflow_ui starts the server
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert ui.stop_mlflow_ui(proc, timeout=1) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


# ---------------------------------------------------------------------------------------------
# CLI errors: one line, exit 2, nothing started


def test_cli_missing_store(tmp_path):
    db = tmp_path / "none.db"
    _assert_one_line_error(_cli("ui", "--tracking-uri", f"sqlite:///{db}"), 2,
                           "no MLflow store at", str(db))
    assert not db.exists()


def test_cli_unknown_experiment(store):
    _assert_one_line_error(_cli("ui", "--tracking-uri", store["uri"], "--experiment", "nope"), 2,
                           "no experiment named 'nope'")


def test_cli_unknown_sweep(store):
    _assert_one_line_error(_cli("ui", "--tracking-uri", store["uri"], "--sweep", "ghost"), 2,
                           "no sweep named 'ghost'", "new", "old")


def test_cli_port_in_use(store):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _cli("ui", "--tracking-uri", store["uri"], "--port", str(port))
    _assert_one_line_error(result, 2, f"port {port}", "in use")
    assert "starting" not in result.stdout


@pytest.mark.integration
def test_cli_server_uri_prints_the_link_and_starts_nothing(mlflow_server):
    client = MlflowClient(mlflow_server)
    name = f"ui-http-{time.time_ns()}"
    exp = client.create_experiment(name)
    parent = _add_run(client, exp, "s1", 1_000, {"raysearch.sweep": "s1"})
    result = _cli("ui", "--tracking-uri", mlflow_server, "--experiment", name)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"MLflow UI: {mlflow_server}",
        f"latest sweep s1: {ui.run_link(mlflow_server, exp, parent)}",
    ]
    old = _add_run(client, exp, "s0", 500, {"raysearch.sweep": "s0"})
    result = _cli("ui", "--tracking-uri", mlflow_server, "--experiment", name, "--sweep", "s0")
    assert result.exit_code == 0, result.output
    assert f"sweep s0: {ui.run_link(mlflow_server, exp, old)}" in result.stdout.splitlines()
    empty = f"{name}-empty"
    exp2 = client.create_experiment(empty)
    result = _cli("ui", "--tracking-uri", mlflow_server, "--experiment", empty)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1] == f"experiment {empty}: {ui.experiment_link(mlflow_server, exp2)}"
    assert lines[2].startswith("note: ")
    assert "no sweep" in lines[2]


# ---------------------------------------------------------------------------------------------
# end to end: real sweep -> `raysearch ui` -> headless Chromium


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _terminate(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM a process this test started, SIGKILL it after `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4)."""

    def __init__(self, exe: str, profile: Path) -> None:
        to_r, self._w = os.pipe()
        self._r, from_w = os.pipe()
        # high fds for the child, which bash moves to 3 (commands) and 4 (replies)
        child_r = fcntl.fcntl(to_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(from_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_r)
        os.close(from_w)
        self.log = profile.parent / "chromium.log"
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-proxy-server", "--window-size=1400,1000",
                "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                ["bash", "-c", f'exec "$0" "$@" 3<&{child_r} 4>&{child_w}', exe, *args],
                pass_fds=(child_r, child_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=log)
        os.close(child_r)
        os.close(child_w)
        self._buf = b""
        self._id = 0
        self.session = None

    def call(self, method: str, params: dict | None = None, timeout: float = 60.0) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Chromium did not answer {method} within {timeout:.0f} s")
            if select.select([self._r], [], [], left)[0]:
                chunk = os.read(self._r, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"Chromium closed its pipe: {self.log.read_text()[-800:]}")
                self._buf += chunk

    def open_page(self) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True})
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, what: str, timeout: float = 90.0):
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = (self.js("document.body ? document.body.innerText : ''") or "")[:1500]
                raise AssertionError(f"{what} not shown within {timeout:.0f} s; page text: "
                                     f"{' | '.join(text.split(chr(10)))}")
            time.sleep(0.25)

    def click(self, selector: str) -> None:
        box = self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                      " if (!e) return null; e.scrollIntoView({block: 'center'});"
                      " const r = e.getBoundingClientRect();"
                      " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        assert box, f"nothing to click at {selector}"
        # a real mouse click: the runs table ignores element.click()
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1],
                                                   "button": "left", "clickCount": 1})

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("Browser.close", timeout=10)
            except (RuntimeError, TimeoutError, OSError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _terminate(self.proc, timeout=10)
        os.close(self._w)
        os.close(self._r)


# a mark, not a skip in the fixture: it is evaluated before the module's sweep fixture runs
needs_chromium = pytest.mark.skipif(
    _chromium() is None, reason="no Chromium on PATH (chromium, chromium-browser): the MLflow UI "
    "browser test needs one (.ci/run installs it with apt-get when it can)")


@pytest.fixture
def browser(tmp_path):
    exe = _chromium()
    b = _Browser(exe, tmp_path / "chromium-profile")
    try:
        b.open_page()
    except (RuntimeError, TimeoutError) as exc:
        b.close()
        pytest.skip(f"{exe} did not start headless: {exc}")
    yield b
    b.close()


class _UiProcess:
    """`raysearch ui` as a subprocess; its stdout lines are collected by a thread."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "raysearch.cli", "ui", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"`raysearch ui` printed no '{prefix}' line: {self.out}, "
                                     f"stderr: {self.proc.stderr.read()[-1500:]}")
            if line:
                self.out.append(line)
                if line.startswith(prefix):
                    return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            _terminate(self.proc, timeout=30)


@pytest.fixture(scope="module")
def real_sweep(ray_session, tmp_path_factory):
    """A tiny real sweep (2 CE trials, 2 epochs on digits) in a fresh SQLite store."""
    root = tmp_path_factory.mktemp("ui_sweep")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    result = CliRunner().invoke(main, [
        "sweep", "ce", "--num-samples", str(N_TRIALS), "--epochs", "2", "--name", SWEEP,
        "--tracking-uri", uri, "--storage-path", str(root / "ray"), "--seed", "0"],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == N_TRIALS
    return {"uri": uri, "exp": exp.experiment_id, "parent": parent, "children": children,
            "output": result.output}


def _nav_links(browser: _Browser) -> list[str]:
    return browser.js("Array.from(document.querySelectorAll('nav a'))"
                      ".map(a => a.getAttribute('href'))") or []


@pytest.mark.integration
@needs_chromium
def test_ui_link_opens_the_sweep_in_the_model_training_view(real_sweep, browser):
    parent = real_sweep["parent"]
    run_id, exp = parent.info.run_id, real_sweep["exp"]
    port = _free_port()
    served = _UiProcess("--port", str(port), "--tracking-uri", real_sweep["uri"])
    try:
        line = served.wait_line("latest sweep ", timeout=120)
        link = re.fullmatch(rf"latest sweep {SWEEP}: (\S+)", line).group(1)
        base = f"http://127.0.0.1:{port}"
        assert link == f"{base}/#/experiments/{exp}/runs/{run_id}?workflowType=machine_learning"
        assert f"MLflow UI: {base}" in served.out
        # the sweep itself ended with the link (on the default port, with how to serve it)
        assert (f"open it in MLflow (serve it with `raysearch ui --tracking-uri "
                f"{real_sweep['uri']}`): "
                f"{ui.run_link('http://127.0.0.1:5000', exp, run_id)}") in real_sweep["output"]
        plot_line = served.wait_line("Pareto plot: ", timeout=10)
        assert plot_line == f"Pareto plot: {ui.run_link(base, exp, run_id, artifact='pareto.png')}"

        # the run page: the parent run, in the model-training view (not the GenAI overview)
        browser.goto(link)
        browser.wait_for(f"document.body.innerText.includes({json.dumps(SWEEP)})"
                         " && document.body.innerText.includes('best_val_ece')"
                         " && document.querySelectorAll('nav a').length > 0",
                         "the parent run's page with its metrics")
        nav = _nav_links(browser)
        assert f"#/experiments/{exp}/runs?workflowType=machine_learning" in nav, nav
        assert not [h for h in nav if "overview/usage" in h or "chat-sessions" in h], nav
        text = browser.js("document.body.innerText")
        for genai in ("Token usage", "Token Usage", "Observability", "Evaluations"):
            assert genai not in text, genai
        for tab in ("Overview", "Model metrics", "Artifacts"):
            assert tab in text, tab

        # its Pareto plot: listed among the artifacts and rendered as an image
        browser.goto(plot_line.split(": ", 1)[1])
        browser.wait_for("(() => { const i = document.querySelector('img[alt=\"pareto.png\"]');"
                         " return !!i && i.complete && i.naturalWidth > 0; })()",
                         "the rendered pareto.png")
        text = browser.js("document.body.innerText")
        for name in ("best_config.yaml", "trials.parquet"):
            assert name in text, name
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{base}/get-artifact?path=pareto.png&run_uuid={run_id}",
                         timeout=30) as resp:
            assert resp.read(8) == b"\x89PNG\r\n\x1a\n"

        # the experiment's runs table: the parent row; its + button shows the trials
        browser.goto(ui.experiment_link(base, exp))
        row = f'[row-id="{run_id}"] [col-id="attributes.`Run Name`"] button'
        browser.wait_for(f"!!document.querySelector({json.dumps(row)})", "the sweep's row")
        assert f"{N_TRIALS + 1} matching runs" in browser.js("document.body.innerText")
        browser.click(row)
        ids = json.dumps([c.info.run_id for c in real_sweep["children"]])
        browser.wait_for(f"{ids}.every(id => document.querySelector(`[row-id=\"${{id}}\"]`))",
                         "the trials' rows")
        text = browser.js("document.body.innerText")
        for child in real_sweep["children"]:
            assert child.info.run_name in text
        # the Dataset column: the sweep's and each trial's MLflow dataset input, with its digest
        cells = browser.js("Array.from(document.querySelectorAll("
                           "'[col-id=\"attributes.`Dataset`\"]')).map(e => e.innerText)")
        digest = real_sweep["children"][0].inputs.dataset_inputs[0].dataset.digest
        assert sum(f"digits ({digest})" in c for c in cells) == N_TRIALS + 1, cells

        # Ctrl-C stops the server it started, and exits 0
        served.proc.send_signal(signal.SIGINT)
        assert served.proc.wait(timeout=60) == 0, served.proc.stderr.read()
        assert served.wait_line("MLflow UI stopped", timeout=10)
        with socket.socket() as probe:  # the port is free again: no server left behind
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))
    finally:
        served.stop()
