"""The notebook panel in a real Jupyter kernel (nbclient, headless): the saved
output holds the frozen panel with the loop's own data wait, the right hint,
and the frames it showed while the loop ran."""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

from dlwatch.notebook.session import DISABLED, PanelSession  # noqa: E402
from tests.jobs import notebook_job  # noqa: E402


def _outputs(cell) -> list[dict]:
    return list(cell.get("outputs", []))


def _stream(cell) -> str:
    return "".join(o.get("text", "") for o in _outputs(cell) if o.get("output_type") == "stream")


def _text(h: str) -> str:
    return re.sub(r"<[^>]+>", "", h)


@pytest.fixture
def runtime_env(short_tmpdir, monkeypatch):
    monkeypatch.setenv("DLWATCH_DIR", short_tmpdir)
    return short_tmpdir


@pytest.mark.timing  # the panel within 2 points of the loop's own wait: needs the box
def test_panel_in_a_kernel_shows_the_loops_wait_and_the_hint(runtime_env):
    nb = notebook_job.build(seconds=12.0, idle_s=4.5)
    nb.cells.insert(2, nbformat.v4.new_code_cell("%dlwatch tune"))
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3").execute()

    own = json.loads(_stream(nb.cells[1]).strip().splitlines()[-1])
    assert "needs a training script" in _stream(nb.cells[2])
    end = json.loads(_stream(nb.cells[-1]).strip().splitlines()[-1])
    assert end["error"] is None and end["state"] == "stopped"
    # it went live while the loop ran (about a frame a second) and froze after
    assert end["frames_by_state"].get("live", 0) >= 5, end
    assert end["frames_by_state"].get("finished", 0) >= 1, end

    panel = [o for o in _outputs(nb.cells[0]) if o.get("output_type") == "display_data"]
    assert len(panel) == 1, "one panel, updated in place"
    data = panel[0]["data"]
    assert "<script" not in data["text/html"]
    text = _text(data["text/html"])
    assert "stopped by %dlwatch stop" in text and "Final summary" in text
    summary = r"(\d+) batches, \d+ epoch\(s\), ([\d.]+) batches/s; the loop waited for data (\d+) %"
    m = re.search(summary, text)
    assert m, text
    batches, rate, shown = int(m.group(1)), float(m.group(2)), int(m.group(3)) / 100
    print(
        f"loop's own wait {own['own_wait']:.3f}, panel {shown:.2f}; batches {own['batches']} vs {batches}; "
        f"batches/s {own['batches_per_s']:.1f} vs {rate}"
    )
    # the panel rounds to a whole percent
    assert abs(shown - own["own_wait"]) <= 0.02 + 0.005
    assert abs(batches - own["batches"]) <= 2
    assert rate == pytest.approx(own["batches_per_s"], rel=0.03)
    # 2 workers each 40 ms a batch, a 12 ms step: loading waits on sleep, one more worker helps
    assert "io-bound" in text or "add-workers" in text, text
    assert "ipykernel_launcher" not in text
    assert data["text/plain"].startswith("dlwatch · kernel pid")


def test_a_cell_that_trains_then_idles_is_saved_with_the_trainings_figures(runtime_env):
    # Issue 42: a cell that trained (75 % wait) and then slept was saved
    # showing the idle window, "14 % of the loop (last 3.1 s)". 6 s of
    # training, 4 s idle in the same cell, no %dlwatch stop: the saved panel
    # is whatever the loop left, held or finished.
    nb = notebook_job.build(seconds=6.0, tail_idle_s=4.0, stop=False)
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    own = json.loads(next(line for line in _stream(nb.cells[1]).splitlines() if line.startswith("{")))
    panel = [o for o in _outputs(nb.cells[0]) if o.get("output_type") == "display_data"]
    assert len(panel) == 1
    text = _text(panel[0]["data"]["text/html"])
    assert re.search(r"loop idle since \d\d:\d\d:\d\d; figures from its last \d+ s of training", text), text
    m = re.search(r"data wait \S+ (\d+) % of the loop \(its last (\d+) s of training\)", text)
    assert m, text
    shown, seconds = int(m.group(1)) / 100, int(m.group(2))
    print(f"loop's own wait {own['own_wait']:.3f}, saved panel {shown:.2f} over {seconds} s")
    assert abs(shown - own["own_wait"]) <= 0.03 + 0.005, (shown, own)
    assert 5 <= seconds <= 8 and "(last " not in text  # no window of the idle time
    plain = panel[0]["data"]["text/plain"]
    assert "loop idle since" in plain and f"{round(shown * 100)} %" in plain, plain


def test_the_collector_ends_with_the_kernel(runtime_env):
    """The feed watches the kernel's pid: a kernel that dies leaves no collector behind."""
    # The kernel lives until the feed's first document is in: a kernel that
    # slept 2 s had ended before the feed's own start-up beside the parallel
    # tier (fresh-clone run 102: its first document read "ended").
    kernel = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    feed = subprocess.Popen(
        [sys.executable, "-m", "dlwatch.panel.feed", "--pid", str(kernel.pid), "--interval", "0.3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([feed.stdout], [], [], 60)
        assert ready, "the feed wrote nothing in 60 s"
        first = feed.stdout.readline()
        kernel.stdin.close()
        kernel.wait(timeout=20)
        rest, _ = feed.communicate(timeout=20)
    finally:
        feed.kill()
        kernel.kill()
    docs = [json.loads(line) for line in (first + rest).splitlines()]
    assert docs and docs[0]["state"] == "waiting"
    assert docs[-1]["state"] == "ended" and "has exited" in docs[-1]["html"]
    assert feed.returncode == 0


def test_a_bad_interval_is_a_usage_error():
    p = subprocess.run(
        [sys.executable, "-m", "dlwatch.panel.feed", "--pid", "1", "--interval", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "--interval must be > 0" in p.stderr and "Traceback" not in p.stderr


def test_disabled_hook_shows_why_and_starts_nothing(monkeypatch):
    monkeypatch.setenv("DLWATCH_DISABLE", "1")
    shown = []
    s = PanelSession(display=(shown.append, shown.append))
    s.start()
    assert s.proc is None and s.state == "disabled"
    assert shown and DISABLED in shown[-1]["text/plain"]


def test_a_collector_that_cannot_run_is_one_readable_line(runtime_env, monkeypatch):
    shown = []
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    s = PanelSession(display=(shown.append, shown.append))
    s.start()
    assert s.state == "error" and "could not start the collector" in shown[-1]["text/plain"]
    s.stop()


def test_a_collector_that_dies_is_reported(runtime_env, tmp_path, monkeypatch):
    # A Python that cannot import what it is asked to: the child fails at once.
    broken = tmp_path / "python"
    broken.write_text(f"#!/bin/sh\nexec {sys.executable} -I -c 'import dlwatch_missing' \"$@\"\n")
    broken.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(broken))
    shown = []
    s = PanelSession(display=(shown.append, shown.append))
    s.start()
    s.thread.join(30)
    assert s.state == "error", s.state
    assert "the panel's collector stopped (exit 1)" in shown[-1]["text/plain"]
    assert "ModuleNotFoundError" in shown[-1]["text/plain"]
