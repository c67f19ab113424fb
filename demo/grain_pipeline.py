"""A grain pipeline: MapDataset.source(indices).map(decode) -> to_iter_dataset(threads) -> batch().

The loop iterates the grain IterDataset, one iter() per epoch of 512 samples.
Workers: --workers sets ReadOptions(num_threads=...), the threads that decode;
with --mp the pipeline also runs in --workers processes (mp_prefetch).

    python demo/grain_pipeline.py --seconds 10 [--mp]
    dlwatch run -- python demo/grain_pipeline.py      # then `dlwatch` in another terminal
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
import grain


def main() -> None:
    parser = _common.make_parser(
        __doc__, workers_help="grain ReadOptions num_threads (and processes with --mp)"
    )
    parser.add_argument("--mp", action="store_true", help="also run it in --workers processes (mp_prefetch)")
    parser.add_argument("--prefetch", type=int, default=16, help="ReadOptions prefetch_buffer_size (samples)")
    args = parser.parse_args()
    _common.jpegs()

    def dataset() -> grain.IterDataset:
        # Top-level functions throughout: mp_prefetch pickles the pipeline into spawned workers.
        ds = grain.MapDataset.source(range(_common.EPOCH_SAMPLES))
        if args.mp:
            # mp_prefetch starts its processes (spawn: seconds each) per iterator, so
            # with --mp the loop runs one endless epoch (a repeated dataset) instead.
            ds = ds.repeat()
        ds = ds.map(_common.load_sample)
        ds = ds.to_iter_dataset(
            grain.ReadOptions(num_threads=args.workers, prefetch_buffer_size=args.prefetch)
        )
        # grain's own batching (it stacks the (image, label) pairs exactly as _common.stack
        # does), not a batch_fn: inside mp_prefetch's workers only the built-in one writes
        # the batch to shared memory. With a custom batch_fn each 2.4 MB batch is pickled
        # through a pipe, and closing the iterator mid-epoch then hangs 25 s per worker
        # (a worker's queue feeder blocks on the pipe until grain kills it).
        # Batches stay numpy until they reach the loop's process.
        ds = ds.batch(args.batch_size)
        if args.mp:
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=args.workers))
        return ds.map(_common.to_torch)

    _common.train(dataset, args)


if __name__ == "__main__":
    main()
