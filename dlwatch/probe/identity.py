"""Who this training process is: sent once, in the server's hello."""

from __future__ import annotations

import os
import platform
import shlex
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
    """The job's command line, quoted for a shell: advice pastes it into a
    `dlwatch tune -- …` line (a QA run's `shard-{0000..0063}.tar` argument
    expanded into 64 when pasted, and `'two words'` split in two)."""
    # The interpreter's own copy (Python >= 3.10), empty arguments included:
    # /proc's, split on its NULs with every empty part dropped, lost
    # torchvision's `--output-dir ''`, and the suggested line failed
    # ("expected one argument").
    return shlex.join(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])


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


def _store_address(c10d) -> str | None:
    """host:port of the default process group's TCPStore (the rendezvous a
    launcher without MASTER_ADDR, or an init_method URL, still has)."""
    try:
        store = c10d._get_default_store()
        for _ in range(4):  # PrefixStore wraps the real store
            inner = getattr(store, "underlying_store", None)
            if inner is None:
                break
            store = inner
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        return f"{host}:{port}" if host and isinstance(port, int) else None
    except Exception:
        return None


def _loopback(addr: str | None) -> bool:
    host = (addr or "").rsplit(":", 1)[0]
    return host in ("localhost", "127.0.0.1", "::1", "[::1]", socket.gethostname())


def dist_identity() -> dict | None:
    """rank, world_size (and local_rank, run_id, master where the
    environment does not say) from torch.distributed once its default group
    is initialised, whatever started the process (torchrun sets RANK; a job
    under ``torch.multiprocessing.spawn`` that passes ``rank=`` to
    ``init_process_group`` sets nothing). None until then; never imports
    torch, never raises."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        rank, world = int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        return None
    out: dict = {"rank": rank, "world_size": world}
    master = _master() or _store_address(sys.modules.get("torch.distributed.distributed_c10d"))
    local = _env_int("LOCAL_RANK")
    if local is None and master is not None and _loopback(master):
        local = rank  # every rank rendezvouses on this host: one node, local rank = rank
    out["local_rank"] = local
    out["master"] = master
    out["run_id"] = _run_id() or master
    return out


def learn_ranks(job: dict) -> bool:
    """Fill ``job``'s rank fields from torch.distributed once it is
    initialised (see ``dist_identity``); True when something changed (the
    publisher then greets its monitors again with the new identity). Cheap
    enough for every frame: a dict lookup until the group exists, nothing
    once the rank is known."""
    if job.get("rank") is not None and job.get("world_size") is not None:
        return False
    got = dist_identity()
    if got is None:
        return False
    changed = False
    for k, v in got.items():
        if job.get(k) is None and v is not None:
            job[k] = v
            changed = True
    return changed


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

    ident = {
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
    learn_ranks(ident)
    return ident
