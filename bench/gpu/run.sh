#!/usr/bin/env bash
# The GPU run of real SGLang with JETSPEC (bench/GPU.md), on the device machine after every part of
# bench/gpu/stage.sh arrived (bench/gpu/receive.sh; the last part may come with this call):
#   1. install the bundle (bench/gpu/env.sh) and import SGLang's server modules on CUDA
#      (tests/sglang_gpu/cuda_import_probe.py: proves the bundle and the stand-in complete);
#   2. bench/gpu/sglang_compare.py in fp32 (plain, JETSPEC) and bf16 (plain, JETSPEC, plain with
#      SGLang's defaults incl. decode CUDA graphs, NGRAM), Triton attention, pytorch sampler, every
#      server started at once and measured alone: greedy identity with margins, tokens/s at batch 1,
#      4 and 16, accept length, worker phases.
# Results: $RESULTS (default /tmp/gpu-sglang) and, under the device tool, $OUT: the markdown tables,
# the probe's JSON, the log and a tarball of everything (server logs included).
#   JETSPEC_GPU_DEADLINE_S  seconds this script may take in all (default 540)
#   JETSPEC_GPU_PROMPTS / _TOKENS / _BATCHES / _THROUGHPUT_PROMPTS   sizes of the comparison
#   JETSPEC_GPU_SERVERS     name@dtype list, measured in this order (later ones are skipped at the deadline)
set -uo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
DEADLINE=${JETSPEC_GPU_DEADLINE_S:-540}
RESULTS=${JETSPEC_GPU_RESULTS:-/tmp/gpu-sglang}
PROMPTS=${JETSPEC_GPU_PROMPTS:-16}
TOKENS=${JETSPEC_GPU_TOKENS:-64}
BATCHES=${JETSPEC_GPU_BATCHES:-1 4 16}
THROUGHPUT_PROMPTS=${JETSPEC_GPU_THROUGHPUT_PROMPTS:-16}
# in order of what matters most: fp32 identity and ratio, then bf16, SGLang's defaults, the phase split, NGRAM
SERVERS=${JETSPEC_GPU_SERVERS:-jetspec@float32,plain@float32,jetspec@bfloat16,plain@bfloat16,plain+defaults@bfloat16,jetspec+phases@bfloat16,ngram@bfloat16}
mkdir -p "$RESULTS"
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
finish() {
  if [ -n "${OUT:-}" ]; then
    cp "$RESULTS"/*.md "$RESULTS"/probe.json "$RESULTS"/run.log "$OUT"/ 2>/dev/null
    tar czf "$OUT/gpu-sglang.tgz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
  fi
}
trap finish EXIT
exec > >(tee -a "$RESULTS/run.log") 2>&1

# The test-only GPU stand-in (tests/sglang_gpu/stub: sgl_kernel, sitecustomize) comes first on the path.
export PYTHONPATH=$PWD/tests/sglang_gpu/stub JETSPEC_SGLANG_GPU_STANDIN=1
# SGLang's own switch: every fused op (norms, activations, rotary) runs its forward_native PyTorch code,
# so nothing of sgl-kernel is called (tests/sglang_gpu/stub/sgl_kernel/__init__.py)
export SGLANG_FORCE_FUSED_OP_BACKEND=torch
# the stand-in has no sglang-kernel distribution whose version SGLang could check
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
# shellcheck source=bench/gpu/env.sh
source bench/gpu/env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$RESULTS/device.txt"
echo "install done after $(( $(date +%s) - START ))s"
python3 tests/sglang_gpu/cuda_import_probe.py > "$RESULTS/probe.json" || exit 2
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('probe failed:', d['failed']) if d['failed'] else print('probe: every server module imports'); sys.exit(1 if d['failed'] else 0)" "$RESULTS/probe.json" || exit 2
python3 - <<'PY' || exit 2
from sglang.srt.plugins import load_plugins
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
load_plugins()
print("plugin:", SpeculativeAlgorithm.from_string("JETSPEC"))
PY

stop_servers() { pkill -f sglang.launch_server; sleep 2; pkill -9 -f sglang.launch_server; true; }
stop_servers
# every server starts at once (their ~70 s start-ups overlap), then each is measured alone and stopped
# shellcheck disable=SC2086
timeout "$(( $(left) - 15 ))" python3 -m bench.gpu.sglang_compare --model "$SMOLLM2_DIR" \
  --head sglang_jetspec/heads/smollm2-135m-instruct --attention-backend triton --servers "$SERVERS" --together \
  --prompts "$PROMPTS" --max-new-tokens "$TOKENS" --throughput-prompts "$THROUGHPUT_PROMPTS" --batch-sizes $BATCHES \
  --deadline-s "$(( $(left) - 25 ))" --server-budget-s 60 --out "$RESULTS/compare"
status=$?
cp "$RESULTS/compare/sglang_gpu_compare.md" "$RESULTS/compare.md" 2>/dev/null
stop_servers
echo "run.sh done after $(( $(date +%s) - START ))s"
exit $status
