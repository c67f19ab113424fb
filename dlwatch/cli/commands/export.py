"""``dlwatch export``: the collector, headless, serving ``/metrics`` to Prometheus."""

from __future__ import annotations

import ipaddress
import signal
import sys
import threading

from dlwatch import rundir
from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, dir_problem, fail, number

NAME = "export"
HELP = "serve every job's figures as Prometheus metrics (/metrics)"
DESCRIPTION = (
    "Run the collector without a display and serve the figures of every job of this user on "
    "this machine at http://ADDR:PORT/metrics in the Prometheus text format: data-wait and "
    "step seconds, batches, per-worker busy seconds, CPU and memory, prefetch queue, active "
    "hints, GPUs (with dcgm-exporter's labels). Bound to 127.0.0.1 unless --addr says otherwise; "
    "HTTPS with --tls-cert/--tls-key; the endpoint has no "
    "authentication (as node_exporter's and dcgm-exporter's). Needs the 'export' extra: "
    "pip install 'dlwatch[export]'. Stops on SIGINT or SIGTERM."
)
EPILOG = "example: dlwatch export --port 9723   # then scrape 127.0.0.1:9723 every 1-15 s"
ORDER = 50
DEFAULT_PORT = 9723
PROG = "dlwatch export"


def add_arguments(p) -> None:
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: any free port)"
    )
    p.add_argument(
        "--addr",
        default="127.0.0.1",
        metavar="A",
        help="address to listen on (default 127.0.0.1; e.g. 0.0.0.0 or :: for every interface)",
    )
    p.add_argument(
        "--interval",
        type=number,
        default=1.0,
        metavar="S",
        help="seconds between the collector's snapshots, which scrapes read (default 1)",
    )
    p.add_argument(
        "--window",
        type=number,
        default=3.0,
        metavar="S",
        help="seconds dlwatch_data_wait_ratio covers (default 3; the counters need no window: use rate())",
    )
    p.add_argument(
        "--grace",
        type=number,
        default=60.0,
        metavar="S",
        help="seconds an exited job's series stay, so its last counters get scraped (default 60)",
    )
    p.add_argument(
        "--hostname",
        metavar="NAME",
        help="value of the 'host' label (default: each job's own hostname), e.g. the node name "
        "in a Kubernetes DaemonSet",
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS with this PEM certificate (chain); needs --tls-key",
    )
    p.add_argument(
        "--tls-key", metavar="FILE", help="the certificate's PEM private key (may be the same file)"
    )


def run(args) -> int:
    problem = _usage_problem(args)
    if problem:
        return fail(problem, EXIT_USAGE, PROG)
    try:
        from dlwatch.export.prometheus import SnapshotCollector, serve, tls_problem
    except ImportError as e:
        return fail(
            f"the exporter needs prometheus_client ({e}); install it with: pip install 'dlwatch[export]'",
            EXIT_ERROR,
            PROG,
        )
    problem = dir_problem()
    if args.tls_cert and not problem:
        problem = tls_problem(args.tls_cert, args.tls_key)
    if problem:
        return fail(problem, EXIT_ERROR, PROG)
    from dlwatch.collect.monitor import Monitor

    monitor = Monitor(window_s=args.window, interval=args.interval)
    collector = SnapshotCollector(monitor, hostname=args.hostname, grace_s=args.grace)
    try:
        server, _ = serve(collector, args.port, args.addr, tls=(args.tls_cert, args.tls_key))
    except OSError as e:
        monitor.stop()
        where = _hostport(args.addr, args.port)
        return fail(f"cannot listen on {where}: {e.strerror or e}", EXIT_ERROR, PROG)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    monitor.start()
    host, port = server.server_address[:2]
    # One line on stdout, flushed: scripts (and the tests) read the port from it.
    url = f"{'https' if args.tls_cert else 'http'}://{_hostport(host, port)}/metrics"
    print(f"dlwatch export: serving {url} for jobs in {rundir.runtime_dir()}")
    if not _loopback(args.addr):
        print(
            f"{PROG}: listening on {args.addr}: anyone who can reach this port can read the metrics "
            "(there is no authentication)",
            file=sys.stderr,
        )
    sys.stdout.flush()
    try:
        while not stop.wait(0.5):  # a timed wait: the signal handler runs between waits
            pass
    finally:
        server.shutdown()
        server.server_close()
        monitor.stop()
    return EXIT_OK


def _usage_problem(args) -> str | None:
    if not 0 <= args.port <= 65535:
        return f"--port must be 0..65535, not {args.port}"
    if args.interval <= 0:
        return "--interval must be positive"
    if args.window <= 0:
        return "--window must be positive"
    if args.grace < 0:
        return "--grace must be 0 or more"
    if not args.addr.strip():
        return "--addr must not be empty"
    if bool(args.tls_cert) != bool(args.tls_key):
        return "--tls-cert and --tls-key go together"
    return None


def _loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
