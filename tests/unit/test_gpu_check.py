"""bench/gpu_check.py reads the monitor's own output: its readers must match the contract.

The GPU checks run only on a lent GPU machine, where a reader that looks for the
wrong key costs a whole lease: the pin check and the verdicts' live view read
"no hint" on two H100 runs because they looked for ``pid`` in hints that name
their job as ``job_pid``.
"""

from __future__ import annotations

import importlib.util
import os

from dlwatch.diagnose.facts import hint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(ROOT, "bench", "gpu_check.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_job_hints_finds_the_hints_the_rules_make_about_a_job():
    gc = load_gpu_check()
    ours = hint("enable-pin-memory", "info", 4242, 0, "m", "s", {})
    job_level = hint("main-loop-cpu-bound", "warn", 4242, None, "m", "s", {})
    other = hint("enable-pin-memory", "warn", 77, 0, "m", "s", {})
    box = hint("other-processes-busy", "info", None, None, "m", "s", {})
    snapshot = {"hints": [ours, other, job_level, box]}
    assert [h["id"] for h in gc.job_hints(snapshot, 4242)] == ["enable-pin-memory", "main-loop-cpu-bound"]
    assert gc.job_hints({"hints": None}, 4242) == []
