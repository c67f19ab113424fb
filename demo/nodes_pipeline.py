"""A torchdata.nodes graph: sampler -> ParallelMapper(decode) -> Batcher -> Mapper(collate) -> Prefetcher.

The loop iterates a torchdata.nodes.Loader, one iter() per epoch of 512 samples.
Workers: --workers sets ParallelMapper(num_workers=...); --method picks threads
(default) or processes for them. --pin-memory adds a PinMemory node over the
batches (it needs CUDA).

    python demo/nodes_pipeline.py --seconds 10 [--method process]
    dlwatch run -- python demo/nodes_pipeline.py      # then `dlwatch` in another terminal
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
import torch
import torchdata.nodes as tn
from torch.utils.data import SequentialSampler


def main() -> None:
    parser = _common.make_parser(__doc__, workers_help="ParallelMapper num_workers")
    parser.add_argument(
        "--method", choices=["thread", "process"], default="thread", help="ParallelMapper method"
    )
    parser.add_argument("--pin-memory", action="store_true", help="a PinMemory node under the Prefetcher")
    args = parser.parse_args()
    if args.pin_memory and not torch.cuda.is_available():
        parser.error("--pin-memory needs CUDA: a PinMemory node pins batches for a GPU")
    _common.jpegs()  # built before any process worker forks, so they inherit them

    def loader() -> tn.Loader:
        node = tn.SamplerWrapper(SequentialSampler(range(_common.EPOCH_SAMPLES)))
        node = tn.ParallelMapper(
            node, map_fn=_common.load_sample, num_workers=args.workers, method=args.method
        )
        node = tn.Batcher(node, batch_size=args.batch_size, drop_last=False)
        node = tn.Mapper(node, _common.collate)
        if args.pin_memory:
            node = tn.PinMemory(node)
        node = tn.Prefetcher(node, prefetch_factor=2)
        return tn.Loader(node)

    _common.train(loader, args)


if __name__ == "__main__":
    main()
