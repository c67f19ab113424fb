"""autograd_threads: torch's autograd device threads found by their OS name
and their CPU read from /proc, with real threads named as torch names them
(CPU torch starts none)."""

from __future__ import annotations

import ctypes
import hashlib
import threading
import time

import pytest

from dlwatch import autograd_threads

PR_SET_NAME = 15


def _named_spinner(name: bytes, stop: threading.Event, ready: threading.Event, tids: list) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, name, 0, 0, 0)
    tids.append(threading.get_native_id())
    ready.set()
    data = b"x" * (1 << 20)
    while not stop.is_set():
        hashlib.sha256(data).digest()  # on the CPU without the GIL (hashlib drops it for big inputs)


@pytest.fixture
def spinner():
    stop, ready, tids = threading.Event(), threading.Event(), []
    t = threading.Thread(target=_named_spinner, args=(b"pt_autograd_0", stop, ready, tids), daemon=True)
    t.start()
    assert ready.wait(5)
    yield tids[0]
    stop.set()
    t.join(5)


def test_a_thread_named_as_torch_names_autograds_is_found_and_its_cpu_read(spinner):
    assert spinner in autograd_threads.find()
    before = autograd_threads.cpu_ns((spinner,))
    time.sleep(0.3)
    after = autograd_threads.cpu_ns((spinner,))
    # A spinning thread: most of the 0.3 s on a core (a loaded box gives it less)
    assert autograd_threads.spent(before, after) > 0.03e9
    assert set(before) == {spinner}


def test_the_training_thread_and_other_threads_are_not_autograds():
    found = autograd_threads.find()
    assert threading.get_native_id() not in found
    assert all(open(f"/proc/self/task/{t}/comm").read().startswith("pt_autograd_") for t in found)


def test_unreadable_or_ended_threads_are_left_out(tmp_path):
    assert autograd_threads.find(str(tmp_path / "missing")) == ()
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "comm").write_text("pt_autograd_0\n")
    (tmp_path / "12" / "schedstat").write_text("not numbers\n")
    (tmp_path / "x").mkdir()  # not a thread id
    (tmp_path / "x" / "comm").write_text("pt_autograd_1\n")
    assert autograd_threads.find(str(tmp_path)) == (12,)
    assert autograd_threads.cpu_ns((12, 13), str(tmp_path)) == {}
    # a thread read only at one edge of a window counts for nothing
    assert autograd_threads.spent({12: 5}, {12: 9, 13: 100}) == 4
    assert autograd_threads.spent({12: 9}, {12: 5}) == 0


def test_an_in_process_burst_reads_autograds_threads_beside_the_training_thread(probe, spinner, tmp_path):
    # A real burst on a real loader, with a thread named as CUDA torch names
    # its backward thread busy throughout: the plain windows and the profiled
    # steps carry its share beside the training thread's.
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from dlwatch.probe import profiler

    dl = DataLoader(TensorDataset(torch.zeros(40000, 2)), batch_size=2)
    it = iter(dl)
    next(it)
    st = next(s for s in probe.snapshot() if s.loader_ref() is dl)
    burst, why = profiler.start(st, 3, 30.0, str(tmp_path), None, {"id": st.id})
    assert burst is not None, why
    assert spinner in burst.autograd
    end = time.monotonic() + 30
    while burst.state != profiler.DONE and time.monotonic() < end:
        next(it)
        time.sleep(0.002)
    profiler.release(burst)
    assert burst.state == profiler.DONE and burst.error is None, burst.error
    plain = burst.result["unprofiled"]
    assert plain["autograd_cpu_fraction"] is not None and plain["autograd_cpu_fraction"] > 0.05, plain
    assert burst.result["autograd_cpu_fraction"] is not None
