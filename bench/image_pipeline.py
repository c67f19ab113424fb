"""A timm-style image classification pipeline, run unmodified under dlwatch.

Generated JPEGs on disk, PIL decode, RandomResizedCrop + horizontal flip +
normalize (what torchvision's/timm's train transforms do, written against
PIL because torchvision from PyPI does not import beside this torch build),
a small ResNet-ish CNN trained on the CPU with torch's default intra-op
threads (or on a GPU with --device cuda). It knows nothing of dlwatch; it prints its own throughput meter
(the ground truth a prediction is checked against):

    python bench/image_pipeline.py --num-workers 0 --seconds 20 --json out.json
    dlwatch run -- python bench/image_pipeline.py --num-workers 0
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import tempfile
import time

import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def make_jpegs(root: str, n: int, size: int) -> list[str]:
    os.makedirs(root, exist_ok=True)
    paths = []
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        p = os.path.join(root, f"{i:05d}.jpg")
        if not os.path.exists(p):
            # Smooth noise compresses like a photo, not like white noise.
            small = (torch.rand(3, size // 16, size // 16, generator=g) * 255).to(torch.uint8)
            pixels = bytes(small.permute(1, 2, 0).contiguous().flatten().tolist())
            img = Image.frombytes("RGB", (size // 16, size // 16), pixels)
            img = img.resize((size, size), Image.BICUBIC)
            buf = io.BytesIO()
            img.save(buf, "JPEG", quality=90)
            with open(p, "wb") as f:
                f.write(buf.getvalue())
        paths.append(p)
    return paths


class RandomResizedCrop:
    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> None:
        self.size, self.scale, self.ratio = size, scale, ratio

    def __call__(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        area = w * h
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            ar = math.exp(random.uniform(math.log(self.ratio[0]), math.log(self.ratio[1])))
            cw, ch = round(math.sqrt(target * ar)), round(math.sqrt(target / ar))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = random.randint(0, w - cw), random.randint(0, h - ch)
                return img.resize((self.size, self.size), Image.BILINEAR, box=(x, y, x + cw, y + ch))
        return img.resize((self.size, self.size), Image.BILINEAR)


class JpegFolder(Dataset):
    def __init__(self, paths: list[str], size: int) -> None:
        self.paths, self.crop = paths, RandomResizedCrop(size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        with Image.open(self.paths[i]) as im:
            img = self.crop(im.convert("RGB"))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x = x.view(img.size[1], img.size[0], 3).permute(2, 0, 1).float().div_(255)
        return (x - MEAN) / STD, i % 10


def model() -> nn.Module:
    def block(cin, cout):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
        )

    return nn.Sequential(
        block(3, 32),
        block(32, 64),
        block(64, 128),
        block(128, 128),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--image-size", type=int, default=320)
    p.add_argument("--crop", type=int, default=128)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--skip-seconds", type=float, default=5.0, help="meter starts after this")
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "dlwatch-jpegs"))
    p.add_argument("--json", help="write the meter here")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the model trains on the GPU")
    p.add_argument("--pin-memory", action="store_true")
    a = p.parse_args()
    paths = make_jpegs(a.data, a.images, a.image_size)
    loader = DataLoader(
        JpegFolder(paths, a.crop),
        batch_size=a.batch_size,
        shuffle=True,
        num_workers=a.num_workers,
        drop_last=True,
        persistent_workers=a.num_workers > 0,
        pin_memory=a.pin_memory,
    )
    dev = torch.device(a.device)
    net = model().to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    start = time.perf_counter()
    meter_t = meter_n = None
    n = 0
    while time.perf_counter() - start < a.seconds:
        for x, y in loader:
            x, y = x.to(dev, non_blocking=a.pin_memory), y.to(dev, non_blocking=a.pin_memory)
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += len(y)
            if dev.type == "cuda" and n % (8 * a.batch_size) == 0:
                torch.cuda.synchronize(dev)  # the meter counts finished steps, not queued ones
            now = time.perf_counter()
            if meter_t is None and now - start >= a.skip_seconds:
                meter_t, meter_n = now, n
            if now - start >= a.seconds:
                break
    end = time.perf_counter()
    ips = (n - meter_n) / (end - meter_t) if meter_t else None
    print(f"{ips:.1f} img/s with num_workers={a.num_workers}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"images_per_s": ips, "num_workers": a.num_workers}, f)


if __name__ == "__main__":
    main()
