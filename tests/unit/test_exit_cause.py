"""What ended the training process: its main thread's uncaught exception."""

from __future__ import annotations

import subprocess
import sys

from dlwatch.probe import exit_cause


def test_the_first_line_of_the_message_and_a_bounded_length(monkeypatch):
    monkeypatch.setattr(exit_cause, "_text", None)
    exit_cause.record(
        RuntimeError, RuntimeError("CUDA error: out of memory\nCompile with TORCH_USE_CUDA_DSA")
    )
    assert exit_cause.last() == "RuntimeError: CUDA error: out of memory"
    exit_cause.record(ValueError, ValueError("x" * 1000))
    text = exit_cause.last()
    assert text is not None and len(text) == exit_cause.MAX_CHARS and text.endswith("…")
    exit_cause.record(KeyboardInterrupt, KeyboardInterrupt())
    assert exit_cause.last() == "KeyboardInterrupt"
    exit_cause.forget()
    assert exit_cause.last() is None


def test_the_hook_records_then_hands_on_to_the_one_it_replaced():
    # In a process of its own: the hook is process-wide. The user's own hook,
    # installed first, still runs, and Python's traceback is still printed.
    code = (
        "import sys\n"
        "from dlwatch.probe import exit_cause\n"
        "def mine(t, v, tb):\n"
        "    print('user hook', exit_cause.last(), file=sys.stderr)\n"
        "    sys.__excepthook__(t, v, tb)\n"
        "sys.excepthook = mine\n"
        "exit_cause.install(); exit_cause.install()\n"
        "raise OSError('disk gone')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "user hook OSError: disk gone" in r.stderr and "Traceback" in r.stderr, r.stderr
    assert r.stderr.count("user hook") == 1, r.stderr
