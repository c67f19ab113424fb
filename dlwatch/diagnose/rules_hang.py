"""loader-stalled: a loader being iterated has delivered no batch for a long time.

The probe declares the stall (``probe/stall.py``: no batch for
max(10 s, 10 x the recent batch period), longer at an epoch's start) and
gathers the stacks of the trainer's threads and of every worker at that
moment (``job["stacks"]``, summarised by ``hang.summarize``). This rule
reads the two together and names the cause where the evidence shows it:

- a worker blocked in I/O (a read that never returns: a FIFO, a dead NFS
  mount, a remote store) or on a lock;
- a lock taken by a thread started before fork: a forked worker blocked on
  a lock with no thread of its own that could hold it, while the trainer
  runs threads of the user's (under fork the child inherits the lock held
  and not the thread that would release it);
- ``/dev/shm`` full (workers hand batches over in shared memory);
- a worker that died;
- every worker idle while the loop waits elsewhere, in a collective: in a
  torchrun run, a rank whose loader has ended its epoch ran out of data
  first (a sampler or an iterable that splits unevenly across ranks);
- the loop stuck outside the loader (its main thread's frame is named).
"""

from __future__ import annotations

from typing import Any

from . import hang
from .facts import Context, LoaderView, as_int, hint, num
from .registry import Rule

# /dev/shm with less than this free cannot take a batch of any size that
# matters (a 224 px RGB uint8 batch of 32 is 4.8 MB).
SHM_FULL_BYTES = 4 << 20
# Stacks older than the stall's start (plus the job's gathering time) are
# an earlier episode's.
STACKS_SLACK_S = 5.0
# Threads of the trainer that are the machinery's, not the user's.
_MACHINERY = ("QueueFeederThread", "pt_data_pin", "pt_autograd", "dlwatch-")


def _fresh_stacks(ctx: Context, job: dict[str, Any], stalled_s: float) -> dict[str, Any] | None:
    st = job.get("stacks")
    if not isinstance(st, dict) or not isinstance(st.get("summary"), list):
        return None
    t, now = num(st.get("t")), ctx.time
    if t is None or now is None or t < now - stalled_s - STACKS_SLACK_S:
        return None
    return st


Entry = dict[str, Any]


def _mine(entries: list[Entry], lid: int) -> tuple[Entry | None, list[Entry], list[Entry]]:
    """(the trainer's main thread, this loader's workers, the trainer's
    other threads), from the stacks summary."""
    main = None
    workers, others = [], []
    for e in entries:
        if not isinstance(e, dict):
            continue
        if e.get("role") == "worker":
            if as_int(e.get("loader_id")) == lid:
                workers.append(e)
        elif e.get("thread") == "MainThread" and main is None:
            main = e
        else:
            others.append(e)
    return main, workers, others


def _user_threads(others: list[dict[str, Any]]) -> list[str]:
    return [
        str(e.get("thread"))
        for e in others
        if e.get("thread")
        and not str(e.get("thread")).startswith(_MACHINERY)
        and not hang.is_pin_thread(e)
        and _has_user_frame(e)
    ]


def _has_user_frame(e: dict[str, Any]) -> bool:
    at = e.get("at") or {}
    return "user" in at or hang._where(str(at.get("file") or "")) == "user"


def _where_text(e: dict[str, Any] | None) -> str | None:
    at = (e or {}).get("at")
    if not isinstance(at, dict):
        return None
    text = str(at.get("text") or "")
    user = at.get("user")
    return f"{text} (from {user['text']})" if isinstance(user, dict) else text


def _finished_ranks(ctx: Context, job: dict[str, Any]) -> list[dict[str, Any]]:
    """Other ranks of the same run whose loaders are not in an epoch."""
    run_id = job.get("run_id")
    if not run_id:
        return []
    out = []
    for other in ctx.live_jobs:
        if other is job or other.get("run_id") != run_id:
            continue
        loaders = [ld for ld in other.get("loaders") or [] if isinstance(ld, dict)]
        if loaders and all(num(ld.get("stalled_s")) is None for ld in loaders):
            batches = [as_int(ld.get("batches_total")) or 0 for ld in loaders]
            eb = [b for ld in loaders for b in (ld.get("epoch_batches") or [])[-1:]]
            out.append(
                {
                    "rank": other.get("rank"),
                    "pid": other.get("pid"),
                    "batches_total": max(batches) if batches else None,
                    "last_epoch_batches": eb[-1] if eb else None,
                }
            )
    return out


