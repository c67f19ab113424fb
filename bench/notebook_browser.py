"""The notebook panel in a real browser: JupyterLab in headless Chromium.

Starts JupyterLab on loopback with a two-cell notebook (``%dlwatch``, then a
data-bound loop of 2 workers), runs the cells from the page as a user would
(shift+enter), and saves screenshots of the panel while the loop runs and
after it stopped. Needs ``pip install jupyterlab playwright`` and Debian's
chromium (/usr/bin/chromium); not part of the test suite.

    .venv/bin/python bench/notebook_browser.py --out docs/
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.jobs import notebook_job  # noqa: E402

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"JupyterLab did not answer at {url}")


def snap(page, path: Path) -> tuple[str, str]:
    """A screenshot of the page and the panel's text at that moment (the
    panel's element is replaced at every update, so the page is shot)."""
    page.screenshot(path=str(path))
    for _ in range(5):
        try:
            return str(path), page.locator(".dlwatch-panel").first.inner_text(timeout=2000)
        except Exception:
            time.sleep(0.2)
    return str(path), ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs", help="folder for the screenshots")
    ap.add_argument("--seconds", type=float, default=25.0, help="how long the loop trains")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="dlwnb"))
    private = Path(tempfile.mkdtemp(prefix="dlwrt"))
    nb = notebook_job.build(seconds=args.seconds, panel="%load_ext dlwatch\n%dlwatch")
    nb.cells = nb.cells[:2]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "train.ipynb")
    # JupyterLab's one-time question about its news feed would cover the panel.
    labconfig = private / "cfg" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    port = free_port()
    env = dict(os.environ, DLWATCH_DIR=str(private / "rt"), JUPYTER_CONFIG_DIR=str(private / "cfg"))
    lab = subprocess.Popen(
        [
            sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
            "--ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.password=",
            "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={root}",
            "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shots = []
    try:
        wait_http(f"http://127.0.0.1:{port}/lab", 90)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/lab/tree/train.ipynb")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
            # A run asked for while the kernel is still connecting can be
            # lost: ask again until the panel is there.
            for attempt in range(4):
                page.click(".jp-Notebook .jp-Cell >> nth=0")
                page.keyboard.press("Escape")
                page.keyboard.press("Shift+Enter")
                try:
                    page.wait_for_selector(".dlwatch-panel", timeout=20_000)
                    break
                except Exception:
                    if attempt == 3:
                        page.screenshot(path=str(out / "notebook-failed.png"))
                        raise
            page.click(".jp-Notebook .jp-Cell >> nth=1")
            page.keyboard.press("Escape")
            page.keyboard.press("Shift+Enter")
            for i, at in enumerate((args.seconds * 0.4, args.seconds * 0.8)):
                time.sleep(max(0.0, at - (args.seconds * 0.4 if i else 0)))
                shots.append(snap(page, out / f"notebook-live-{i + 1}.png"))
            # The panel freezes a few seconds after the loop's last batch.
            end = time.time() + args.seconds * 0.2 + 30
            while time.time() < end and "final figures" not in snap(page, out / "notebook-finished.png")[1]:
                time.sleep(1)
            shots.append(snap(page, out / "notebook-finished.png"))
            browser.close()
    finally:
        lab.terminate()
        try:
            lab.wait(10)
        except subprocess.TimeoutExpired:
            lab.kill()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
    for path, text in shots:
        print(json.dumps({"screenshot": path, "first_lines": text.splitlines()[:4]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
