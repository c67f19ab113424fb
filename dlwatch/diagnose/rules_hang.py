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
- a worker that died, or one that is stopped (SIGSTOP, ctrl-Z, a debugger);
- every worker idle while the loop waits elsewhere, in a collective: in a
  torchrun run, a rank whose loader has ended its epoch ran out of data
  first (a sampler or an iterable that splits unevenly across ranks);
- the loop stuck outside the loader (its main thread's frame is named).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dlwatch.snapshot import run_key

from . import hang
from .facts import Context, LoaderView, as_int, as_list, hint, num, pct, r
from .registry import Rule

# /dev/shm with less than this free cannot take a batch of any size that
# matters (a 224 px RGB uint8 batch of 32 is 4.8 MB).
SHM_FULL_BYTES = 4 << 20
# Stacks a monitor asked for (no stall's batch count to tell them by) older
# than the stall's start, give or take the gathering and the frames' age,
# are an earlier episode's.
STACKS_SLACK_S = 5.0
# Threads of the trainer that are the machinery's, not the user's.
_MACHINERY = ("QueueFeederThread", "pt_data_pin", "pt_autograd", "dlwatch-")


def _fresh_stacks(
    ctx: Context, job: dict[str, Any], ld: dict[str, Any], stalled_s: float
) -> dict[str, Any] | None:
    st = job.get("stacks")
    if not isinstance(st, dict) or not isinstance(st.get("summary"), list):
        return None
    at = _stalled_at(st, as_int(ld.get("id")))
    if at is not None:
        # Gathered when this loader stalled: they are this stall's only if no
        # batch came since, however recent they are. On a loaded box a rank's
        # first batch came past the epoch-start threshold (a stall: the loop
        # in next(), its workers idle once they answered); it trained 13
        # batches and hung in a collective seconds later, and within the
        # slack below a snapshot read the first stall's stacks as the hang's
        # (fresh-clone run 72).
        return st if at == (as_int(ld.get("epoch")), as_int(ld.get("batches_total"))) else None
    t, now = num(st.get("t")), ctx.time
    if t is None or now is None or t < now - stalled_s - STACKS_SLACK_S:
        return None
    return st


def _stalled_at(st: dict[str, Any], lid: int | None) -> tuple[int | None, int | None] | None:
    """(epoch, batches) of loader ``lid`` when the job gathered ``st`` for its
    stall (the frame that showed the stall, ``probe/publisher.py``); None
    for stacks a monitor asked for, or gathered for another loader's stall."""
    if st.get("reason") != "stall" or lid is None:
        return None
    for e in st.get("loaders") or ():
        if isinstance(e, dict) and as_int(e.get("id")) == lid and as_int(e.get("batches")) is not None:
            return as_int(e.get("epoch")), as_int(e.get("batches"))
    return None


Entry = dict[str, Any]


def _mine(entries: list[Entry], ld: Mapping[str, Any]) -> tuple[Entry | None, list[Entry], list[Entry]]:
    """(the trainer's main thread, this loader's workers, the trainer's
    other threads), from the stacks summary. A pipeline's worker threads
    (torchdata.nodes', Grain's: ``pipeline_workers`` by thread id) are its
    workers too (a QA run: a nodes thread blocked on a lock, named in the
    summary, and the cause read "unknown")."""
    lid = as_int(ld.get("id"))
    tids = {
        as_int(w.get("tid")): i
        for i, w in enumerate(ld.get("pipeline_workers") or [])
        if isinstance(w, dict) and w.get("kind") == "thread" and as_int(w.get("tid"))
    }
    main = None
    workers, others = [], []
    for e in entries:
        if not isinstance(e, dict):
            continue
        if e.get("role") == "worker":
            if as_int(e.get("loader_id")) == lid:
                workers.append(e)
        elif as_int(e.get("tid")) in tids:
            workers.append(dict(e, worker_id=tids[as_int(e.get("tid"))], thread_worker=True))
        elif e.get("thread") == "MainThread" and main is None:
            main = e
        else:
            others.append(e)
    return main, workers, others


def _feeder_entry(ld: Mapping[str, Any], others: list[Entry]) -> Entry | None:
    """The stack of the thread that iterates a thread-fed loader (its
    ``iterated_on`` while the loop is its ``consumer``)."""
    if not isinstance(ld.get("consumer"), dict):
        return None
    name = (ld.get("iterated_on") or {}).get("thread")
    return next((e for e in others if name and e.get("thread") == name), None)


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
    text = f"{text} (from {user['text']})" if isinstance(user, dict) else text
    return f"{text}, {at['item']}" if at.get("item") else text


def _finished_ranks(ctx: Context, job: dict[str, Any]) -> list[dict[str, Any]]:
    """Other ranks of the same run whose loaders are not in an epoch."""
    key = run_key(job)
    if key is None:
        return []
    out = []
    for other in ctx.live_jobs:
        if other is job or run_key(other) != key:
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
_STUCK = (hang.IO, hang.LOCK, hang.RUNNING, hang.SLEEP, hang.NATIVE, hang.BARRIER)
_OFF_CPU = ("S", "D", "sleeping", "disk-sleep", "idle")


# /proc's "T" as psutil names it; "tracing-stop" ("t") is also what py-spy's
# own reads cause for an instant, so it is no evidence.
STOPPED = "stopped"


def stopped_workers(ld: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The loader's worker processes (a DataLoader's, a pipeline's) whose
    process sample reads stopped."""
    procs = [w for w in ld.get("workers") or () if isinstance(w, dict)]
    procs += [
        w for w in ld.get("pipeline_workers") or () if isinstance(w, dict) and w.get("kind") == "process"
    ]
    return [w for w in procs if w.get("state") == STOPPED]


def stopped_cause(ld: Mapping[str, Any], stopped: list[dict[str, Any]]) -> Cause:
    """A QA run stopped one of a MONAI script's DataLoader workers (kill
    -STOP) while its queue feeder thread was writing a batch to the result
    pipe: the loop sat in that pipe's read, every other worker behind it,
    and the stall read "every worker is idle" (their stacks were)."""
    w = stopped[0]
    wid = w.get("id")
    who = f"worker {wid} (pid {w.get('pid')})" if wid is not None else f"worker process {w.get('pid')}"
    more = f" (and {len(stopped) - 1} more)" if len(stopped) > 1 else ""
    pids = " ".join(str(x.get("pid")) for x in stopped)
    return (
        "worker-stopped",
        f"{who}{more} is stopped (SIGSTOP, ctrl-Z in its terminal, or a debugger holding it): its "
        "batches cannot come until it continues, and one stopped while handing a batch over holds "
        "the result queue, so every other worker's batches wait behind it",
        f"resume it: kill -CONT {pids} (or continue it in the debugger)",
    )


def live_in_fetch(w: Entry, stacks_t: float | None, now: float | None) -> float | None:
    """Seconds the worker has been in its fetch now: the figure taken when
    the stacks were gathered plus the time since (the stall goes on, the
    fetch with it), never the figure frozen at the gathering."""
    at = num(w.get("in_fetch_s"))
    if at is None:
        return None
    if stacks_t is None or now is None:
        return at
    return at + max(0.0, now - stacks_t)


def with_process_figures(w: Entry, rec: dict[str, Any] | None) -> Entry:
    """A worker's entry with what the snapshot's process sample says: a
    plain call ("running") of a worker at ~0 % CPU that sleeps is blocked
    inside that call's C code. The stacks of a job's own channel carry no
    CPU figure; the monitor's sample of the same worker does."""
    if not rec:
        return w
    cpu, state = num(rec.get("cpu_percent")), rec.get("state")
    out = dict(w, cpu_percent=cpu, state=state, batches=rec.get("batches"))
    if state == STOPPED:
        # Its stack is where it was stopped ("idle, waiting for work" read as
        # a worker with nothing to do).
        line = str(w.get("line"))
        if hang.STOPPED_NOTE not in line:
            name = hang.process_name(w)
            rest = line[len(name) + 2 :] if line.startswith(f"{name}: ") else line
            out["line"] = f"{name}: {hang.STOPPED_NOTE}{rest}"
        return out
    if w.get("kind") == hang.RUNNING and cpu is not None and cpu < hang.NATIVE_CPU_MAX and state in _OFF_CPU:
        out["kind"] = hang.NATIVE
        at = w.get("at") or {}
        shown = f"{at.get('text')}" + (
            f" (from {at['user']['text']})" if isinstance(at.get("user"), dict) else ""
        )
        who = hang.process_name(w)
        out["line"] = f"{who}: blocked in C ({cpu:.0f} % CPU, sleeping) in {shown}"
    return out


def _who(w: Entry) -> str:
    if w.get("thread_worker"):
        return f"worker thread '{w.get('thread')}' (tid {w.get('tid')})"
    return f"worker {w.get('worker_id')} (pid {w.get('pid')})"


def _cpu_note(w: Entry) -> str:
    cpu = num(w.get("cpu_percent"))
    return f" at {cpu:.0f} % CPU" if cpu is not None else ""


# A Hugging Face tokenizer's call: its Rust thread pool is what fork copied
# (huggingface/tokenizers#187), and OMP_NUM_THREADS does not reach it.
_TOKENIZERS = re.compile(r"tokeni[sz]|encode_batch|batch_encode", re.I)


def fork_inherited_pool(
    lv: LoaderView, w: Entry, others: list[Entry], workers: list[Entry] | None = None
) -> Cause | None:
    """(a) A lock or thread pool inherited across fork: a worker of a fork
    loader blocked in C, asleep at ~0 % CPU, at its first fetch (it has
    delivered nothing since it was forked) or while the trainer runs threads
    of the user's. The trainer's OpenMP/MKL pool, or a native lock one of its
    threads held, was copied into the worker without its threads; the call
    into it waits for them forever (pytorch#42444, #75147)."""
    if w.get("kind") != hang.NATIVE or lv.loader.get("start_method") != "fork":
        return None
    users = _user_threads(others)
    first = as_int(w.get("batches")) == 0
    if not first and not users:
        return None
    if not users and any(o.get("kind") == hang.IDLE for o in workers or ()):
        # Every worker forked from the same trainer: a copied pool stops each
        # one at its first parallel call. A sibling idle beside it says the
        # call waits on something else (a QA run: a sqlite lock another
        # worker held, read as a thread pool).
        return None
    when = "its first call into it since the workers forked" if first else "after the workers forked"
    held = f" (the trainer runs threads: {', '.join(users[:4])})" if users else ""
    fresh = "start the workers with multiprocessing_context='spawn' or 'forkserver'"
    if users:
        # A lock one of the user's threads held at fork: no thread count can
        # release it (pytorch#75147); a fresh interpreter or a lock taken
        # after the fork can.
        fix = (
            f"{fresh} (a worker then inherits no lock), or start those threads (or take that lock) "
            "only after the workers have forked; if it is a thread pool, keep the workers "
            "single-threaded (OMP_NUM_THREADS=1, or torch.set_num_threads(1) in worker_init_fn)"
        )
    else:
        fix = (
            "keep the workers single-threaded: OMP_NUM_THREADS=1 in the job's environment, or "
            "torch.set_num_threads(1) in worker_init_fn (and nothing that raises it in the worker); "
            f"or {fresh}"
        )
    at = w.get("at") or {}
    if _TOKENIZERS.search(f"{at.get('function', '')} {at.get('src', '')}"):
        fix = (
            "TOKENIZERS_PARALLELISM=false in the job's environment (a Hugging Face tokenizer's own "
            f"thread pool, which OMP_NUM_THREADS does not reach), or {fresh}"
        )
    return (
        "fork-inherited-pool",
        f"{_who(w)} is blocked in C{_cpu_note(w)}, asleep, in {_where_text(w)}: a native thread pool "
        f"or lock, {when}. A pool (OpenMP, MKL) or a lock the trainer had running{held} was "
        "copied into the worker without its threads, and the call waits for them forever",
        fix,
    )


def barrier_wait(lv: LoaderView, w: Entry, workers: list[Entry]) -> Cause | None:
    """(b) A barrier (or a collective) waiting for a partner that never
    arrives: the parties' shares of the data were uneven, and the others
    finished theirs, or never reach the barrier (mosaicml/streaming#447)."""
    if w.get("kind") not in (hang.BARRIER, hang.COLLECTIVE):
        return None
    idle = [o for o in workers if o is not w and o.get("kind") == hang.IDLE]
    others = (
        f"; {len(idle)} other worker{'s are' if len(idle) != 1 else ' is'} idle, not at it" if idle else ""
    )
    what = "a barrier" if w.get("kind") == hang.BARRIER else "a collective"
    return (
        "barrier-partner-missing",
        f"{_who(w)} waits at {what} in {_where_text(w)} for a partner that does not arrive{others}",
        "a barrier needs every party: give every worker (and rank) the same number of items (equal "
        "partitions, drop_last=True), or give the wait a timeout (Barrier(timeout=...), "
        "torch.distributed's Join context for uneven inputs)",
    )


def io_never_returns(lv: LoaderView, w: Entry) -> Cause | None:
    """(c) I/O that never returns: a read, an open, a socket, a remote
    store's or a shard reader's call (webdataset#308)."""
    if w.get("kind") != hang.IO:
        return None
    fail = ", and DataLoader(timeout=...) to fail instead of hanging"
    if "timed out after" in str(lv.loader.get("last_error") or ""):
        # The loader's own timeout has fired already (a QA run: the advice
        # still said to set it).
        fail = "; the DataLoader's timeout has fired already: this read is why"
    return (
        "worker-blocked-io",
        f"{_who(w)} is blocked in I/O in {_where_text(w)}",
        "that read does not return: check the storage or endpoint it reads; give the read a "
        f"timeout and retry it (socket/urlopen timeout=, fsspec's or the store client's timeouts){fail}",
    )


def _rank_name(r: dict[str, Any]) -> str:
    """ "rank 1 (pid 4711)", or "pid 4711" alone when the rank is not known."""
    rank = as_int(r.get("rank"))
    return f"rank {rank} (pid {r.get('pid')})" if rank is not None else f"pid {r.get('pid')}"


def finished_rank(ctx: Context, lv: LoaderView, main: Entry | None, workers: list[Entry]) -> Cause | None:
    """(d) A finished rank: every worker idle, the loop outside ``next()``
    waiting in a collective (or at a barrier) while another rank of the run
    has finished its epoch: the ranks had uneven data (k2-fsa/snowfall#152)."""
    ld = lv.loader
    main_kind = (main or {}).get("kind")
    idle = bool(workers) and all(w.get("kind") == hang.IDLE for w in workers)
    if not (idle or not workers) or main_kind == hang.QUEUE or ld.get("in_next"):
        return None
    finished = _finished_ranks(ctx, lv.job)
    if not finished and main_kind != hang.COLLECTIVE:
        return None
    where = _where_text(main) or "outside the loader"
    named = ", ".join(_rank_name(r) for r in finished)
    done = f"; {named} {'has' if len(finished) == 1 else 'have'} finished its epoch" if finished else ""
    world = as_int(lv.job.get("world_size")) or 0
    key = run_key(lv.job)
    seen = sum(1 for o in ctx.live_jobs if key is not None and run_key(o) == key)
    if not finished and world > 1 and seen < world:
        # `snapshot --pid` (or a view of one node) watches this rank alone:
        # say where the finished one can be named rather than nothing.
        done = (
            f"; {seen} of the run's {world} ranks {'is' if seen == 1 else 'are'} in view: a snapshot of "
            "every job of the run (without --pid, every node) names the rank that finished"
        )
    return (
        "uneven-ranks",
        f"every worker is idle and the loop waits in {where}{done}: the ranks ran out of data unevenly",
        "give every rank the same number of batches: DistributedSampler(drop_last=True), or an "
        "iterable dataset that yields equally per rank; or wrap the loop in torch.distributed's "
        "Join context (DDP's join()) so a rank that finishes early shadows the others' collectives",
    )


def _after_death(ld: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    """The next step after a worker's death, by what the record shows (a QA
    run: "a SIGKILL with OOM kills counted is the memory limit" for a
    SIGBUS and for a spawn worker that exited with code 1)."""
    cause = hang.death_cause(d)
    if cause == "oom":
        return (
            "the memory limit: fewer workers or a smaller prefetch_factor, less memory per sample; "
            "a dataset of Python objects grows in each worker as it is read (copy-on-read: keep it in "
            "numpy arrays)"
        )
    if cause == "shm":
        return (
            f"{'/dev/shm ran out' if d.get('exception') else 'a SIGBUS is most often /dev/shm running out'}: "
            "enlarge it (docker --shm-size=8g, or a larger tmpfs), or lower "
            "num_workers x prefetch_factor"
        )
    if cause == "segfault":
        return (
            "a crash in C code (a library's extension): PYTHONFAULTHANDLER=1 in the job's environment "
            "prints the worker's Python stack when it crashes"
        )
    if cause == "signal":
        return (
            f"{d.get('signal')} came from outside the job (kill, a scheduler, a supervisor), or from "
            "an OOM killer the cgroup does not count (dmesg shows it)"
        )
    code = as_int(d.get("exit_code"))
    if (
        code not in (None, 0)
        and ld.get("start_method") in ("spawn", "forkserver")
        and not as_int(ld.get("batches_total"))
    ):
        return (
            f"a {ld.get('start_method')} worker that exits with code {code} before any batch could not, "
            "most often, unpickle the dataset or import the module that defines it (\"Can't get "
            "attribute ... on <module '__mp_main__'>\" in the job's output): define the Dataset, "
            "collate_fn and worker_init_fn at the top level of a module the worker can import"
        )
    return "the worker's error is in the job's output (its stderr)"


def _feeder_gone(ld: Mapping[str, Any], deaths: list[Entry]) -> Cause:
    """The loop waits on a queue whose feeder thread has ended (stall.py:
    ``feeder_alive``): no batch will come. A QA run: a producer thread that
    returned early left the loop in ``q.get()`` for minutes with no stall
    said; one that died of a worker's exception read "worker 0 died", while
    the worker was alive and idle."""
    feeder = (ld.get("iterated_on") or {}).get("thread") or "?"
    consumer = ld.get("consumer") or {}
    via = consumer.get("via") or "queue.Queue"
    why = ""
    if deaths and deaths[-1].get("exception"):
        d = deaths[-1]
        why = f", on worker {d.get('id')}'s {d.get('exception')}"
    elif ld.get("last_error"):
        why = f", on {ld.get('last_error')}"
    return (
        "feeder-gone",
        f"the loop waits in the get() of the {via} that thread '{feeder}' fills, and that thread has "
        f"ended{why}: no batch will come",
        "end the loop when its feeder ends: have the thread put a sentinel (or the exception) on the "
        "queue before it exits, or get() with a timeout and check that the thread is_alive()",
    )


def peer_rank_down(ctx: Context, lv: LoaderView, main: Entry | None) -> Cause | None:
    """(e) Another rank of the run is stopped, unreachable or gone, and this
    one's loop is out of ``next()`` (in its step: a collective waits for every
    rank). A QA run paused rank 1 with SIGSTOP: rank 0's hint said only "its
    main thread is in _engine_run_backward … that call does not return",
    while the view listed rank 1 as stopped."""
    key = run_key(lv.job)
    if key is None or lv.loader.get("in_next"):
        return None
    down = [
        j
        for j in ctx.snapshot.get("jobs") or []
        if isinstance(j, dict)
        and j.get("pid") != lv.pid
        and run_key(j) == key
        and j.get("state", "live") != "live"
    ]
    if not down:
        return None
    where = _where_text(main) or "its step"
    named = "; ".join(
        f"{_rank_name(j)} {'has exited' if j.get('state') == 'exited' else 'is ' + str(j.get('state'))}"
        + (f" ({j['state_reason']})" if j.get("state_reason") and j.get("state") != "exited" else "")
        for j in down
    )
    return (
        "peer-rank-down",
        f"{named}: the loop waits in {where}, where a collective needs every rank of the run",
        "a stopped rank resumes with kill -CONT <pid>; a rank that exited printed its error in the "
        "run's output, and the run cannot go on without it: restart it (torchrun --max-restarts "
        "restarts every rank)",
    )


def _machinery_free(names: Any) -> list[str]:
    return [str(n) for n in as_list(names) if str(n) != "MainThread" and not str(n).startswith(_MACHINERY)]


def fork_inherited_executor(lv: LoaderView, w: Entry, main: Entry | None) -> Cause | None:
    """A worker of a fork loader waits for a ``concurrent.futures`` result
    (an executor's ``submit``, asyncio's ``run_coroutine_threadsafe``) with
    no thread of its own to complete it, while the trainer runs threads: the
    dataset's executor or event loop was made in the trainer, and fork
    copied it into the worker without its threads (fsspec's IO loop,
    datachain#691; a dataset's ThreadPoolExecutor). Read as "waits on a
    lock: find who holds it" before: nobody holds it."""
    if (
        w.get("thread_worker")
        or not w.get("awaits_future")
        or lv.loader.get("start_method") != "fork"
        or _machinery_free(w.get("thread_names"))
    ):
        return None
    # The pool's or loop's threads when the stacks show them (the rest of
    # the trainer's threads otherwise: a pool of another make).
    theirs = _machinery_free((main or {}).get("executor_threads")) or _machinery_free(
        (main or {}).get("thread_names")
    )
    if not theirs:
        return None
    more = f" and {len(theirs) - 3} more" if len(theirs) > 3 else ""
    return (
        "fork-inherited-executor",
        f"{_who(w)} waits for a future in {_where_text(w)} that no thread of the worker runs: it was "
        f"forked from the trainer, whose threads ({', '.join(theirs[:3])}{more}) run the executor or "
        "event loop the dataset made there; fork copied it into the worker without its threads",
        "make the executor or event loop in each worker: lazily at the first __getitem__ (keyed by "
        "os.getpid()) or in worker_init_fn; or start the workers with multiprocessing_context='spawn' or "
        "'forkserver'",
    )


def _worker_cause(
    lv: LoaderView, w: Entry, others: list[Entry], workers: list[Entry], main: Entry | None = None
) -> Cause | None:
    """Why one stuck worker is stuck, from its stack."""
    who = _who(w)
    kind = w.get("kind")
    executor = fork_inherited_executor(lv, w, main)
    if executor is not None:
        return executor
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
    for found in (
        fork_inherited_pool(lv, w, others, workers),
        barrier_wait(lv, w, workers),
        io_never_returns(lv, w),
    ):
        if found is not None:
            return found
    if kind == hang.NATIVE:
        idle = [o for o in workers if o is not w and o.get("kind") == hang.IDLE]
        sibling = (
            f"; {_who(idle[0])} is idle: a lock one worker took and kept (a database's write "
            "transaction, a file lock) stops the others so"
            if idle
            else ""
        )
        return (
            "worker-blocked-native",
            f"{who} is blocked in C{_cpu_note(w)}, asleep, in {_where_text(w)}{sibling}",
            "a C call that does not return: a lock another process holds (sqlite, LMDB or HDF5 opened "
            "for writing, a file lock), a native lock, a C library's read; `py-spy dump --native --pid` "
            "shows its C frames",
        )
    if kind == hang.QUEUE and not w.get("thread_worker"):
        # A worker of the loop's own waits in a queue's get() in the
        # dataset's code: for an item no one puts (an end-of-data sentinel
        # that went to another worker: Lightning#6810, accelerate#221).
        return (
            "worker-waits-on-queue",
            f"{who} waits in a queue's get() in {_where_text(w)}, for an item no one puts",
            "whatever feeds that queue must put an item for every reader that waits (one end-of-data "
            "sentinel per worker, not one in all), or get(timeout=...) and check that the producer is "
            "alive",
        )
    if kind in (hang.RUNNING, hang.SLEEP, hang.QUEUE):
        held = num(w.get("in_fetch_s"))
        since = f"has been in one fetch for {held:.0f} s, in" if held is not None else "is in"
        return (
            "worker-stuck",
            f"{who} {since} {_where_text(w)}",
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
    if ld.get("feeder_alive") is False:
        return [_feeder_gone(ld, deaths)]
    if deaths:
        d = deaths[-1]
        if d.get("exception") and not d.get("signal") and d.get("exit_code") in (None, 0):
            # torch's worker caught its fetch's exception and lives on; the
            # loader re-raised it in the thread that iterates it.
            return [
                (
                    "worker-raised",
                    f"worker {d.get('id')} (pid {d.get('pid')}) raised {d.get('exception')}, and the "
                    "loader re-raised it in the loop",
                    "worker_init_fn raised (no sample yet): its traceback is in the job's output"
                    if "(in worker_init_fn)" in str(d.get("exception"))
                    else "read the traceback in the job's output: the sample that raised is named there",
                )
            ]
        how = d.get("signal") or d.get("exception") or f"exit code {d.get('exit_code')}"
        # torchdata.nodes' mapper never looks at its worker processes: the
        # item the dead one held never comes (a QA run: a stall read
        # "unknown" for minutes).
        forever = (
            ": torchdata.nodes does not notice a dead worker, and the loop waits for its item forever"
            if ld.get("library") == "torchdata.nodes"
            else ""
        )
        return [
            (
                "worker-died",
                f"worker {d.get('id')} (pid {d.get('pid')}) died ({how}){forever}",
                _after_death(ld, d),
            )
        ]
    stopped = stopped_workers(ld)
    if stopped:
        return [stopped_cause(ld, stopped)]
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
        if (c := _worker_cause(lv, w, others, workers, main)) is not None
    ]
    if causes:
        return causes
    main_kind = (main or {}).get("kind")
    feeder = _feeder_entry(ld, others) if not lv.num_workers else None
    if feeder is not None and ld.get("in_next") and feeder.get("kind") in _STUCK:
        # num_workers=0 behind a feeder thread: the fetch runs there, and the
        # loop's frame is only its queue's get() (a QA run: the advice named
        # the loop's Condition.wait, and a DataLoader timeout).
        does = {hang.IO: "is blocked in I/O", hang.LOCK: "waits on a lock", hang.NATIVE: "is blocked in C"}
        return [
            (
                "feeder-fetch-blocked",
                f"thread '{feeder.get('thread')}' loads the batches (num_workers=0) and its fetch "
                f"{does.get(str(feeder.get('kind')), 'does not return')} in {_where_text(feeder)}; the loop "
                "waits in its queue's get()",
                "that call in the feeder thread does not return: find what it waits for (dlwatch stacks "
                "shows every thread); with workers (num_workers > 0) DataLoader(timeout=...) fails "
                "instead of hanging",
            )
        ]
    if (
        not lv.num_workers
        and ld.get("in_next")
        and main is not None
        and main_kind == hang.NATIVE
        and main.get("forked_child")
    ):
        # The job is itself a fork child of a Python process (a DataLoader
        # run in a multiprocessing.Process): a pool the parent had running
        # was copied without its threads (pytorch_geometric#3565: torch.cat
        # in collate, after the parent ran the same loader). A timeout, the
        # advice below, would never fire on it.
        return [
            (
                "fork-inherited-pool",
                f"the loop loads its own batches (num_workers=0) and that fetch is blocked in C, asleep, "
                f"in {_where_text(main)}; this process was forked by multiprocessing (its stack starts in "
                "Popen._launch): a native thread pool (OpenMP, MKL) or lock its parent had running was "
                "copied without its threads, and the call waits for them forever",
                "start that process with multiprocessing.get_context('spawn') or 'forkserver'; or keep it "
                "single-threaded: torch.set_num_threads(1) first thing in it (OMP_NUM_THREADS=1 before the "
                "parent imports torch)",
            )
        ]
    if not lv.num_workers and ld.get("in_next") and main is not None and main_kind in _STUCK:
        # num_workers=0: the loop fetches its batches itself, inside next().
        what = {
            hang.IO: "is blocked in I/O",
            hang.LOCK: "waits on a lock",
            hang.NATIVE: "is blocked in C",
            hang.BARRIER: "waits at a barrier",
        }.get(str(main_kind), "does not return")
        return [
            (
                "loop-fetch-blocked",
                f"the loop loads its own batches (num_workers=0) and that fetch {what} "
                f"in {_where_text(main)}",
                "that call does not return: give it a timeout; with workers (num_workers > 0) "
                "DataLoader(timeout=...) fails instead of hanging",
            )
        ]
    down = peer_rank_down(ctx, lv, main)
    if down is not None:
        return [down]
    ranks = finished_rank(ctx, lv, main, workers)
    if ranks is not None:
        return [ranks]
    idle = bool(workers) and all(w.get("kind") == hang.IDLE for w in workers)
    if (idle or not workers) and main_kind != hang.QUEUE and not ld.get("in_next"):
        where = _where_text(main) or "outside the loader"
        if main_kind == hang.BARRIER:
            return [
                (
                    "barrier-partner-missing",
                    f"every worker is idle and the loop waits at a barrier in {where} for a partner "
                    "that does not arrive",
                    "a barrier needs every party: give every rank (or thread) the same number of "
                    "items (drop_last=True), or give the wait a timeout",
                )
            ]
        return [
            (
                "loop-stuck",
                f"the loop has not asked for a batch: its main thread is in {where}"
                if _where_text(main)
                else "the loop has not asked for a batch, and no stack shows where its main thread is",
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
        stacks = _fresh_stacks(ctx, lv.job, ld, stalled)
        entries = stacks.get("summary") if stacks else []
        main, workers, others = _mine(entries or [], ld)
        # Each worker as it is now: its process sample (CPU, state: a plain
        # call at 0 % CPU is blocked in C) and its fetch's age at this snapshot.
        recs = {as_int(r.get("pid")): r for r in ld.get("workers") or [] if isinstance(r, dict)}
        t_stacks = num((stacks or {}).get("t"))
        workers = [
            dict(
                with_process_figures(w, recs.get(as_int(w.get("pid")))),
                in_fetch_s=live_in_fetch(w, t_stacks, ctx.time),
            )
            for w in workers
        ]
        deaths = [d for d in ld.get("worker_deaths") or [] if isinstance(d, dict)]
        causes = _cause(ctx, lv, main, workers, others, deaths)
        cause, shows, step = causes[0]
        awaited = as_int(ld.get("awaited_worker"))
        if awaited is not None and cause not in ("worker-died", "shm-full", "unknown"):
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
                            "in_fetch_s": r(num(w.get("in_fetch_s")), 1),
                            "kind": w.get("kind"),
                            "blocked_at": _where_text(w),
                        }
                        for w in workers
                        if w.get("kind") != hang.IDLE
                    ],
                    "lines": _lines(entries or [], workers)[:16],
                    "stacks_reason": (stacks or {}).get("reason"),
                    "finished_ranks": _finished_ranks(ctx, lv.job),
                },
            )
        )
    return out


