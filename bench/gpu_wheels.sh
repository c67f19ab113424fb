#!/usr/bin/env bash
# Wheels the GPU image lacks, fetched here (the device machine reaches no
# package index) into .whl/ for `run`'s carry (git ignores the folder, so
# name it: carry [".whl"]). The image runs Python 3.12 with torch, numpy,
# psutil, nvidia-ml-py, pytest and Pillow; the pipeline checks also need
# torchdata (nodes), Grain and MONAI, and `dlwatch stacks`/the TUI need
# py-spy and textual. About 28 MB, under the carry's 64 MiB.
#
#   bash bench/gpu_wheels.sh            # then, on the device, gpu_session.sh installs them
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.whl
mkdir -p "$dest"
pip=${PIP:-.venv/bin/pip}
plat=(--only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$dest")
# With their dependencies: none of these pulls torch.
"$pip" download -q "${plat[@]}" grain textual py-spy
# Without: both depend on torch (the image's CUDA build must stay), and MONAI's
# only other requirement is numpy.
"$pip" download -q "${plat[@]}" --no-deps torchdata==0.11.0 monai
du -sh "$dest"
