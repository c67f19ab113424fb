"""An image-classification input pipeline as people write it, for validating
``dlwatch tune`` (and the hints) on a workload dlwatch did not shape.

An ImageFolder-style dataset of JPEGs (generated on first use: 4 classes x 150
images, 320x240), decoded with PIL, RandomResizedCrop to 224 + horizontal flip
+ normalize (torchvision's train transforms written against PIL: torchvision's
PyPI build does not import beside the CPU torch of the development machine),
a DataLoader, and a loop whose step sleeps 10 ms as a GPU step would leave the
CPU. It knows nothing of dlwatch and prints its own steady-state meter:

    python bench/image_folder_train.py --num-workers 1 --seconds 20
    dlwatch tune -- python bench/image_folder_train.py --num-workers 1 --seconds 600
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import torch
from PIL import Image, ImageDraw
from torch.utils.data import DataLoader, Dataset

DEFAULT_DATA = os.path.join(tempfile.gettempdir(), "dlwatch-imagefolder")


def make_images(
    root: str, classes: int = 4, per_class: int = 150, size: tuple[int, int] = (320, 240)
) -> None:
    rng = random.Random(0)
    w, h = size
    for c in range(classes):
        d = os.path.join(root, f"class{c}")
        os.makedirs(d, exist_ok=True)
        for i in range(per_class):
            path = os.path.join(d, f"{i}.jpg")
            if os.path.exists(path):
                continue
            im = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
            draw = ImageDraw.Draw(im)
            for _ in range(30):
                x, y = rng.randrange(w), rng.randrange(h)
                lo, hi = max(1, 10 * w // 320), max(2, 80 * w // 320)  # 10..80 px at 320 wide
                box = [x, y, x + rng.randrange(lo, hi), y + rng.randrange(lo, hi)]
                draw.ellipse(box, fill=tuple(rng.randrange(256) for _ in range(3)))
            im.save(path, quality=90)


class ImageFolder(Dataset):
    def __init__(self, root: str) -> None:
        self.samples = [
            (os.path.join(root, c, f), i)
            for i, c in enumerate(sorted(os.listdir(root)))
            for f in sorted(os.listdir(os.path.join(root, c)))
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        im = Image.open(path).convert("RGB")
        w, h = im.size
        s = random.uniform(0.3, 1.0)
        cw, ch = int(w * s), int(h * s)
        x0, y0 = random.randrange(w - cw + 1), random.randrange(h - ch + 1)
        im = im.resize((224, 224), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
        if random.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        t = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).view(224, 224, 3).permute(2, 0, 1)
        return (t.float() / 255 - 0.45) / 0.225, label


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=0, help="print the meter and stop after this (0: never)")
    p.add_argument("--data", default=DEFAULT_DATA)
    a = p.parse_args()
    make_images(a.data)
    torch.set_num_threads(1)
    loader = DataLoader(ImageFolder(a.data), batch_size=16, shuffle=True, num_workers=a.num_workers)
    t0 = time.monotonic()
    n, start = 0, None
    while True:
        for _x, _y in loader:
            time.sleep(0.010)  # the accelerator's step
            now = time.monotonic()
            if start is None and now - t0 > 3:
                start, n = now, 0
            n += 1
            if a.seconds and start and now - start > a.seconds:
                print(f"num_workers={a.num_workers} {n / (now - start):.2f} batches/s", flush=True)
                return


if __name__ == "__main__":
    main()
