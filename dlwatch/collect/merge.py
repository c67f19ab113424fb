"""Several nodes' snapshots as one: the document of ``dlwatch --host``.

Pure: this machine's snapshot and each remote host's newest one (with the
host's state, ``remote.HostStatus``) in, one snapshot out, in the same
contract (``dlwatch.snapshot``), so every view, the recorder and the JSON
read it unchanged. What the merge adds:

- every job carries ``host`` (the name the user gave ``--host``; this
  machine's jobs its hostname), and so does every hint;
- ``hosts``: one line per host: its state, the reason when it is not "ok"
  (ssh's error in one line), and its own host figures and GPUs: each node's
  cores and load are its own, not this machine's (``host`` stays this
  machine's, as the schema says);
- ``runs``: the ranks of one run grouped across hosts (torchrun's run id),
  the group's data wait as its slowest rank's (the rank every other one
  waits for at the collective) beside the mean, and that rank and its host;
- ``straggler-rank`` judged over every rank of a run on every host
  (``CrossHostJudge``); each node's own verdict, which saw only its ranks,
  is dropped.

A host that is not "ok" keeps its last jobs, marked "unreachable" with the
host's reason: the run's ranks stay listed, with figures that say they are
old, and nothing is judged on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dlwatch.collect.remote import HostStatus
from dlwatch.snapshot import SCHEMA_VERSION, as_dict, as_int, as_str, is_live, num, records, run_key

# Each node judged this one on its own ranks; the merge judges it again on all.
CROSS_HOST_RULES = frozenset({"straggler-rank"})
# Synthetic PIDs of the cross-host pass start here: ten digits, beyond any
# Linux pid_max (2^22), so none can be mistaken for a real one and text that
# names one can be mapped back exactly.
PID_BASE = 1_000_000_000


def merge(
    local: Mapping[str, Any] | None,
    local_host: str,
    remotes: Iterable[HostStatus],
    now: float,
) -> dict[str, Any]:
    """The merged snapshot (hints: every host's own, less ``CROSS_HOST_RULES``;
    ``CrossHostJudge`` adds those)."""
    base = dict(local) if local is not None else empty_local(now)
    jobs = [dict(j, host=local_host) for j in records(base.get("jobs"))]
    hints = [
        dict(h, host=local_host) for h in records(base.get("hints")) if h.get("id") not in CROSS_HOST_RULES
    ]
    errors = [e for e in base.get("errors") or () if isinstance(e, str)]
    hosts = [
        {
            "host": local_host,
            "state": "ok" if not base.get("runtime_dir_error") else "error",
            "reason": base.get("runtime_dir_error"),
            "local": True,
            "figures": as_dict(base.get("host")),
            "gpu_status": base.get("gpu_status"),
            "gpus": records(base.get("gpus")),
            "jobs": len(jobs),
        }
    ]
    for st in remotes:
        snap = st.snapshot or {}
        ok = st.state == "ok"
        theirs = [dict(j, host=st.host) for j in records(snap.get("jobs"))]
        if not ok:
            why = f"host {st.host} {st.state}" + (f": {st.reason}" if st.reason else "")
            theirs = [dict(j, state="unreachable", state_reason=why) if is_live(j) else j for j in theirs]
        else:
            hints += [
                dict(h, host=st.host)
                for h in records(snap.get("hints"))
                if h.get("id") not in CROSS_HOST_RULES
            ]
            errors += [f"{st.host}: {e}" for e in snap.get("errors") or () if isinstance(e, str)]
        jobs += theirs
        line = st.as_dict()
        line.update(
            local=False,
            figures=as_dict(snap.get("host")),
            gpu_status=snap.get("gpu_status"),
            gpus=records(snap.get("gpus")),
            jobs=len(theirs),
        )
        if ok and snap.get("runtime_dir_error"):
            line["reason"] = as_str(snap.get("runtime_dir_error"))
        hosts.append(line)
    out = dict(base)
    out.update(jobs=jobs, hints=hints, hosts=hosts, runs=run_groups(jobs))
    if errors:
        out["errors"] = errors
    return out


def empty_local(now: float) -> dict[str, Any]:
    """This machine's part when it has none (its runtime directory cannot be
    used): no jobs, no figures, as ``dlwatch snapshot --json`` says it."""
    return {
        "schema_version": SCHEMA_VERSION,
        "time": now,
        "window_s": None,
        "host": {"logical_cpus": None, "usable_cores": None, "cpu_percent": None, "shm_free_bytes": None},
        "gpu_status": "n/a: not sampled",
        "gpus": [],
        "jobs": [],
        "hints": [],
    }


def primary_loader(job: Mapping[str, Any]) -> dict[str, Any]:
    """The loader a rank trains from: the one moving the most batches."""
    loaders = records(job.get("loaders"))
    if not loaders:
        return {}
    return max(loaders, key=lambda ld: num(ld.get("batches_per_s")) or -1.0)


def run_groups(jobs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ranks of each run (same run id and world size > 1), across hosts:
    who is in it and its data wait, the slowest rank's beside the mean."""
    groups: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for j in jobs:
        key, ws = run_key(j), as_int(j.get("world_size"))
        if key is not None and ws is not None and ws > 1:
            groups.setdefault((*key, ws), []).append(j)
    out = []
    for (run_id, master, ws), members in groups.items():
        live = [j for j in members if is_live(j)]
        waits = [(num(primary_loader(j).get("data_wait_fraction")), j) for j in live]
        known = [(w, j) for w, j in waits if w is not None]
        slow = max(known, key=lambda x: x[0]) if known else None
        out.append(
            {
                "run_id": run_id,
                "master": master or None,
                "world_size": ws,
                "ranks_seen": len(members),
                "ranks_live": len(live),
                "hosts": sorted({as_str(j.get("host")) for j in members}),
                "data_wait_fraction_max": None if slow is None else round(slow[0], 4),
                "data_wait_fraction_mean": round(sum(w for w, _ in known) / len(known), 4) if known else None,
                "slowest": None
                if slow is None
                else {
                    "rank": as_int(slow[1].get("rank")),
                    "host": slow[1].get("host"),
                    "pid": slow[1].get("pid"),
                },
            }
        )
    return out


