"""The list of jobs of ``dlwatch ls --json`` (and the MCP server's
``list_jobs``): who each job is, without process, host or GPU figures."""

from __future__ import annotations

from typing import Any

from dlwatch import rundir
from dlwatch.collect.monitor import Monitor

SCHEMA_VERSION = 1


def list_jobs(directory: str | None = None) -> dict[str, Any]:
    """``{"schema_version", "runtime_dir", "jobs": [...]}``: one row per job
    socket in ``directory`` (default this user's runtime directory), read in
    about 0.2 s; ``runtime_dir_error`` when the directory cannot be used."""
    # Identity only: no process, host or GPU figures, no diagnosis.
    m = Monitor(directory=directory, gpu=False, procs=False, host=False, diagnoser=False)
    try:
        snap = m.sample_now(settle_s=0.2)
    finally:
        m.stop()
    jobs = [
        {
            "pid": j["pid"],
            "rank": j["rank"],
            "local_rank": j["local_rank"],
            "world_size": j["world_size"],
            "run_id": j.get("run_id"),
            "cmdline": j["cmdline"],
            "loaders": len(j["loaders"]),
            "age_s": j.get("age_s"),
            "state": j.get("state"),
        }
        for j in snap["jobs"]
    ]
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "runtime_dir": directory or rundir.runtime_dir(),
        "jobs": jobs,
    }
    if snap.get("runtime_dir_error"):
        doc["runtime_dir_error"] = snap["runtime_dir_error"]
    return doc
