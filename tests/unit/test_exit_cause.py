"""What ended the training process: its main thread's uncaught exception."""

from __future__ import annotations

import subprocess
import sys

import pytest

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


def test_a_failing_sys_exit_is_named_and_a_success_forgets_it(monkeypatch):
    monkeypatch.setattr(exit_cause, "_exit_call", None)
    exit_cause.record_exit(3)
    assert exit_cause.exit_call() == "sys.exit(3)"
    exit_cause.record_exit("config not found: x.yaml")
    assert exit_cause.exit_call() == "sys.exit('config not found: x.yaml')"
    exit_cause.record_exit("y" * 1000)
    call = exit_cause.exit_call()
    assert call is not None and len(call) < 320 and call.endswith("…')")
    exit_cause.record_exit(0)
    assert exit_cause.exit_call() is None


def test_the_wrapped_sys_exit_raises_as_the_original_and_records_only_the_main_thread(monkeypatch):
    import sys
    import threading

    monkeypatch.setattr(exit_cause, "_installed", False)
    monkeypatch.setattr(exit_cause, "_exit_call", None)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(sys, "exit", sys.exit)
    exit_cause.install()
    assert sys.exit.__name__ == "exit"
    with pytest.raises(SystemExit) as e:
        sys.exit(4)
    assert e.value.code == 4 and exit_cause.exit_call() == "sys.exit(4)"
    with pytest.raises(SystemExit) as e:
        sys.exit()
    assert e.value.code is None and exit_cause.exit_call() is None

    def in_a_thread():
        try:
            sys.exit(5)
        except SystemExit:
            pass

    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join()
    assert exit_cause.exit_call() is None
