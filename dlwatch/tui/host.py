"""Host figures: usable cores (and where the number comes from), CPU load,
free /dev/shm."""

from __future__ import annotations

from rich.text import Text

from dlwatch.tui import fmt
from dlwatch.tui.keyed import set_static
from dlwatch.tui.textline import TextLine


def cores_source(host: dict) -> str:
    # collect reports why (e.g. "cgroup v2 quota 4 cores"); older or partial
    # snapshots do not, and then the logical CPU count is the best hint.
    src = fmt.s(host.get("cores_reason")) or fmt.s(host.get("usable_cores_source"))
    if src:
        return src
    usable, logical = fmt.num(host.get("usable_cores")), fmt.intval(host.get("logical_cpus"))
    if usable is None or logical is None:
        return ""
    if usable < logical:
        return f"affinity/cgroup quota, of {logical} logical"
    return "all logical CPUs"


def host_text(snapshot: dict, pal: fmt.Palette, wide: bool) -> Text:
    host = fmt.d(snapshot.get("host"))
    usable = fmt.num(host.get("usable_cores"))
    load = fmt.num(host.get("load_percent_of_usable"))
    src = cores_source(host)
    t = Text()
    t.append("host ", "bold")
    t.append(f"{usable:g}" if usable is not None else fmt.NA)
    t.append(" usable cores" if wide else " cores")
    if src:
        t.append(f" ({src})", pal.dim)
    t.append(" · load ", pal.dim)
    if load is not None:
        style = pal.bad if load > 100 else (pal.warn if load > 80 else "")
        t.append(fmt.pct100(load), style)
        if wide:
            t.append(" of usable")
            t.append(f" (cpu {fmt.pct100(host.get('cpu_percent'))} of all)", pal.dim)
    else:
        t.append(f"cpu {fmt.pct100(host.get('cpu_percent'))}")
    t.append(" · /dev/shm free ", pal.dim)
    t.append(fmt.size(host.get("shm_free_bytes")))
    nodes = [h for h in fmt.lst(snapshot.get("hosts")) if isinstance(h, dict) and not h.get("local")]
    # The nodes that cannot be read first: in the compact layout's one line,
    # what is wrong is what must not be cut off.
    nodes.sort(key=lambda h: h.get("state") == "ok")
    if nodes and not wide:
        t.append("\n")
        t.append_text(nodes_summary(nodes, pal))
    for line in nodes if wide else ():
        t.append("\n")
        t.append_text(remote_host_text(line, pal))
    return t


def nodes_summary(nodes: list[dict], pal: fmt.Palette) -> Text:
    """The other nodes on one line: how many are read, and each that is not, with why."""
    t = Text()
    ok = sum(1 for h in nodes if h.get("state") == "ok")
    t.append("nodes ", "bold")
    t.append(f"{ok}/{len(nodes)} ok", pal.good if ok == len(nodes) else pal.warn)
    for h in nodes:
        if h.get("state") != "ok":
            t.append(" · ", pal.dim)
            t.append_text(remote_host_text(h, pal))
    return t


def remote_host_text(line: dict, pal: fmt.Palette) -> Text:
    """One node of ``dlwatch --host``: its own cores, load and GPUs, or, when
    it cannot be read, its state and why (ssh's error, on one line)."""
    t = Text()
    t.append(fmt.s(line.get("host"), "?"), "bold")
    state = fmt.s(line.get("state"), "?")
    if state == "connecting":  # not a fault yet: ssh is logging in
        t.append(" connecting…", pal.dim)
        return t
    if state != "ok":
        t.append(f" ✖ {state}", f"bold {pal.bad}")
        reason = fmt.s(line.get("reason"))
        if reason:
            t.append(f": {reason}", pal.bad)
        return t
    figures = fmt.d(line.get("figures"))
    usable = fmt.num(figures.get("usable_cores"))
    t.append(f" {usable:g}" if usable is not None else f" {fmt.NA}")
    t.append(" cores · load ", pal.dim)
    load = fmt.num(figures.get("load_percent_of_usable"))
    t.append(fmt.pct100(load) if load is not None else fmt.pct100(figures.get("cpu_percent")))
    gpus = fmt.lst(line.get("gpus"))
    t.append(f" · {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}", pal.dim)
    t.append(f" · {fmt.count(line.get('jobs'))} jobs", pal.dim)
    return t


class HostLine(TextLine):
    def show(self, snapshot: dict, pal: fmt.Palette, wide: bool) -> None:
        set_static(self, host_text(snapshot, pal, wide))
