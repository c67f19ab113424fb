"""The training scripts of bench/streaming_check.py: litdata and Mosaic streaming.

    python bench/streaming_jobs.py litdata|mosaic [--streaming-loader] [demo/ arguments]

demo/'s 512 JPEG samples are written with the library's own writer into a temp
dir, read back by the library's StreamingDataset (subclassed to decode, as the
libraries' docs show for transforms) and trained on with demo/_common.py's
loop, whose own meter times each next(). Nothing here imports dlwatch. The
datasets are defined at the top: litdata starts its workers with spawn, which
imports this file again in each of them.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo"))

import _common  # noqa: E402


def sample(i: int) -> dict:
    """Sample i as written: its index, its JPEG's bytes, its label."""
    return {"index": i, "jpeg": _common.jpegs()[i % _common.N_IMAGES], "label": i % 10}


class Decoding:
    """Put before a library's StreamingDataset: its samples, decoded."""

    def __getitem__(self, index):
        s = super().__getitem__(index)
        return _common.decode_sample(s["jpeg"], int(s["index"])), int(s["label"])


try:
    import litdata
except ImportError:
    litdata = None
else:

    class LitdataDecoded(Decoding, litdata.StreamingDataset):
        pass


try:
    import streaming
except ImportError:
    streaming = None
else:

    class MosaicDecoded(Decoding, streaming.StreamingDataset):
        pass


def with_litdata(args, root: str):
    out = os.path.join(root, "optimized")
    inputs = list(range(_common.EPOCH_SAMPLES))
    litdata.optimize(fn=sample, inputs=inputs, output_dir=out, chunk_bytes="4MB", num_workers=1)
    ds = LitdataDecoded(out, shuffle=True)
    return lambda: litdata.StreamingDataLoader(
        ds, batch_size=args.batch_size, num_workers=args.workers, collate_fn=_common.collate
    )


def with_mosaic(args, root: str):
    from torch.utils.data import DataLoader

    remote = os.path.join(root, "remote")
    columns = {"index": "int", "jpeg": "bytes", "label": "int"}
    with streaming.MDSWriter(out=remote, columns=columns, size_limit="4mb") as writer:
        for i in range(_common.EPOCH_SAMPLES):
            writer.write(sample(i))
    ds = MosaicDecoded(
        remote=remote, local=os.path.join(root, "cache"), shuffle=True, batch_size=args.batch_size
    )
    make = streaming.StreamingDataLoader if args.streaming_loader else DataLoader
    return lambda: make(ds, batch_size=args.batch_size, num_workers=args.workers, collate_fn=_common.collate)


def main() -> None:
    parser = _common.make_parser(__doc__)
    parser.add_argument("library", choices=["litdata", "mosaic"])
    parser.add_argument("--streaming-loader", action="store_true", help="Mosaic's StreamingDataLoader")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="dlwatch-streaming-")
    try:
        loader = (with_litdata if args.library == "litdata" else with_mosaic)(args, root)
        _common.train(loader, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
