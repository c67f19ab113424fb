"""WebDataset tar shards: read, decode and batched by a webdataset pipeline, optionally inside a DataLoader.

At start the 512 samples are written as 4 tar shards (jpg + cls) to a temp dir.
By default the loop iterates the WebDataset pipeline itself, in its own thread
(--workers unused); with --via-dataloader a DataLoader(batch_size=None,
num_workers=--workers) runs it in forked worker processes, shards split between them.

    python demo/webdataset_shards.py --seconds 10 [--via-dataloader]
    dlwatch run -- python demo/webdataset_shards.py      # then `dlwatch` in another terminal
"""

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
import webdataset as wds
from torch.utils.data import DataLoader


def write_shards(root: str, n_shards: int) -> list[str]:
    urls = []
    per_shard = -(-_common.EPOCH_SAMPLES // n_shards)
    for s in range(n_shards):
        path = os.path.join(root, f"shard-{s:04d}.tar")
        with wds.TarWriter(path) as sink:
            for i in range(s * per_shard, min((s + 1) * per_shard, _common.EPOCH_SAMPLES)):
                jpeg = _common.jpegs()[i % _common.N_IMAGES]
                sink.write({"__key__": f"{i:06d}", "jpg": jpeg, "cls": i % 10})
        urls.append(path)
    return urls


def decode(sample: dict):
    # The key carries the sample's index, so the crop and flip match load_sample(i).
    i = int(sample["__key__"])
    return _common.decode_sample(sample["jpg"], i), int(sample["cls"])


def main() -> None:
    parser = _common.make_parser(
        __doc__, workers_help="DataLoader num_workers with --via-dataloader (unused without it)"
    )
    parser.add_argument(
        "--via-dataloader", action="store_true", help="run the pipeline in DataLoader worker processes"
    )
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="dlwatch-demo-wds-")
    try:
        # At least one shard per worker: webdataset splits by shard, and a worker
        # left without one fails its empty check.
        urls = write_shards(root, max(4, args.workers if args.via_dataloader else 0))

        def pipeline():
            # No .decode(): the jpg bytes go through the same PIL code as every other demo.
            ds = wds.WebDataset(urls, shardshuffle=False).map(decode)
            ds = ds.batched(args.batch_size, collation_fn=_common.collate)
            if not args.via_dataloader:
                return ds
            return DataLoader(
                ds,
                batch_size=None,
                num_workers=args.workers,
                multiprocessing_context="fork" if args.workers else None,
            )

        _common.train(pipeline, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
