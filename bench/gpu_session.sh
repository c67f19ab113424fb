#!/usr/bin/env bash
# The GPU checks, for a session lent a GPU machine (CI never has one), sized
# to the 15 minutes of device time such a session has: two calls, one phase
# each, every figure written to $OUT as it is measured (a call stopped at its
# limit still returns what it had). Runs from the repo root without
# installing: the device image has torch, psutil, nvidia-ml-py, pytest and
# Pillow; nothing here needs textual or py-spy.
#
#   bench/gpu_session.sh 1 [SECONDS]   # ~7 min: the two launch-bound verdicts with the live hint beside
#                                     # them, the hook's overhead on the MLP's loop (paired runs), the pin
#                                     # hint, tune vs plain runs, NVML
#   bench/gpu_session.sh 2 [SECONDS]   # ~5 min: thread-fed pipelines with a CUDA step, the five verdicts
#                                     # (when the budget allows), then pytest -m gpu
#
# SECONDS: the phase's budget (default 420 and 290); a check that no longer
# fits is skipped with a line saying so, so what is still unmeasured on a GPU
# comes first (docs/gpu.md, "Measured on an H100"). With the machine's start (1-2 min)
# the two fit in 15 minutes when phase 2 follows while the machine is warm.
# Rehearse both on a CPU box first: `GPU_CHECK_ARGS=--rehearse bench/gpu_session.sh 1`
# (docs/gpu.md, "Rerunning the GPU checks"). The pipeline checks and the
# nodes PinMemory test need torchdata, Grain and MONAI, which the image lacks:
# `bash bench/gpu_wheels.sh` here, then carry [".whl"]; phase 2 installs them.
set -u
phase=${1:-1}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export DLWATCH_DIR=/tmp/dlwatch-gpu
mkdir -p "$DLWATCH_DIR"
began=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, sys, os; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'python', sys.version.split()[0], 'cores', os.cpu_count())"
} > "$OUT/env$phase.txt" 2>&1
if [ "$phase" = 1 ]; then
  budget=${2:-420}
  python3 bench/gpu_check.py all ${GPU_CHECK_ARGS:-} --only verdicts,overhead,pin,tune,nvml \
    --cases mlp-batch-1,tiny-ops --overhead-job mlp-batch-1 --budget "$budget" --json "$OUT/gpu_check_1.json" \
    > "$OUT/gpu_check_1.txt" 2>&1
  echo "rc=$?" >> "$OUT/gpu_check_1.txt"
else
  budget=${2:-290}
  if [ -d .whl ]; then
    # Only what the image lacks: pip keeps its torch and numpy (no index is reachable there).
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-index --find-links .whl torchdata grain monai textual py-spy \
      >> "$OUT/env$phase.txt" 2>&1 || echo "the carried wheels did not install: pipeline cases will skip" >> "$OUT/env$phase.txt"
  fi
  python3 bench/gpu_check.py all ${GPU_CHECK_ARGS:-} --only pipelines,verdicts --budget "$((budget - 75))" --json "$OUT/gpu_check_2.json" \
    > "$OUT/gpu_check_2.txt" 2>&1
  echo "rc=$?" >> "$OUT/gpu_check_2.txt"
  # The GPU-marked tests (about a minute): NVML figures, memory as nvidia-smi
  # counts it, data wait with and without pin_memory, two verdicts on CUDA.
  left=$((budget - ($(date +%s) - began)))
  timeout "$((left > 30 ? left : 30))" python3 -m pytest -p no:cacheprovider -q -m gpu \
    tests/e2e/test_gpu.py tests/unit/test_collect_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest gpu rc=$?" >> "$OUT/pytest_gpu.txt"
fi
cat "$OUT"/*.txt
