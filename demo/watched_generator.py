"""A plain Python generator of batches, decoded in the loop's own thread, wrapped in dlwatch.watch().

No DataLoader: the generator loads and collates each batch when the loop asks
for it, so all of its time is the loop's wait. It is endless (it cycles over the
512 samples), as such generators usually are, so the whole run is one epoch.
When dlwatch is importable (and has watch()), the loop iterates
dlwatch.watch(gen, name="generator"); otherwise the bare generator.
There are no workers (--workers is unused).

    python demo/watched_generator.py --seconds 10
    dlwatch run -- python demo/watched_generator.py      # then `dlwatch` in another terminal
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common


def batches(batch_size: int):
    # One generator for the whole run: dlwatch.watch() counts an iterator's life as
    # one epoch, so a fresh generator per epoch would show up as a new loader each time.
    while True:
        for start in range(0, _common.EPOCH_SAMPLES, batch_size):
            stop = min(start + batch_size, _common.EPOCH_SAMPLES)
            yield _common.collate([_common.load_sample(i) for i in range(start, stop)])


def main() -> None:
    args = _common.make_parser(
        __doc__, workers_help="unused: the generator runs in the loop's thread"
    ).parse_args()
    _common.jpegs()
    try:
        # Imported here, not at the top: the demo runs without dlwatch, and an older
        # dlwatch has no watch().
        import dlwatch

        watch = dlwatch.watch
    except (ImportError, AttributeError):
        watch = None
        print("dlwatch.watch() not available: iterating the bare generator", file=sys.stderr)

    def generator():
        gen = batches(args.batch_size)
        return watch(gen, name="generator") if watch is not None else gen

    _common.train(generator, args)


if __name__ == "__main__":
    main()
