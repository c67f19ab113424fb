"""SVG snapshot tests of the TUI at the design's floor (80×24) and a roomy
terminal (120×40). Everything on screen is fixed: data from tui_fixtures, a
fixed clock and time format, a fixed version string.

Regenerate after an intended change with
    .venv/bin/python -m pytest tests/unit/test_tui_snapshots.py --snapshot-update
and look at the SVGs under tests/unit/__snapshots__/ before committing them.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from tests import tui_fixtures as F
from tests.tui_fixtures import make_app

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")]


async def settle(pilot) -> None:
    # Loader panels and GPU rows mount one refresh after the first snapshot.
    for _ in range(4):
        await pilot.pause()


@pytest.mark.parametrize("size", SIZES)
def test_no_gpu(snap_compare, size):
    assert snap_compare(make_app([F.data_bound()]), terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", SIZES)
def test_fake_gpu(snap_compare, size):
    assert snap_compare(make_app([F.data_bound(with_gpu=True)]), terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", SIZES)
def test_several_jobs(snap_compare, size):
    assert snap_compare(make_app([F.several_jobs()]), terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", SIZES)
def test_exited_job_selected(snap_compare, size):
    async def select_exited(pilot):
        await settle(pilot)
        await pilot.press("j", "j")
        await settle(pilot)

    app = make_app([F.with_exited(F.several_jobs(), 4242)])
    assert snap_compare(app, terminal_size=size, run_before=select_exited)


@pytest.mark.parametrize("size", SIZES)
def test_a_long_hint_keeps_its_next_step_in_sight(snap_compare, size):
    """Issue 43: at 80×24 the hint's "→" was cut off."""
    snap = F.data_bound()
    snap["hints"][0]["message"] = (
        "The 2 usable cores are fully used over the last 15 s: the trainer 1.2 cores of CPU (all "
        "threads), 2 busy DataLoader workers 0.8 and other processes 0.1; besides, their threads "
        "waited 0.4 cores' worth for a CPU (20 % of the cores). Loader 0 of PID 4242 with "
        "num_workers=1: ≈ 1.12× faster (predicted); the step would take 80 ms."
    )
    assert snap_compare(make_app([snap]), terminal_size=size, run_before=settle)


def test_no_jobs(snap_compare):
    assert snap_compare(make_app([F.empty()]), terminal_size=(80, 24), run_before=settle)


def test_help_screen(snap_compare):
    async def open_help(pilot):
        await settle(pilot)
        await pilot.press("question_mark")
        await settle(pilot)

    assert snap_compare(make_app([F.data_bound()]), terminal_size=(80, 24), run_before=open_help)


def test_every_snapshot_file_belongs_to_a_test():
    """syrupy fails a run that leaves a snapshot file unused, but not under
    pytest-xdist (its workers do not pool what they used): checked here."""
    expected = set()
    for name, fn in list(globals().items()):
        if name.startswith("test_") and "snap_compare" in inspect.signature(fn).parameters:
            (ids,) = [[p.id for p in m.args[1]] for m in getattr(fn, "pytestmark", [])] or [[None]]
            expected |= {f"{name}[{i}].svg" if i else f"{name}.svg" for i in ids}
    folder = Path(__file__).parent / "__snapshots__" / Path(__file__).stem
    assert {p.name for p in folder.glob("*.svg")} == expected
