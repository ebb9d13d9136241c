"""Host milliseconds to build a step's marginal trees from the head's top-K: one `tree.build_tree` per
request (the heap, in Python) against `core.marginal_trees` (every lane in one batched pass), by batch
size and budget, side by side in one process. The top-K are the shape the shipped head drafts (15
depths, K = 8) with log-probs from random logits; both builders give the same trees
(tests/test_marginal_trees.py), which this script checks again on every input it times. With
`--guesses`, each lane also brings the hybrid drafter's real lookups (its guesses for a HumanEval
prompt's continuation, as bench.lookup_cost builds them), and the two builders are the per-lane heap
with guesses merged (`tree_from_candidates`, what every step runs today) against `guess_tables` and
`marginal_trees` with them (the device build issue 56 asks for).

    python -m bench.tree_build --guesses --markdown bench/results/sglang_cpu/tree-build-guesses-fp32-zen3.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.sglang_cpu_compare import positive_ints
from sglang_jetspec.core.marginal_trees import guess_tables, marginal_trees
from sglang_jetspec.core.tree import TreeSpec, build_tree, marginal_candidates, top_k_per_depth, tree_from_candidates
from sglang_jetspec.core.tree_drafting import budget_spec
from sglang_jetspec.reference.precision import cpu_model


def _inputs(batch: int, depth: int, k: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, depth, 512, generator=generator) * 3
    tokens, logprobs = top_k_per_depth(logits, k)
    return torch.randint(0, 49152, (batch,), generator=generator), tokens, logprobs


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure(batch: int, budget: int, depth: int, k: int, repeats: int) -> dict:
    spec = TreeSpec(budget=budget, max_depth=min(depth, budget - 1), width=k)
    roots, tokens, logprobs = _inputs(batch, depth, k, seed=batch * 100 + budget)
    root_ids = roots.tolist()

    def per_request():
        return [build_tree(root_ids[b], tokens[b], logprobs[b], spec) for b in range(batch)]

    def batched():
        return marginal_trees(roots, tokens, logprobs, spec).trees()

    for one, other in zip(per_request(), batched()):
        if one.parents.tolist() != other.parents.tolist() or one.tokens.tolist() != other.tokens.tolist():
            raise SystemExit(f"batch {batch} budget {budget}: the builders disagree")
    loop_ms, batch_ms = _median_ms(per_request, repeats), _median_ms(batched, repeats)
    return {"batch": batch, "budget": budget, "per_request_ms": loop_ms, "batched_ms": batch_ms}


def measure_guessed(batch: int, budget: int, depth: int, k: int, repeats: int, guesses: list) -> dict:
    """The same step with each lane's `guesses` merged into its tree: per-lane heaps against one batched
    pass, and how many lanes' trees differ (a device noisy-or may differ from the host's in its last bit,
    which can reorder nodes whose scores tie to it)."""
    spec = budget_spec(depth, budget, k)
    roots, tokens, logprobs = _inputs(batch, depth, k, seed=batch * 100 + budget)
    root_ids, lanes = roots.tolist(), guesses[:batch]

    def per_request():
        marginal = marginal_candidates(tokens, logprobs, spec)
        return [tree_from_candidates(root_ids[b], marginal[b], spec, guesses=lanes[b]) for b in range(batch)]

    def batched():
        return marginal_trees(roots, tokens, logprobs, spec, guess_tables(lanes)).trees()

    differ = sum(
        one.parents.tolist() != other.parents.tolist() or one.tokens.tolist() != other.tokens.tolist()
        for one, other in zip(per_request(), batched())
    )
    tables_ms = _median_ms(lambda: guess_tables(lanes), repeats)
    loop_ms, batch_ms = _median_ms(per_request, repeats), _median_ms(batched, repeats)
    return {
        "batch": batch,
        "budget": budget,
        "per_request_ms": loop_ms,
        "batched_ms": batch_ms,
        "tables_ms": tables_ms,
        "lanes_differ": differ,
    }


def lookup_guesses_for(batch: int, budget: int, depth: int) -> list:
    """The hybrid drafter's guesses of `batch` requests (bench.lookup_cost's contexts and stores)."""
    from bench.lookup_cost import _contexts
    from sglang_jetspec.core.prompt_lookup import batch_lookup_guesses

    contexts, merge = _contexts(batch, 400)
    return batch_lookup_guesses(contexts, budget_spec(depth, budget, width=8), merge)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", default="1,4,16")
    p.add_argument("--budgets", default="8,16,32")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--guesses", action="store_true", help="also time trees with the hybrid drafter's lookups merged")
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    batch_sizes, budgets = positive_ints(args.batch_sizes), positive_ints(args.budgets)
    if not batch_sizes or not budgets:
        p.error("--batch-sizes and --budgets take positive integers separated by commas, e.g. 1,4,16")
    if args.guesses and max(batch_sizes) > 64:
        p.error("--guesses takes batch sizes up to 64 (HumanEval 100-163)")
    torch.set_num_threads(1)
    rows = [measure(batch, budget, depth=15, k=8, repeats=args.repeats) for budget in budgets for batch in batch_sizes]
    guessed = []
    for budget in budgets if args.guesses else []:
        guesses = lookup_guesses_for(max(batch_sizes), budget, depth=15)
        guessed += [measure_guessed(batch, budget, 15, 8, args.repeats, guesses) for batch in batch_sizes]
    lines = [
        f"# Building a step's marginal trees on the host ({cpu_model()}, 1 thread, torch {torch.__version__})",
        "",
        f"`python -m bench.tree_build {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        "Median ms per step over the repeats; 15 depths, K = 8; the two builders' trees checked equal.",
        "",
        "| budget | batch | build_tree per request ms | marginal_trees ms | per request / batched |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['budget']} | {row['batch']} | {row['per_request_ms']:.3f} | {row['batched_ms']:.3f} | "
            f"{row['per_request_ms'] / row['batched_ms']:.2f}x |"
        )
    if guessed:
        lines += [
            "",
            "With each lane's hybrid-drafter guesses merged (real lookups of HumanEval 100+ contexts): the per-lane",
            "heap (`tree_from_candidates`) against `guess_tables` plus `marginal_trees` with them (the tables' own",
            "host ms beside); lanes whose trees differ are counted, not hidden.",
            "",
            "| budget | batch | heap per request ms | guess_tables ms | batched with tables ms | per request / batched "
            "| lanes differing |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in guessed:
            lines.append(
                f"| {row['budget']} | {row['batch']} | {row['per_request_ms']:.3f} | {row['tables_ms']:.3f} | "
                f"{row['batched_ms']:.3f} | {row['per_request_ms'] / row['batched_ms']:.2f}x | {row['lanes_differ']} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
