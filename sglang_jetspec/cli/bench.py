"""The `jetspec bench` command line: its arguments, checked at parse time so every error names its flag.

Kept free of torch so building the `jetspec` parser stays fast; the runs themselves are in sglang_jetspec/evaluation/.
"""

from __future__ import annotations

import argparse

from .args import (
    add_lookup_arguments,
    add_sizing_argument,
    add_target_arguments,
    add_tree_arguments,
    comma_list,
    positive_int,
    run_of,
)

METHODS = ("jetspec", "dflash", "chain", "lookup", "hybrid")


budget_list = comma_list(
    int, lambda v: v >= 1, "an integer >= 1 (tree nodes incl. the root; autoregressive is always measured)", "4,8,16"
)
batch_size_list = comma_list(int, lambda v: v >= 1, "an integer >= 1", "1,4")
temperature_list = comma_list(float, lambda v: v >= 0, "a number >= 0 (0 = greedy)", "0,1")
method_list = comma_list(str, lambda v: v in METHODS, f"one of {', '.join(METHODS)}", ",".join(METHODS))


def prompt_range(text: str) -> slice:
    """`start:stop` (either may be empty) -> a slice over the prompt list."""
    start, sep, stop = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        bounds = [int(v) if v.strip() else None for v in (start, stop)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write start:stop, e.g. 0:164 or 100:") from None
    if any(v is not None and v < 0 for v in bounds):
        raise argparse.ArgumentTypeError(f"{text!r}: indices must be >= 0")
    return slice(*bounds)


def _drafting_arguments(p) -> None:
    """Flags shared by `bench` and `replay`: target, tree, heads, prompts, grid, lookup settings, outputs."""
    add_target_arguments(p)
    add_tree_arguments(p, rounds="several", acceptances="several")
    p.add_argument(
        "--dflash-head", help="bidirectional head directory (config causal_head false), needed by the dflash method"
    )
    p.add_argument("--prompts", default="humaneval", help="'humaneval' or a JSONL file with prompt/messages per line")
    p.add_argument("--prompt-range", type=prompt_range, help="start:stop of the prompts to use (default: all)")
    p.add_argument(
        "--budgets",
        type=budget_list,
        default=[4, 8, 16, 32, 64, 128, 256],
        help="tree budgets, comma-separated (autoregressive is always measured)",
    )
    p.add_argument(
        "--methods", type=method_list, default=list(METHODS), help=f"comma-separated, from {','.join(METHODS)}"
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--seed", type=int, default=0, help="request i samples with seed + i")
    p.add_argument(
        "--threads",
        type=positive_int,
        help="torch CPU threads (default: torch's choice); on a busy shared CPU, fewer threads than cores "
        "avoids stalls",
    )
    add_lookup_arguments(p)
    p.add_argument("--json", required=True, help="write the header and every cell's record here")
    p.add_argument("--markdown", help="also write a markdown report here")
    p.add_argument("--plot", help="also write a PNG of the results vs budget here")


def register_gap(sub) -> None:
    p = sub.add_parser(
        "gap",
        help="the paper's rank-1 branch gap (draft minus target log-prob) and accept length per "
        "--draft-rounds and budget, greedy, on the reference engine",
    )
    add_target_arguments(p)
    add_tree_arguments(p, rounds="several")
    p.add_argument("--prompts", default="humaneval", help="'humaneval' or a JSONL file with prompt/messages per line")
    p.add_argument("--prompt-range", type=prompt_range, help="start:stop of the prompts to use (default: all)")
    p.add_argument("--budgets", type=budget_list, default=[16, 64, 256], help="tree budgets, comma-separated")
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--max-new-tokens", type=positive_int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", required=True, help="write the header, every cell's summary and the raw gaps here")
    p.add_argument("--markdown", help="also write a markdown table here")
    p.add_argument("--plot", help="also write a PNG of the gap distributions (empirical CDFs) here")
    p.set_defaults(func=run_of(".evaluation.gap"))


def register(sub) -> None:
    p = sub.add_parser(
        "bench", help="speedup and accept length of every drafting method over budgets, batch sizes and temperatures"
    )
    _drafting_arguments(p)
    p.add_argument("--batch-sizes", type=batch_size_list, default=[1, 4])
    p.add_argument(
        "--temperatures",
        type=temperature_list,
        default=[0.0, 1.0],
        help="0 = greedy; sampled requests get per-request seeds",
    )
    add_sizing_argument(p, several=True)
    p.set_defaults(
        func=run_of(".evaluation.run"), dtype="auto"
    )  # timings in this machine's best dtype unless --dtype says otherwise


def register_replay(sub) -> None:
    p = sub.add_parser(
        "replay",
        help="greedy accept length of every drafting method at every budget, replayed "
        "from one autoregressive run per prompt (no verify passes; exact up to float rounding)",
    )
    _drafting_arguments(p)
    p.add_argument("--ar-batch-size", type=positive_int, default=8, help="batch size of the autoregressive run")
    p.set_defaults(func=run_of(".evaluation.replay"))
