"""A minimal monitor process for fault tests: attach to one job socket and read.

Usage: fault_monitor.py PID SOCKET_PATH

Prints ``live`` once the first window frame has arrived, then keeps reading
until the job hangs up (prints ``ended STATE``). Tests stop it with SIGSTOP or
kill it with SIGKILL mid-stream.
"""

import select
import sys

from dlwatch.collect.jobs import JobConnection


def main() -> int:
    pid, path = int(sys.argv[1]), sys.argv[2]
    c = JobConnection(pid, path)
    if not c.connect():
        print(f"failed {c.state} {c.reason}", flush=True)
        return 1
    announced = False
    while True:
        if c.sock is None:
            print(f"ended {c.state}", flush=True)
            return 0
        select.select([c.sock], [], [], 0.2)
        c.read()
        if c.frames and not announced:
            print("live", flush=True)
            announced = True


if __name__ == "__main__":
    sys.exit(main())