class CrossHostJudge:
    """``straggler-rank`` over the ranks of every host.

    The rules key a job by its PID, and two nodes may well run the same PIDs
    (containers number from 1): the pass sees each job under a synthetic PID,
    and its hints are mapped back to the job's own PID and host.
    ``judge``: a diagnosis of a snapshot (``Diagnoser().update`` for the live
    stream, with its hysteresis; ``evaluate`` for one measurement)."""

    def __init__(self, judge: Callable[[Mapping[str, Any]], list[dict[str, Any]]]) -> None:
        self.judge = judge
        self._ids: dict[tuple[str, int], int] = {}

    def _synthetic(self, host: str, pid: int) -> int:
        key = (host, pid)
        if key not in self._ids:
            self._ids[key] = PID_BASE + len(self._ids)
        return self._ids[key]

    def hints(self, merged: Mapping[str, Any]) -> list[dict[str, Any]]:
        back: dict[int, tuple[str, int]] = {}
        jobs = []
        for j in records(merged.get("jobs")):
            pid = as_int(j.get("pid"))
            if pid is None or not isinstance(j.get("run_id"), str):
                continue
            host = as_str(j.get("host"))
            fake = self._synthetic(host, pid)
            back[fake] = (host, pid)
            jobs.append(dict(j, pid=fake))
        if not jobs:
            return []
        doc = dict(merged, jobs=jobs, hints=[])
        return [_mapped(h, back) for h in self.judge(doc) if h.get("id") in CROSS_HOST_RULES]


def _mapped(h: dict[str, Any], back: Mapping[int, tuple[str, int]]) -> dict[str, Any]:
    out = _map_pids(h, back)
    fake = as_int(h.get("job_pid"))
    if fake is not None and fake in back:
        out["host"], out["job_pid"] = back[fake]
    return out


def _map_pids(v: Any, back: Mapping[int, tuple[str, int]]) -> Any:
    if isinstance(v, dict):
        return {k: _map_pids(x, back) for k, x in v.items()}
    if isinstance(v, list):
        return [_map_pids(x, back) for x in v]
    if isinstance(v, int) and not isinstance(v, bool) and v in back:
        return back[v][1]
    if isinstance(v, str) and str(PID_BASE)[:1] in v:
        for fake, (_, pid) in back.items():
            v = v.replace(str(fake), str(pid))
    return v
