"""`jetspec generate`: the README's main job, autoregressive and speculative decoding side by side."""

from __future__ import annotations

import sys

from .args import add_drafter_arguments, add_sizing_argument, add_target_arguments, add_tree_arguments


def register(sub) -> None:
    gen = sub.add_parser(
        "generate", help="decode prompts autoregressively and with JETSPEC side by side on the reference engine"
    )
    add_target_arguments(gen)
    gen.set_defaults(dtype="auto")  # the main job shows this machine's best configuration
    add_tree_arguments(gen)
    add_drafter_arguments(gen, default="hybrid")  # the best drafter measured (docs/benchmarks.md)
    add_sizing_argument(gen, default="adaptive")  # ahead of fixed on HumanEval and chat (docs/benchmarks.md)
    gen.add_argument("--prompts", default="humaneval", help="'humaneval' or a JSONL file with prompt/messages per line")
    gen.add_argument("--num-prompts", type=int, default=8)
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--batch-size", type=int, default=1)
    gen.add_argument("--budget", type=int, default=16, help="tree nodes per verify, root included")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--json", help="also write the figures to this JSON file")
    gen.set_defaults(func=_run_generate)


def _run_generate(args) -> int:
    from ..evaluation.generate import run

    try:
        run(args)
    except (
        ValueError
    ) as exc:  # e.g. --draft-rounds with a head that cannot read tree tokens, --drafter lookup with --head
        print(f"jetspec generate: {exc}", file=sys.stderr)
        return 2
    return 0
