"""The verify cost curve r(N) = (target forward over N tree nodes) / (one ordinary decode step), measured
inside the real SGLang server on this CPU (the test stand-in's kernels) beside the reference engine's.

    python -m bench.sglang_cpu_verify_cost --dtype float32 --markdown bench/results/sglang_cpu/verify-cost-fp32.md

Harness: one JETSPEC server (harness/sglang_cpu.py) whose only cohort drafts with the head and
verifies fixed trees; for each N the admin key pushes budget N, a few greedy requests run, and the
worker's own counters give the verify seconds per step and the nodes per step at that budget. N = 1 is
budget 0, which runs as an ordinary decode forward (the denominator). Reference engine: the same
target in HF transformers, one forward over N new tokens after a prefix of the prompts' mean length
(reference/verify_cost.py, what adaptive sizing measures at engine start), best of a few runs. The
ratio column is harness r(N) over reference r(N).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.sglang_cpu_compare import generate, server_args
from harness.client import metrics, post
from harness.sglang_cpu import launch

ADMIN_KEY = "verify-cost-bench"
BUDGETS = (0, 2, 4, 8, 16, 32, 64)  # 0: the ordinary decode step, N = 1
POLICY = (
    "cohorts:\n"
    "  - {name: all, min_batch: 1, max_batch: 256, budgets: [0, 2, 4, 8, 16, 32, 64], default: 0, drafter: head, "
    "tree_sizing: fixed}\n"
    "head: {max_budget: 64, max_draft_rounds: 0}\n"
)


COUNTERS = ("jetspec_verify_seconds_total", "jetspec_steps_total", "jetspec_verified_nodes_total")


def counters(url: str) -> dict[tuple[str, str], float]:
    """(metric, budget) -> value for the worker's verify seconds, steps and verified nodes."""
    found = metrics(url)
    out: dict[tuple[str, str], float] = {}
    for name in COUNTERS:
        for labels, value in found.get(name, {}).items():
            key = (name, dict(labels)["budget"])
            out[key] = out.get(key, 0.0) + value
    return out


def push_budget(url: str, budget: int) -> None:
    status, reply = post(
        f"{url}/set_internal_state",
        {"server_args": {"jetspec_policy.ttl_s": 3600, "jetspec_policy.all.budget": budget}},
        {"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    if status != 200 or reply != [True]:
        raise RuntimeError(f"push of budget {budget} refused: {status} {reply}")


def harness_curve(
    model: str, dtype: str, prompts: list[list[int]], max_new: int, log_dir: Path
) -> dict[int, tuple[float, float]]:
    """budget -> (verify ms per step, nodes per step)."""
    policy = log_dir / "verify-cost-policy.yaml"
    policy.parent.mkdir(parents=True, exist_ok=True)
    policy.write_text(POLICY)
    args = server_args("jetspec", model, dtype, 1, 8, 31177) + ["--admin-api-key", ADMIN_KEY]
    server = launch(args, log_dir / "verify-cost.log", {"OMP_NUM_THREADS": "2", "JETSPEC_POLICY": str(policy)})
    try:
        generate(server.url, (prompts[0][:8], {}), 4)  # warm-up: free text (no constraint)
        out = {}
        for budget in BUDGETS:
            push_budget(server.url, budget)
            before = counters(server.url)
            for ids in prompts:
                generate(server.url, (ids, {}), max_new)
            after = counters(server.url)
            d = {name: after.get((name, str(budget)), 0.0) - before.get((name, str(budget)), 0.0) for name in COUNTERS}
            steps = d["jetspec_steps_total"]
            out[budget] = (1000 * d["jetspec_verify_seconds_total"] / steps, d["jetspec_verified_nodes_total"] / steps)
            print(
                f"harness budget {budget}: {out[budget][0]:.1f} ms per verify, {out[budget][1]:.1f} nodes", flush=True
            )
        return out
    finally:
        server.stop()


def reference_curve(model: str, dtype: str, context: int, rounds: int) -> dict[int, float]:
    import torch

    from sglang_jetspec.reference.target import TargetModel
    from sglang_jetspec.reference.verify_cost import NODE_COUNTS, measure_verify_cost

    target = TargetModel(model, {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
    best: dict[int, float] = {}
    for _ in range(rounds):
        cost = measure_verify_cost(target, context=context, repeats=1)
        for n, rel in zip(cost.nodes, cost.relative):
            best[n] = min(best.get(n, float("inf")), 1000 * cost.unit_s * rel)
    return {n: best[n] for n in NODE_COUNTS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--prompts", type=int, default=3, help="HumanEval prompts 100.. per budget")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3, help="reference engine: best of this many rounds")
    p.add_argument("--markdown", type=Path, required=True)
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/sglang-cpu-logs"))
    args = p.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from sglang_jetspec.models.fetch import fetch
    from sglang_jetspec.reference.precision import cpu_model
    from sglang_jetspec.reference.prompts import humaneval_prompts

    model = str(fetch("smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer(t)["input_ids"] for t in humaneval_prompts(range(100, 100 + args.prompts))]
    harness = harness_curve(model, args.dtype, prompts, args.max_new_tokens, args.log_dir)
    context = round(sum(map(len, prompts)) / len(prompts)) + args.max_new_tokens // 2
    torch.set_num_threads(2)
    reference = reference_curve(model, args.dtype, context, args.rounds)

    decode_ms = harness[0][0]
    lines = [
        f"# Verify cost r(N) in real SGLang on CPU vs the reference engine ({cpu_model()}, {args.dtype})",
        "",
        f"`python -m bench.sglang_cpu_verify_cost {' '.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        f"Harness: HumanEval {100}-{100 + args.prompts - 1} x {args.max_new_tokens} tokens per budget, head drafter, "
        f"fixed trees, the worker's verify seconds per step (budget 0 = an ordinary decode forward, N = 1). "
        f"Reference: one HF forward over N new tokens after {context} tokens, best of {args.rounds}. "
        f"torch {torch.__version__}, 2 threads, {time.strftime('%Y-%m-%d %H:%M')}.",
        "",
        "| budget | harness nodes/step | harness ms | harness r "
        "| reference N | reference ms | reference r | harness r / reference r |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for budget, (ms, nodes) in harness.items():
        n = 1 if budget == 0 else budget
        r_h, r_ref = ms / decode_ms, reference[n] / reference[1]
        lines.append(
            f"| {budget} | {nodes:.1f} | {ms:.1f} | {r_h:.2f} "
            f"| {n} | {reference[n]:.1f} | {r_ref:.2f} | {r_h / r_ref:.2f} |"
        )
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text("\n".join(lines) + "\n")
    print(args.markdown.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
