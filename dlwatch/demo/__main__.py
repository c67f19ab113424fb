"""``python -m dlwatch.demo``: the demo training job (same flags as ``dlwatch.demo.train``)."""

from .train import run_and_exit

if __name__ == "__main__":
    run_and_exit()