Cause = tuple[str, str, str]  # (cause id, what the evidence shows, the next step)
_STUCK = (hang.IO, hang.LOCK, hang.RUNNING, hang.SLEEP)


def _worker_cause(lv: LoaderView, w: Entry, others: list[Entry]) -> Cause | None:
    """Why one stuck worker is stuck, from its stack."""
    who = f"worker {w.get('worker_id')} (pid {w.get('pid')})"
    kind = w.get("kind")
    if kind == hang.LOCK:
        users = _user_threads(others)
        if lv.loader.get("start_method") == "fork" and users:
            return (
                "fork-inherited-lock",
                f"{who} waits on a lock in {_where_text(w)}; it was forked while the trainer ran "
                f"threads ({', '.join(users[:4])}): a lock one of them held at fork time stays held "
                "in the worker, with no thread to release it",
                "start workers with multiprocessing_context='spawn' or 'forkserver', or create the "
                "lock (and the thread) after the DataLoader's workers have started",
            )
        return (
            "worker-blocked-lock",
            f"{who} waits on a lock in {_where_text(w)}",
            "find who holds that lock (dlwatch stacks --pid shows every thread)",
        )
    if kind == hang.IO:
        return (
            "worker-blocked-io",
            f"{who} is blocked in I/O in {_where_text(w)}",
            "that read does not return: check the storage or endpoint it reads; give the read a "
            "timeout, and DataLoader(timeout=...) to fail instead of hanging",
        )
    if kind in (hang.RUNNING, hang.SLEEP, hang.QUEUE):
        return (
            "worker-stuck",
            f"{who} has been in one fetch for {num(w.get('in_fetch_s')) or 0:.0f} s, in {_where_text(w)}",
            "that fetch does not finish; its frame is the place to look",
        )
    return None


def _cause(
    ctx: Context,
    lv: LoaderView,
    main: Entry | None,
    workers: list[Entry],
    others: list[Entry],
    deaths: list[Entry],
) -> list[Cause]:
    """Every cause the evidence shows, the one to act on first: a death, a
    full /dev/shm, then the stuck workers (the one the loop waits for
    first), else what the loop itself is doing."""
    ld = lv.loader
    shm = as_int(ctx.host.get("shm_free_bytes"))
    if deaths:
        d = deaths[-1]
        how = d.get("signal") or d.get("exception") or f"exit code {d.get('exit_code')}"
        return [
            (
                "worker-died",
                f"worker {d.get('id')} (pid {d.get('pid')}) died ({how})",
                "read the worker's error above; a SIGKILL with OOM kills counted is the memory limit",
            )
        ]
    if shm is not None and shm < SHM_FULL_BYTES and lv.num_workers:
        return [
            (
                "shm-full",
                f"/dev/shm has {shm / 2**20:.1f} MiB free: workers cannot hand over batches",
                "free /dev/shm (stale torch_* files) or enlarge it (docker --shm-size=8g); "
                "fewer workers or a smaller prefetch_factor need less",
            )
        ]
    awaited = as_int(ld.get("awaited_worker"))
    causes = [
        c
        for w in sorted(workers, key=lambda w: as_int(w.get("worker_id")) != awaited)
        if (c := _worker_cause(lv, w, others)) is not None
    ]
    if causes:
        return causes
    main_kind = (main or {}).get("kind")
    if not lv.num_workers and ld.get("in_next") and main is not None and main_kind in _STUCK:
        # num_workers=0: the loop fetches its batches itself, inside next().
        what = {hang.IO: "is blocked in I/O", hang.LOCK: "waits on a lock"}.get(
            str(main_kind), "does not return"
        )
        return [
            (
                "loop-fetch-blocked",
                f"the loop loads its own batches (num_workers=0) and that fetch {what} "
                f"in {_where_text(main)}",
                "that call does not return: give it a timeout; with workers (num_workers > 0) "
                "DataLoader(timeout=...) fails instead of hanging",
            )
        ]
    idle = bool(workers) and all(w.get("kind") == hang.IDLE for w in workers)
    if (idle or not workers) and main_kind != hang.QUEUE and not ld.get("in_next"):
        finished = _finished_ranks(ctx, lv.job)
        where = _where_text(main) or "outside the loader"
        if finished or main_kind == hang.COLLECTIVE:
            ranks = ", ".join(f"rank {r['rank']} (pid {r['pid']})" for r in finished)
            named = f"; {ranks} has finished its epoch" if ranks else ""
            return [
                (
                    "uneven-ranks",
                    f"every worker is idle and the loop waits in {where}{named}: "
                    "the ranks ran out of data unevenly",
                    "give every rank the same number of batches: DistributedSampler(drop_last=True), "
                    "or an iterable dataset that yields equally per rank (torch.distributed's join "
                    "context for uneven inputs)",
                )
            ]
        return [
            (
                "loop-stuck",
                f"the loop has not asked for a batch: its main thread is in {where}",
                "that call does not return; dlwatch stacks shows every thread",
            )
        ]
    if idle and main_kind == hang.QUEUE:
        return [
            (
                "workers-idle",
                "the loop waits for a batch while every worker is idle: no worker was given the index",
                "a worker that exited without the loader noticing, or a custom sampler/iterable that "
                "stopped yielding; dlwatch stacks shows the workers",
            )
        ]
    return [("unknown", "no stack shows where", "dlwatch stacks --pid shows every thread and worker")]


