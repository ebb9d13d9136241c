"""The target's verify cost by node count on this machine, for each kernel setting side by side.

One SmolLM2 forward (and its logits) over N new tokens after a 256-token prefix, best of 3, through
`reference/verify_cost.py` (what adaptive tree sizing measures at engine start), for the fp32 target,
the bf16 target on PyTorch's plain linears, and the bf16 target on oneDNN-packed linears (the
default for bf16 on a CPU, `core/packed_linear.py`). The three rounds interleave so that drift
touches them alike. Prints a markdown table of milliseconds and of cost relative to N = 1.

    python -m bench.verify_cost_table [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse

import torch

from sglang_jetspec.reference.loading import resolve_target_dir
from sglang_jetspec.reference.precision import cpu_model
from sglang_jetspec.reference.target import TargetModel
from sglang_jetspec.reference.verify_cost import NODE_COUNTS, measure_verify_cost

SETTINGS = {
    "fp32": (torch.float32, False),
    "bf16 plain": (torch.bfloat16, False),
    "bf16 packed": (torch.bfloat16, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    directory = resolve_target_dir("smollm2")
    targets = {name: TargetModel(directory, dtype, packed_linears=packed) for name, (dtype, packed) in SETTINGS.items()}
    best: dict[str, dict[int, float]] = {name: {} for name in targets}
    for _ in range(args.rounds):
        for name, target in targets.items():
            cost = measure_verify_cost(target, repeats=1)
            for n, rel in zip(cost.nodes, cost.relative):
                ms = 1000 * cost.unit_s * rel
                best[name][n] = min(best[name].get(n, ms), ms)
    print(f"{cpu_model()}, {args.threads} threads, torch {torch.__version__}; best of {args.rounds} rounds\n")
    print("| target | " + " | ".join(f"N = {n}" for n in NODE_COUNTS) + " |")
    print("|---|" + "---|" * len(NODE_COUNTS))
    for name, ms in best.items():
        print(f"| {name}, ms | " + " | ".join(f"{ms[n]:.1f}" for n in NODE_COUNTS) + " |")
        print(f"| {name}, relative | " + " | ".join(f"{ms[n] / ms[1]:.2f}" for n in NODE_COUNTS) + " |")


if __name__ == "__main__":
    main()
