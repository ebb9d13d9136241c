#!/usr/bin/env bash
# Issue 8's GPU run: correctness and timing of the reference engine on one GPU, in one call, with no
# network. Stage first (JETSPEC_STAGE_REQUIREMENTS="bench/gpu/engine_requirements.txt bench/gpu/bench_requirements.txt"
# bench/gpu/stage.sh, here) and send its parts ahead; bench/GPU.md has the exact
# device calls. This call:
#   1. installs the staged wheels and converts SmolLM2 (bench/gpu/env.sh, once per machine);
#   2. checks correctness: fp32 greedy token identity with autoregressive output (SDPA and Triton
#      attention; exit 1 on any difference), bf16 mismatch rate with the target's margin at each divergence;
#   3. times autoregressive vs JETSPEC (shipped head) at budgets 16..256, batch 1/4/16, HumanEval, bf16,
#      per-step phases and c = (T_draft/N)/T_verify included.
# Writes bench/results/gpu/ (device name in every file) and, under the device tool, $OUT/gpu-results.tgz.
# Sizes fit the tool's 10-minute call; raise them with the variables below.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE=${JETSPEC_GPU_DEVICE:-cuda}                     # cpu: a smoke run of this script
CHECK_RANGE=${JETSPEC_GPU_CHECK_RANGE:-0:24}           # HumanEval problems for the correctness checks
TIME_RANGE=${JETSPEC_GPU_TIME_RANGE:-0:16}             # ... and for timing
TOKENS=${JETSPEC_GPU_TOKENS:-64}                       # new tokens per request
BUDGETS=${JETSPEC_GPU_BUDGETS:-16,32,64,128,256}
BATCHES=${JETSPEC_GPU_BATCHES:-1,4,16}
RESULTS=${JETSPEC_GPU_RESULTS:-bench/results/gpu}

if [ "$DEVICE" = cuda ]; then
  # shellcheck source=bench/gpu/env.sh
  source bench/gpu/env.sh || exit 2
fi
mkdir -p "$RESULTS"
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$RESULTS/device.txt"
  ATTENTIONS="sdpa triton"
else
  echo "$DEVICE (smoke run)" | tee "$RESULTS/device.txt"
  ATTENTIONS=sdpa   # Triton compiles for GPUs only (the CPU tests use its interpreter)
fi

check() {  # dtype attention [--strict]
  python3 -m bench.gpu.check --device "$DEVICE" --dtype "$1" --attention "$2" --prompt-range "$CHECK_RANGE" \
    --budgets 16,64,256 --max-new-tokens "$TOKENS" --json "$RESULTS/check-$1-$2.json" --markdown "$RESULTS/check-$1-$2.md" "${@:3}"
}
for attention in $ATTENTIONS; do check fp32 "$attention" --strict; done
for attention in $ATTENTIONS; do check bf16 "$attention"; done

for attention in $ATTENTIONS; do
  python3 -m sglang_jetspec.cli bench --device "$DEVICE" --dtype bf16 --attention "$attention" --methods jetspec \
    --budgets "$BUDGETS" --batch-sizes "$BATCHES" --temperatures 0 --prompts humaneval --prompt-range "$TIME_RANGE" \
    --max-new-tokens "$TOKENS" --json "$RESULTS/bench-bf16-$attention.json" --markdown "$RESULTS/bench-bf16-$attention.md"
done
if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-results.tgz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"; fi
echo "bench/gpu/reference.sh: done; results in $RESULTS"
