"""MONAI's ThreadDataLoader: a DataLoader whose batches a background thread pulls into a small buffer.

The loop iterates monai.data.ThreadDataLoader over a map-style JPEG dataset.
Workers: --workers sets the underlying DataLoader's num_workers (forked
processes; 0 decodes in ThreadDataLoader's buffer thread); --buffer-size sets
how many batches that thread keeps ready. Importing monai alone takes seconds.

    python demo/monai_thread.py --seconds 10 [--workers 0]
    dlwatch run -- python demo/monai_thread.py      # then `dlwatch` in another terminal
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from monai.data import ThreadDataLoader


def main() -> None:
    parser = _common.make_parser(__doc__, workers_help="DataLoader num_workers (forked processes)")
    parser.add_argument("--buffer-size", type=int, default=1, help="ThreadDataLoader buffer_size (batches)")
    args = parser.parse_args()
    _common.jpegs()  # built before the fork, so the workers inherit them

    def loader() -> ThreadDataLoader:
        return ThreadDataLoader(
            _common.JpegDataset(),
            batch_size=args.batch_size,
            num_workers=args.workers,
            buffer_size=args.buffer_size,
            collate_fn=_common.collate,
            multiprocessing_context="fork" if args.workers > 0 else None,
        )

    _common.train(loader, args)


if __name__ == "__main__":
    main()
