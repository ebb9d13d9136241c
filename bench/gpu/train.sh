#!/usr/bin/env bash
# Issue 18's GPU training run, one device call: regenerate a large data set with the target on the GPU
# (transformers generate in padded batches), then train two heads side by side on it within a deadline:
#   A  1 layer, fine-tuned from the shipped head (same draft cost on CPU, more data and steps)
#   B  2 layers from scratch (more capacity, a dearer draft)
# Stage first (here): JETSPEC_STAGE_REQUIREMENTS="bench/gpu/engine_requirements.txt bench/gpu/bench_requirements.txt" bench/gpu/stage.sh,
# send .stage/p00 with bench/gpu/receive.sh, then run this with .stage/p01 carried (bench/GPU.md).
# Both heads, their training records and the log come back under $OUT; pick one by replay on CPU.
# A step trains its sequences in one padded head pass (Trainer._batch_rows), so the GPU is not left
# waiting on one small pass per sequence.
set -euo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
DEVICE=${JETSPEC_GPU_DEVICE:-cuda}                        # cpu: a smoke run of this script
DEADLINE_S=${JETSPEC_GPU_DEADLINE_S:-450}                 # the whole script, from its start
PROMPT_SETS=${JETSPEC_GPU_PROMPT_SETS:-default,code-mix,chat}
CODE_PROMPTS=${JETSPEC_GPU_CODE_PROMPTS:-3000}            # --prompt-count (code-mix; the chat set has ~2100 templates)
MAX_NEW=${JETSPEC_GPU_MAX_NEW_TOKENS:-128}
REGEN_BATCH=${JETSPEC_GPU_REGEN_BATCH:-512}
RESULTS=${OUT:-bench/out/gpu-train}
export JETSPEC_CACHE_DIR=${JETSPEC_CACHE_DIR:-/tmp/jetspec-cache} TQDM_MININTERVAL=30 PYTHONUNBUFFERED=1
mkdir -p "$RESULTS"

if [ "$DEVICE" = cuda ]; then
  # shellcheck source=bench/gpu/env.sh
  source bench/gpu/env.sh || exit 2
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  TARGET=$SMOLLM2_DIR
  # the trainer's fp32 matrix products (the lm_head over 49,152 tokens dominates) on TF32 tensor cores
  export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1
else
  TARGET=${JETSPEC_GPU_TARGET:-smollm2}
fi
elapsed() { echo $(( $(date +%s) - START )); }

DATA=(--target "$TARGET" --device "$DEVICE" --prompt-set "$PROMPT_SETS" --prompt-count "$CODE_PROMPTS" --sampled-share 1
      --max-new-tokens "$MAX_NEW" --regen-dtype bf16 --regen-backend hf-generate --regen-batch-size "$REGEN_BATCH")
python3 -m sglang_jetspec.cli train "${DATA[@]}" --out "$RESULTS/unused" --data-only
echo "gpu_train: data ready after $(elapsed) s"

# what is left, less loading the sequences and the fp32 target before training and the export after it
budget_min=$(python3 -c "print(max(0.5, ($DEADLINE_S - $(elapsed) - 90) / 60))")
TRAIN=(--position-decay 5 --seqs-per-step 16 --blocks-per-seq 32 --eval-every 400 --time-budget-min "$budget_min")
# Two trainers side by side split the cores: each at every core's worth of threads made a step take
# 1.55 s instead of 0.08 s (H100, 16 cores, bench/results/gpu/train-2026-11-26-h100.md).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / 4 > 0 ? $(nproc) / 4 : 1 ))}
python3 -m sglang_jetspec.cli train "${DATA[@]}" "${TRAIN[@]}" --out /tmp/head-a --layers 1 --steps 20000 --lr 1e-3 --warmup-steps 50 \
  --init-head sglang_jetspec/heads/smollm2-135m-instruct > "$RESULTS/train-a.log" 2>&1 &
a=$!
python3 -m sglang_jetspec.cli train "${DATA[@]}" "${TRAIN[@]}" --out /tmp/head-b --layers 2 --steps 20000 --lr 2e-3 --warmup-steps 100 \
  > "$RESULTS/train-b.log" 2>&1 &
b=$!
status=0
wait $a || status=$?
wait $b || status=$?
tail -n 3 "$RESULTS/train-a.log" "$RESULTS/train-b.log"
# one tar per head, in parts under the device tool's 16 MiB a file (a 2-layer head is 16.8 MB)
for head in a b; do
  if [ -f /tmp/head-$head/model.safetensors ]; then
    tar cf - -C /tmp head-$head/config.json head-$head/model.safetensors head-$head/training_record.json \
      | split -b 15M -d - "$RESULTS/head-$head.tar.part-"
  fi
done
echo "gpu_train: done after $(elapsed) s (status $status)"
exit $status
