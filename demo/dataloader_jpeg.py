"""The control case: a torch DataLoader over a map-style JPEG dataset, iterated by the loop itself.

Workers: --workers sets DataLoader(num_workers=...) (forked processes; 0 loads in the loop's thread).

    python demo/dataloader_jpeg.py --seconds 10
    dlwatch run -- python demo/dataloader_jpeg.py      # then `dlwatch` in another terminal
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from torch.utils.data import DataLoader


def main() -> None:
    args = _common.make_parser(__doc__, workers_help="DataLoader num_workers (forked processes)").parse_args()
    _common.jpegs()  # built before the fork, so the workers inherit them

    def loader() -> DataLoader:
        return DataLoader(
            _common.JpegDataset(),
            batch_size=args.batch_size,
            num_workers=args.workers,
            collate_fn=_common.collate,
            multiprocessing_context="fork" if args.workers > 0 else None,
        )

    _common.train(loader, args)


if __name__ == "__main__":
    main()
