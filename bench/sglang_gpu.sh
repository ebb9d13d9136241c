#!/usr/bin/env bash
# Issue 4's GPU run: SGLang 0.5.23 with --speculative-algorithm JETSPEC on SmolLM2 and the shipped head,
# against plain decoding and SGLang's NGRAM (bench/sglang_gpu_compare.py), on the device machine after
# bench/gpu_stage.sh's parts were sent (bench/GPU.md). Writes bench/results/gpu-sglang/<backend>/ and,
# under the device tool, $OUT/gpu-sglang.tgz (server logs included).
#   JETSPEC_SGLANG_BACKENDS   attention backends to run, in order (default "flashinfer triton")
#   JETSPEC_SGLANG_SERVERS    servers per backend (default jetspec,plain,plain+defaults,ngram)
#   JETSPEC_SGLANG_PROMPTS / _TOKENS / _BATCHES   HumanEval prompts, new tokens, concurrencies
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/gpu_env.sh
source bench/gpu_env.sh || exit 2
RESULTS=${JETSPEC_GPU_RESULTS:-bench/results/gpu-sglang}
BACKENDS=${JETSPEC_SGLANG_BACKENDS:-flashinfer triton}
SERVERS=${JETSPEC_SGLANG_SERVERS:-jetspec,plain,plain+defaults,ngram}
PROMPTS=${JETSPEC_SGLANG_PROMPTS:-50}
TOKENS=${JETSPEC_SGLANG_TOKENS:-128}
BATCHES=${JETSPEC_SGLANG_BATCHES:-1 4 16}
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$RESULTS/device.txt"

# The plugin as SGLang's processes load it (entry point, registration, the spec class's methods).
python3 - <<'EOF' || exit 2
from sglang.srt.plugins import load_plugins
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
load_plugins()
print("plugin:", SpeculativeAlgorithm.from_string("JETSPEC"))
EOF

# Servers run in their own sessions; one left by an earlier, killed call would hold GPU memory.
stop_servers() { pkill -f sglang.launch_server; sleep 2; pkill -9 -f sglang.launch_server; true; }
stop_servers
status=0
for backend in $BACKENDS; do
  # shellcheck disable=SC2086
  timeout "${JETSPEC_SGLANG_TIMEOUT:-540}" python3 bench/sglang_gpu_compare.py --model "$SMOLLM2_DIR" --head sglang_jetspec/heads/smollm2-135m-instruct \
    --attention-backend "$backend" --servers "$SERVERS" --prompts "$PROMPTS" --max-new-tokens "$TOKENS" \
    --batch-sizes $BATCHES --out "$RESULTS/$backend" 2>&1 | tee "$RESULTS/$backend.log" || status=1
done
stop_servers
if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-sglang.tgz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"; fi
exit $status