def rule_loader_stalled(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        ld = lv.loader
        stalled = num(ld.get("stalled_s"))
        if stalled is None:
            continue
        stacks = _fresh_stacks(ctx, lv.job, stalled)
        entries = stacks.get("summary") if stacks else []
        main, workers, others = _mine(entries or [], lv.lid)
        deaths = [d for d in ld.get("worker_deaths") or [] if isinstance(d, dict)]
        causes = _cause(ctx, lv, main, workers, others, deaths)
        cause, shows, step = causes[0]
        awaited = as_int(ld.get("awaited_worker"))
        if awaited is not None and cause.startswith("worker-") and cause != "worker-died":
            shows = f"it waits for worker {awaited}'s batch; {shows}"
        if len(causes) > 1:
            shows += "; also " + "; ".join(c[1] for c in causes[1:])
            more = list(dict.fromkeys(c[2] for c in causes[1:] if c[2] != step))
            if more:
                step += "; also " + "; ".join(more)
        thr = num(ld.get("stall_threshold_s"))
        waiting = "inside next()" if ld.get("in_next") else "outside the loader"
        msg = (
            f"{lv.title} has delivered no batch for {stalled:.0f} s (stall threshold {thr or 0:.0f} s), "
            f"the loop {waiting}: {shows}"
        )
        out.append(
            hint(
                "loader-stalled",
                "critical",
                lv.pid,
                lv.lid,
                msg,
                step,
                {
                    "stalled_s": stalled,
                    "stall_threshold_s": thr,
                    "in_next": ld.get("in_next"),
                    "cause": cause,
                    "causes": [c[0] for c in causes],
                    "awaited_worker": awaited,
                    "main_thread": _where_text(main),
                    "main_thread_kind": (main or {}).get("kind"),
                    "workers_not_delivered": [
                        {
                            "id": w.get("worker_id"),
                            "pid": w.get("pid"),
                            "in_fetch_s": w.get("in_fetch_s"),
                            "kind": w.get("kind"),
                            "blocked_at": _where_text(w),
                        }
                        for w in workers
                        if w.get("kind") != hang.IDLE
                    ],
                    "lines": [str(e.get("line")) for e in entries or [] if isinstance(e, dict)][:16],
                    "stacks_reason": (stacks or {}).get("reason"),
                    "finished_ranks": _finished_ranks(ctx, lv.job),
                },
            )
        )
    return out


_HIDES = frozenset(
    {
        "no-workers",
        "add-workers",
        "io-bound",
        "cpu-bound-preprocessing",
        "pipeline-has-headroom",
        "enable-pin-memory",
        "straggler-rank",
        "sampled-worker-count",
        "idle-workers",
        "head-of-line-blocking",
    }
)

RULES = (Rule("loader-stalled", rule_loader_stalled, "loader", supersedes=_HIDES),)
