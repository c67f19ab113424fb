"""A torch DataLoader drained by a producer thread into a queue; the loop takes batches from the queue.

What the loop waits on is q.get(), not the DataLoader: a thread named "producer"
iterates the DataLoader (epoch after epoch) and puts each batch into a
queue.Queue(maxsize=--queue-size); an end-of-epoch sentinel closes each epoch.
Workers: --workers sets the DataLoader's num_workers (forked processes).

    python demo/dataloader_thread.py --seconds 10
    dlwatch run -- python demo/dataloader_thread.py      # then `dlwatch` in another terminal
"""

import os
import queue
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from torch.utils.data import DataLoader

_EPOCH_END = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class QueueFed:
    """Batches from a producer thread; each iter() yields one epoch's worth from the queue."""

    def __init__(self, loader: DataLoader, queue_size: int) -> None:
        self.loader = loader
        self.q: queue.Queue = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._produce, name="producer", daemon=True)
        self.thread.start()

    def _put(self, item) -> bool:
        # A bounded wait, so that close() can stop a producer blocked on a full queue.
        while not self._stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def _produce(self) -> None:
        try:
            while True:
                for batch in self.loader:
                    if not self._put(batch):
                        return
                if not self._put(_EPOCH_END):
                    return
        except BaseException as exc:  # handed to the loop, which re-raises it
            self._put(_Failed(exc))

    def __iter__(self):
        while True:
            item = self.q.get()
            if item is _EPOCH_END:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item

    def close(self) -> None:
        self._stop.set()
        self.thread.join()


def main() -> None:
    parser = _common.make_parser(__doc__, workers_help="DataLoader num_workers (forked processes)")
    parser.add_argument("--queue-size", type=int, default=4, help="maxsize of the producer's queue")
    args = parser.parse_args()
    _common.jpegs()  # built before the fork, so the workers inherit them

    def fed() -> QueueFed:
        loader = DataLoader(
            _common.JpegDataset(),
            batch_size=args.batch_size,
            num_workers=args.workers,
            collate_fn=_common.collate,
            multiprocessing_context="fork" if args.workers > 0 else None,
        )
        return QueueFed(loader, args.queue_size)

    _common.train(fed, args)


if __name__ == "__main__":
    main()
