"""Who this training process is: sent once, in the server's hello."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    try:
        return int(v) if v not in (None, "") else None
    except ValueError:
        return None


def _cmdline() -> str:
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            parts = f.read().split(b"\0")
        return " ".join(p.decode(errors="replace") for p in parts if p)
    except OSError:
        return " ".join([sys.executable, *sys.argv])


def _run_id() -> str | None:
    # torchrun sets TORCHELASTIC_RUN_ID; plain launchers at least share the
    # rendezvous address, which tells ranks of one run apart from another run.
    rid = os.environ.get("TORCHELASTIC_RUN_ID")
    if rid:
        return rid
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return f"{addr}:{port}"
    return None


def _master() -> str | None:
    # Where the ranks rendezvous: with torchrun's run id, what tells one run
    # from another (`--rdzv-id` defaults to "none" on every multi-node run).
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{addr}:{port}" if addr and port else None


def job_identity() -> dict:
    torch = sys.modules.get("torch")
    mp = sys.modules.get("multiprocessing")
    start_method = None
    if mp is not None:
        try:
            start_method = mp.get_start_method(allow_none=True) or mp.get_context().get_start_method()
        except Exception:
            start_method = None
    from dlwatch import __version__

    return {
        "pid": os.getpid(),
        "cmdline": _cmdline(),
        "rank": _env_int("RANK"),
        "local_rank": _env_int("LOCAL_RANK"),
        "world_size": _env_int("WORLD_SIZE"),
        "run_id": _run_id(),
        "master": _master(),
        # Which GPUs this process sees, in CUDA's order (indices or UUIDs):
        # local_rank alone names the wrong GPU when a scheduler sets it.
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        # The order those indices count in (CUDA's default: fastest first).
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "torch_version": str(getattr(torch, "__version__", "unknown")),
        "start_method": start_method or "unknown",
        "started": time.time(),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "dlwatch_version": __version__,
    }
