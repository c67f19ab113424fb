#!/usr/bin/env bash
# GPU-only checks, for a session lent a GPU machine (CI never has one).
# Runs from the repo root without installing (the image has torch, psutil,
# nvidia-ml-py, pytest); writes logs to $OUT (or ./gpu-out).
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export DLWATCH_DIR=/tmp/dlwatch-gpu; rm -rf "$DLWATCH_DIR"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'python', sys.version.split()[0])"
} > "$OUT/env.txt" 2>&1
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -p no:cacheprovider -q tests/e2e/test_gpu.py tests/unit/test_collect_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
  echo "pytest gpu rc=$?" >> "$OUT/pytest_gpu.txt"
  python3 bench/gpu_check.py > "$OUT/gpu_check.txt" 2>&1; echo "rc=$?" >> "$OUT/gpu_check.txt"
  python3 bench/gpu_check.py verdicts --json "$OUT/gpu_verdicts.json" > "$OUT/gpu_verdicts.txt" 2>&1; echo "rc=$?" >> "$OUT/gpu_verdicts.txt"
fi
# The demo scenarios that only mean something with CUDA, watched by `dlwatch snapshot`.
for sc in data-bound enable-pin-memory main-loop-cpu-bound healthy; do
  python3 dlwatch/demo/train.py --scenario "$sc" --device cuda --hook --quiet --duration 30 > "$OUT/demo.log" 2>&1 &
  pid=$!
  sleep 24  # CUDA start-up, then past the diagnosis warm-up
  { echo "=== scenario $sc"; python3 -m dlwatch snapshot --pid "$pid"; } >> "$OUT/snapshots.txt" 2>&1
  python3 -m dlwatch snapshot --json --pid "$pid" > "$OUT/snapshot_$sc.json" 2>&1
  wait "$pid"
done
# Profiler bursts (dlwatch profile) on the two CUDA-only verdicts: a loop of
# thousands of tiny CUDA ops per step (launch-bound) and one of large matmuls
# (gpu-bound). The summaries go in the issue note.
for mode in launch-bound gpu-bound; do
  if [ "$mode" = gpu-bound ]; then extra=--big; else extra="--ops 3000"; fi
  python3 tests/jobs/tiny_ops_job.py --device cuda $extra --duration 60 --out "$OUT/profile_$mode" > "$OUT/profile_$mode.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do [ -e "$OUT/profile_$mode.ready" ] && break; sleep 0.1; done
  sleep 3  # past CUDA warm-up; the busiest loader needs a second of batches
  { echo "=== profile $mode"; python3 -m dlwatch profile --pid "$pid" --steps 20 --out "$OUT"; } >> "$OUT/profiles.txt" 2>&1
  python3 -m dlwatch profile --pid "$pid" --steps 20 --out "$OUT" --json > "$OUT/profile_$mode.json" 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null
done
