"""Plain-text rendering of snapshots for ``dlwatch snapshot`` and ``dlwatch ls``."""

from __future__ import annotations

from typing import Any

from dlwatch.collect.co_iterated import describe as describe_loop
from dlwatch.collect.loop_role import no_loader_yet
from dlwatch.snapshot import (
    batch_word,
    count_of,
    epoch_start_missing,
    num,
    percent,
    pipeline_workers_line,
    set_aside,
    unmeasured_jobs,
    unmeasured_line,
)

# What a figure only the hook measures reads for an attached job.
NOT_SAMPLED = "n/a (attached: sampled)"


def _pct(x: Any, nd: int = 1) -> str:
    return percent(x, nd)


def _num(x, fmt="{:.1f}", unit="") -> str:
    if isinstance(x, bool) or num(x) is None:
        return "n/a"
    return fmt.format(x) + unit


def human_bytes(n) -> str:
    if n is None:
        return "n/a"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def render_ls(jobs: list[dict]) -> str:
    hosts = any("host" in j for j in jobs)
    rows = [(*(("HOST",) if hosts else ()), "PID", "RANK", "AGE", "LOADERS", "STATE", "COMMAND")]
    for j in jobs:
        rank = "-" if j.get("rank") is None else f"{j['rank']}/{j.get('world_size') or '?'}"
        rows.append(
            (
                *((str(j.get("host") or "?"),) if hosts else ()),
                str(j["pid"]),
                rank,
                f"{j.get('age_s') or 0:.0f}s",
                str(j["loaders"]),
                j.get("state", ""),
                _short(j.get("cmdline", ""), 60),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def render_hosts(lines: list[dict]) -> str:
    """One line per host of ``--host``: its state, and why it could not be read."""
    out = []
    for h in lines:
        where = " (this machine)" if h.get("local") else ""
        state = h.get("state") or "?"
        shown = state if state == "ok" else state.upper()
        text = f"host {h.get('host')}{where}: {shown}, {count_of(h.get('jobs', 0), 'job')}"
        figures = h.get("figures")
        if isinstance(figures, dict) and figures:
            text += (
                f", {_num(figures.get('usable_cores'), '{:g}')} usable cores of "
                f"{figures.get('logical_cpus')} logical, CPU {_num(figures.get('cpu_percent'), unit=' %')}, "
                f"GPUs {len(h.get('gpus') or [])}"
                + ("" if h.get("gpu_status") in ("ok", None) else f" ({h.get('gpu_status')})")
            )
        if h.get("reason"):
            text += f" -- {h['reason']}"
        out.append(text)
    return "\n".join(out)


def render_runs(runs: list[dict]) -> str:
    """Each run's ranks across hosts: the data wait every rank steps at (the
    slowest rank's) beside the mean."""
    out = []
    for r in runs:
        slow = r.get("slowest") or {}
        who = f" (rank {slow.get('rank')} on {slow.get('host')})" if slow else ""
        out.append(
            f"run {r.get('run_id')}: {r.get('ranks_live')}/{r.get('world_size')} ranks live on "
            f"{', '.join(r.get('hosts') or [])}; data wait max {_pct(r.get('data_wait_fraction_max'))}{who}, "
            f"mean {_pct(r.get('data_wait_fraction_mean'))}"
        )
    return "\n".join(out)


def render_snapshot(snap: dict, title: str = "dlwatch snapshot") -> str:
    h = snap.get("host", {})
    shm = human_bytes(h.get("shm_free_bytes"))
    lines = [
        f"{title}  window {snap.get('window_s', 0):.1f} s",
        f"host: {h.get('logical_cpus')} logical CPUs, {_num(h.get('usable_cores'))} usable cores"
        + (f" ({h['cores_reason']})" if h.get("cores_reason") else "")
        + f", CPU {_num(h.get('cpu_percent'), unit=' %')}, /dev/shm free {shm}",
    ]
    if snap.get("gpu_status") == "ok":
        for g in snap.get("gpus", []):
            util = _num(g.get("util_percent"), "{:.0f}", " %")
            used, total = human_bytes(g.get("mem_used_bytes")), human_bytes(g.get("mem_total_bytes"))
            lines.append(f"GPU {g['index']} {g.get('name', '')}: util {util}, memory {used} / {total}")
    else:
        lines.append(f"GPU: {snap.get('gpu_status')}")
    if snap.get("hosts"):
        lines.append(render_hosts(snap["hosts"]))
    if snap.get("runs"):
        lines.append(render_runs(snap["runs"]))
    for j in snap.get("jobs", []):
        rank = "" if j.get("rank") is None else f"  rank {j['rank']}/{j.get('world_size') or '?'}"
        if j.get("host"):
            rank += f"  on {j['host']}"
        main_cpu = _num(j.get("main_cpu_percent"), "{:.0f}", " %")
        lines.append("")
        sampled = "  sampled (attached, no hook)" if j.get("sampled") is True else ""
        lines.append(
            f"job {j['pid']}{rank}  [{j.get('state')}]{sampled}  torch {j.get('torch_version')}  "
            f"main CPU {main_cpu}  {_short(j.get('cmdline', ''), 70)}"
        )
        if j.get("state_reason"):
            lines.append(f"  {j['state_reason']}")
        if not j.get("loaders"):
            lines.append(f"  {no_loader_yet(j)}")
        for loop in j.get("loops") or []:
            # zip(a, b): the loop waits for each in turn, its wait is theirs summed.
            lines.append(f"  {describe_loop(loop)}")
        for ld in j.get("loaders", []):
            lines.extend(_sampled_loader_lines(ld, j) if ld.get("sampled") is True else _loader_lines(ld, j))
        lines.extend(_stacks_lines(j, snap))
    if snap.get("uss_reason") and any(
        ld.get("workers") for j in snap.get("jobs", []) for ld in j.get("loaders", [])
    ):
        lines.append(f"uss: n/a: {snap['uss_reason']}")
    lines.append("")
    for fault in snap.get("errors") or []:
        lines.append(f"collector error: {fault}")
    hints = snap.get("hints") or []
    judging: list[str] = []
    try:
        from dlwatch.diagnose.render import judging_lines

        judging = judging_lines(snap.get("judging"))
    except ImportError:
        pass
    lines.extend(judging)
    judged = num(snap.get("judged_s"))
    if judging and judged is not None:
        lines.append(
            f"judged on {judged:.1f} s of watching, not long enough for these loaders: the live view too "
            f"waits for steady rates, then {_hold_s()} s of a condition, before a hint shows (and holds "
            f"what it saw for up to a minute); `dlwatch snapshot --judge S` watches longer"
        )
    if snap.get("hints_error") and not hints:
        lines.append(f"hints: n/a: {snap['hints_error']}")
    elif hints:
        try:
            from dlwatch.diagnose import format_hints

            lines.append(format_hints(hints))
        except ImportError:
            for hint in hints:
                lines.append(f"[{hint['severity']}] {hint['message']}\n    → {hint['suggestion']}")
    else:
        unmeasured = unmeasured_jobs(snap.get("jobs"))
        if judging:
            lines.append("hints: none yet")
        elif unmeasured:
            lines.append(unmeasured_line(unmeasured))
        else:
            lines.append("hints: none — nothing to fix")
    return "\n".join(lines)


# Stacks older than this many windows (and at least STACKS_OLD_MIN_S) are
# history, not what the job does now: a line says so in place of them.
STACKS_OLD_WINDOWS = 3.0
STACKS_OLD_MIN_S = 30.0


def _ago(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f} s ago"
    if s < 5400:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def _stacks_lines(j: dict, snap: dict) -> list[str]:
    """The job's last stacks, with their age: a process in them that is no
    longer one of the job's (a worker of an earlier epoch) marked "(exited
    since)", a stall's stacks after the stall ended said to be so, and
    stacks much older than the window left out with one line saying where
    new ones come from (before, a request's stacks of a worker gone for
    minutes read as the job's state now)."""
    st = j.get("stacks")
    if not isinstance(st, dict) or not st.get("summary"):
        return []
    pid, reason = j.get("pid"), st.get("reason")
    more = f"dlwatch stacks --pid {pid}"
    taken, now = num(st.get("t")), num(snap.get("time"))
    age = now - taken if taken is not None and now is not None else None
    stalled = any(num(ld.get("stalled_s")) is not None for ld in j.get("loaders") or [])
    window = num(snap.get("window_s")) or 0.0
    if (
        age is not None
        and age > max(STACKS_OLD_MIN_S, STACKS_OLD_WINDOWS * window)
        and not (reason == "stall" and stalled)
    ):
        return [
            f"  stacks: the last ones ({reason}) were taken {_ago(age)}, not shown: `{more}` takes them now"
        ]
    when = f", taken {_ago(age)}" if age is not None else ", when taken n/a"
    ended = "; the stall has since ended" if reason == "stall" and not stalled else ""
    current = {pid} if j.get("state") != "exited" else set()
    current |= {
        w.get("pid")
        for ld in j.get("loaders") or []
        for w in ld.get("workers") or []
        if isinstance(w, dict) and w.get("state") != "gone"
    }
    # A pipeline's own worker processes (torchdata nodes) are the job's too.
    current |= {
        w.get("pid")
        for ld in j.get("loaders") or []
        for w in ld.get("pipeline_workers") or []
        if isinstance(w, dict) and w.get("kind") == "process"
    }
    out = [f"  stacks ({reason}{when}{ended}; {more} for all of them):"]
    for e in st["summary"]:
        if not isinstance(e, dict):
            continue
        gone = e.get("pid") is not None and e.get("pid") not in current
        out.append(f"    {e.get('line')}{' (exited since)' if gone else ''}")
    return out


def _hold_s() -> str:
    try:
        from dlwatch.diagnose import HOLD_ON_S
    except ImportError:
        return "a few"
    return f"{HOLD_ON_S:g}"


def _role(ld: dict) -> str:
    """ "eval, " / "train, " where the framework iterating the loader says (its
    ``role``), with the framework's name; "" where none does."""
    role, fw = ld.get("role"), ld.get("framework")
    if not role:
        # Accelerate prepares loaders without saying which is which: its name
        # at least (a QA run told the eval loader only by its batch size).
        return f"{fw}, " if fw else ""
    return f"{role} ({fw}), " if fw else f"{role}, "


def _built_as(ld: dict) -> str:
    """ ", StreamingDataLoader": the DataLoader subclass the script builds, where
    it is one (a plain DataLoader, or a library's own loader, adds nothing)."""
    cls = ld.get("loader_class")
    return f", {cls}" if isinstance(cls, str) and cls and ld.get("library") in (None, "torch") else ""


def _loader_lines(ld: dict, job: dict | None = None) -> list[str]:
    batch = batch_word(ld)
    cfg = (
        f"workers {ld['num_workers']}"
        + (f" ({ld['start_method']})" if ld.get("start_method") else "")
        + f", batch {batch}, "
    )
    knobs = ld.get("knobs")
    if ld.get("library") not in (None, "torch", "monai") and isinstance(knobs, dict):
        # A pipeline's own settings, not a DataLoader's (a QA run read
        # "pin_memory off, persistent off" on a torchdata.nodes graph).
        cfg += ", ".join(f"{k}={v}" for k, v in knobs.items()) if knobs else "no settings read"
    elif ld.get("pin_memory") is None:
        cfg += "no DataLoader settings"  # a watched loop: what it iterates is the script's own
    else:
        cfg += (
            f"pin_memory {'on' if ld.get('pin_memory') else 'off'}, "
            f"persistent {'on' if ld.get('persistent_workers') else 'off'}"
            + (f", prefetch {ld['prefetch_factor']}" if ld.get("prefetch_factor") else "")
        )
    wait, step = _num(ld.get("wait_ms_mean"), unit=" ms"), _num(ld.get("step_ms_mean"), unit=" ms")
    start = _num(ld.get("epoch_start_ms_last"), "{:.0f}", " ms")
    if num(ld.get("epoch_start_ms_last")) is None:
        start = epoch_start_missing(ld)
    what = f"{ld.get('dataset') or '?'}{_built_as(ld)}"
    lines = [
        f"  loader {ld['id']} ({_role(ld)}{ld.get('kind', 'map')}, {what}): {cfg}",
        f"    data wait {_pct(ld.get('data_wait_fraction'))}   {ld.get('batches_per_s', 0):.1f} batches/s   "
        f"wait {wait}   step {step}   epoch {ld.get('epoch')}   epoch start {start}",
    ]
    span, n = num(ld.get("window_s")), ld.get("window_batches")
    if span is not None and isinstance(n, int):
        lines[-1] += f"   (over {span:.0f} s, {count_of(n, 'batch')})"
    if ld.get("active") is False and num(ld.get("data_wait_fraction")) is not None:
        # The window reaches back to its last batches (at least 5): not the loop's now.
        lines.append("    idle: no iterator now; these figures are from its last batches")
    elif set_aside(ld, (job or {}).get("loaders") or []):
        lines.append(
            f"    set aside: no batch for {num(ld.get('last_batch_age_s')) or 0:.0f} s, its epoch left open, "
            "while the loop takes from another loader; not judged, no part of the loop's wait"
        )
    if num(ld.get("data_wait_fraction")) is None and ld.get("no_batch_reason"):
        lines.append(f"    data wait n/a: {ld['no_batch_reason']}")
    lines.extend(_pipeline_lines(ld))
    q = ld.get("queue", {})
    if q.get("capacity") is not None:
        lines.append(
            f"    prefetch queue: ready {_num(q.get('ready'), '{}')} / in flight "
            f"{_num(q.get('in_flight'), '{}')} / capacity {q.get('capacity')}"
        )
    if ld.get("workers"):
        lines.append(
            "    worker  pid      cpu %  busy %  fetch ms  batches  rss        uss        thr  state"
        )
        lines.extend(_worker_line(w) for w in ld["workers"])
    return lines + _hang_lines(ld)


def _hang_lines(ld: dict) -> list[str]:
    """A stall and the workers that died (docs/hangs.md)."""
    from dlwatch.diagnose.hang import death_line, stall_line

    out = []
    stall = stall_line(ld)
    if stall:
        out.append(f"    {stall}")
    out.extend(f"    {death_line(d)}" for d in ld.get("worker_deaths") or [] if isinstance(d, dict))
    if ld.get("last_error"):
        out.append(f"    the loader raised {_short(str(ld['last_error']), 160)}")
    return out


def _sampled_loader_lines(ld: dict, job: dict) -> list[str]:
    """A loader of an attached job: shares of samples with their ± and count."""
    nw = ld.get("num_workers") or 0
    sm = f" ({ld['start_method']})" if ld.get("start_method") else ""
    it = f"{ld['iterator']} iterator, " if ld.get("iterator") else ""
    pm = num(ld.get("data_wait_pm"))
    pm_text = "" if pm is None else f" ± {pm * 100:.1f}"
    sampling = job.get("sampling") or {}
    span = num(sampling.get("span_s"))
    rate = num(sampling.get("rate_hz"))
    lines = [
        f"  loader ({it}sampled): workers {nw}{sm}, pin_memory {'on' if ld.get('pin_memory') else 'off'}",
        f"    data wait {_pct(ld.get('data_wait_fraction'))}{pm_text} "
        f"({ld.get('data_wait_samples', 0)} samples of the training thread"
        + (f" over {span:.1f} s" if span is not None else "")
        + (f", {rate:.0f} Hz" if rate is not None else "")
        + ", 95 % interval)",
        f"    batches/s, wait/step ms, epoch, prefetch queue, per-batch worker times: {NOT_SAMPLED}",
    ]
    if ld.get("workers"):
        lines.append("    worker  pid      cpu %  busy %          rss        uss        thr  state")
        for w in ld["workers"]:
            busy, wpm = num(w.get("busy_fraction")), num(w.get("busy_pm"))
            busy_text = "n/a" if busy is None else f"{busy * 100:.0f} ± {(wpm or 0) * 100:.0f}"
            lines.append(
                f"    {w['id']:<6}  {w['pid']:<7}  {_num(w.get('cpu_percent'), '{:5.0f}')}  {busy_text:<14}  "
                f"{human_bytes(w.get('rss_bytes')):<9}  {human_bytes(w.get('uss_bytes')):<9}  "
                f"{_num(w.get('threads'), '{}'):<3}  {w.get('state', '')}"
                + (f"  ({w['error']})" if w.get("error") else "")
            )
    return lines


def _worker_line(w: dict) -> str:
    busy = num(w.get("busy_fraction"))
    busy_pct = _num(None if busy is None else busy * 100, "{:6.0f}")
    return (
        f"    {w['id']:<6}  {w['pid']:<7}  {_num(w.get('cpu_percent'), '{:5.0f}')}  {busy_pct}  "
        f"{_num(w.get('fetch_ms_mean'), '{:8.1f}')}  {w.get('batches', 0):<7}  "
        f"{human_bytes(w.get('rss_bytes')):<9}  {human_bytes(w.get('uss_bytes')):<9}  "
        f"{_num(w.get('threads'), '{}'):<3}  {w.get('state', '')}"
        + (f"  ({w['error']})" if w.get("error") else "")
    )


def _pipeline_lines(ld: dict) -> list[str]:
    """What feeds the loop, when it is not a DataLoader on the training
    thread: the library's knobs, a feeder thread's own figures, its workers
    (threads or processes) with their CPU."""
    out = []
    knobs = ld.get("knobs")
    if isinstance(knobs, dict) and knobs:
        said = ", ".join(f"{k}={v}" for k, v in knobs.items())
        out.append(f"    {ld.get('library') or 'pipeline'}: {said}")
    cons, fd = ld.get("consumer"), ld.get("feeder")
    if isinstance(fd, dict):
        fw = num(fd.get("wait_fraction"))
        own = f"waits {_pct(fw)} of its time" if fw is not None else "has no figure yet"
        if ld.get("loop_role") == "stage":
            out.append(
                f"    its own next() {own.replace('waits', 'waited')} (inside loader {ld.get('nested_in')}'s)"
            )
        elif isinstance(cons, dict):
            out.append(
                f"    fed by thread '{fd.get('thread')}' through a {cons.get('via') or 'queue'}: the wait "
                f"above is the loop's (thread '{cons.get('thread')}'); the feeder {own}"
            )
        else:
            out.append(f"    feeder thread '{fd.get('thread')}' {own} (its figure, not the loop's)")
    pw = pipeline_workers_line(ld)
    if pw is not None:
        out.append(f"    {pw}")
    return out