def _lines(entries: list[Entry], workers: list[Entry]) -> list[str]:
    """The summary's lines, each worker's as refined by its process figures."""
    mine = {(w.get("pid"), w.get("thread")): w for w in workers}
    out = []
    for e in entries:
        if isinstance(e, dict):
            out.append(str(mine.get((e.get("pid"), e.get("thread")), e).get("line")))
    return out


# While a loader is stalled, the advice about its load and its workers'
# threads, read from windows in which nothing moved (idle workers at 0 % CPU,
# the cores busy with other processes), is noise beside the stall: the engine
# keeps these off screen for that loader (engine.quiet_beside_stall), the
# host-wide one when every loader it is about is stalled.
QUIET_WHILE_STALLED = frozenset(
    {
        "worker-thread-oversubscription",
        "workers-oversubscribe-cores",
        "cores-shared-with-others",
        "add-pipeline-workers",
        "gil-bound-threads",
        "no-worker-knob",
        "enable-persistent-workers",
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


def rule_worker_stopped(ctx: Context) -> list[dict[str, Any]]:
    """A stopped worker before any stall is declared: the loop already waits
    on it, and the count and core advice read the stopped worker's 0 % CPU
    (a QA run: cores-shared-with-others blamed other processes 17 s after
    the stop). A stalled loader's loader-stalled names it instead."""
    out = []
    for lv in ctx.loaders:
        ld = lv.loader
        if num(ld.get("stalled_s")) is not None:
            continue
        stopped = stopped_workers(ld)
        if not stopped:
            continue
        _, shows, step = stopped_cause(ld, stopped)
        waits = f"; the loop waits for data {pct(lv.wait)} of the time" if lv.wait is not None else ""
        msg = f"{lv.title}: {shows}{waits}."
        ev = {
            "stopped_workers": [{"id": w.get("id"), "pid": w.get("pid")} for w in stopped],
            "data_wait_fraction": r(lv.wait),
        }
        severity = "critical" if lv.wait is not None and lv.wait >= 0.5 else "warn"
        out.append(hint("worker-stopped", severity, lv.pid, lv.lid, msg, step, ev))
    return out


RULES = (
    Rule("loader-stalled", rule_loader_stalled, "loader"),
    Rule("worker-stopped", rule_worker_stopped, "loader", supersedes=QUIET_WHILE_STALLED),
)
