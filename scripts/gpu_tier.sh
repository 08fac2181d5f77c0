#!/bin/sh
# The GPU tier, run natively on a CUDA machine whose python3 already holds torch, triton, pytest,
# hypothesis, pytest-benchmark, pytest-xdist, pytest-timeout, scipy, matplotlib, jinja2 and
# safetensors (nothing is installed: the checkout runs from PYTHONPATH, and the root conftest loads
# the plugin). Writes everything under $OUT (default reports/out/gpu):
#   $OUT/report/      index.html, report.md, results.json, benchmarks.json, plots/ (links into
#                     its run folder runs/<id>/); $OUT/published/ the same files, plain copies
#   $OUT/history/     the history folder with this run appended (copy the new entry into history/)
#   $OUT/*.log        the console of each step
# First (seconds): the versions, and each Triton kernel compiled and run once on a tiny input
# (scripts/kernel_smoke.py); a stack the kernels do not build on stops the tier there, in one line.
# Usage: OUT=/some/dir sh scripts/gpu_tier.sh [extra pytest args]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-reports/out/gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export CI=true
# the peer sets whose packages the machine's image may already hold (JAX with its CUDA plugin,
# onnxruntime, transformers): their adapters run beside the compiled kernels where the package is
# there and are listed unavailable where it is not, so the first GPU run puts outside rows in the
# matrix too (vLLM's adapters need only the vllm package: they run wherever it is installed)
export INFERENCE_CONFORMANCE_PEERS="${INFERENCE_CONFORMANCE_PEERS:-libs,hf}"
PY=${PYTHON:-python3}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
} > "$OUT/env.log" 2>&1
if ! $PY scripts/kernel_smoke.py --device cuda > "$OUT/kernel_smoke.log" 2>&1; then
    grep -m1 "kernel smoke check FAILED" "$OUT/kernel_smoke.log" || echo "kernel smoke check FAILED: $(tail -n 1 "$OUT/kernel_smoke.log")"
    exit 1
fi
cat "$OUT/kernel_smoke.log"
rm -rf "$OUT/history" && cp -r history "$OUT/history"
# properties and tests: compiled kernels, 4 workers; benchmarks serially; ceilings; history; report
$PY -m inference_conformance.reports --device cuda -n 4 --out "$OUT/report" --history "$OUT/history" "$@" > "$OUT/reports.log" 2>&1
status=$?
# the published names in $OUT/report are links into its run folder: a plain copy for whoever
# collects $OUT and does not follow links
if [ -e "$OUT/report/current" ]; then
    rm -rf "$OUT/published" && cp -rL "$OUT/report/current" "$OUT/published"
fi
tail -n 25 "$OUT/reports.log"
exit $status
