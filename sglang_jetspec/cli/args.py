"""Argument helpers shared by the `jetspec` subcommands: flag groups and argparse types.

Imports no subcommand module, so every subcommand (cli/*.py) can build on it.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Callable

from policies.schema import DEFAULT_LOOKUP_ACCEPT, TREE_SIZINGS

from ..reference.precision import DTYPE_CHOICES


def comma_list(
    convert: Callable[[str], object], allowed: Callable[[object], bool], what: str, example: str
) -> Callable[[str], list]:
    """An argparse type for `a,b,c`: each part converted by `convert` and checked by `allowed`."""

    def parse(text: str) -> list:
        values = []
        for part in (p.strip() for p in text.split(",")):
            try:
                value = convert(part)
            except ValueError:
                value = None
            if value is None or not allowed(value):
                raise argparse.ArgumentTypeError(f"{part!r}: each item must be {what}; write e.g. {example}")
            values.append(value)
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"{text!r} repeats a value; list each once, e.g. {example}")
        return values

    return parse


corpus_list = comma_list(str, lambda v: v in ("head", "none"), "head or none", "head,none")
probability_list = comma_list(float, lambda v: 0 < v < 1, "a probability strictly between 0 and 1", "0.5,0.7")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= 1")
    return value


def run_of(module: str) -> Callable[[argparse.Namespace], int]:
    """A subcommand's `func`: `module`'s `run(args)` (relative to sglang_jetspec), imported when the command
    runs, so building the parser (`--help`) loads none of the heavy code behind it."""

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(module, "sglang_jetspec").run(args)

    return run


def device_name(text: str) -> str:
    """--device: `auto` is cuda when torch sees a GPU, else cpu. argparse converts a default only once the
    command line is parsed, so `--help` never loads torch for it."""
    if text != "auto":
        return text
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """--target/--head/--dtype/--device/--attention, shared by every command that runs the reference engine."""
    parser.add_argument("--target", default="smollm2", help="'smollm2' or a local HF Llama/Qwen3 checkpoint directory")
    parser.add_argument(
        "--head", help="head directory (default: the shipped head for the target; 'untrained' for random weights)"
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="fp32",
        help="target and head dtype; auto: bf16 on a GPU or a CPU with AMX-BF16 / AVX512-BF16, else fp32 "
        "(reference/precision.py; the choice and its reason are printed)",
    )
    parser.add_argument(
        "--device", default="auto", type=device_name, help="torch device (default auto: cuda when visible, else cpu)"
    )
    parser.add_argument(
        "--attention",
        choices=["sdpa", "triton"],
        default="sdpa",
        help="target attention: PyTorch SDPA with the engine's mask, or the Triton masked-attention kernel "
        "(reference/triton_attention.py; for CUDA devices, or CPU under TRITON_INTERPRET=1)",
    )


def add_lookup_arguments(parser: argparse.ArgumentParser) -> None:
    """The prompt-lookup drafter's n-gram flags (sglang_jetspec/core/prompt_lookup.py)."""
    parser.add_argument(
        "--lookup-min-ngram", type=positive_int, default=1, help="shortest suffix n-gram the lookup drafter matches"
    )
    parser.add_argument("--lookup-max-ngram", type=positive_int, default=4, help="longest suffix n-gram tried first")
    parser.add_argument(
        "--lookup-depth", type=positive_int, default=15, help="longest chain the lookup drafter proposes"
    )
    parser.add_argument(
        "--lookup-accept",
        type=probability_list,
        default=[DEFAULT_LOOKUP_ACCEPT],
        help="hybrid drafter: calibrated chance that a looked-up token is accepted given its parent was; "
        "it scores the guess against the head's candidates (bench/replay take a list, one hybrid per value)",
    )
    parser.add_argument(
        "--draft-corpus",
        type=corpus_list,
        default=["head"],
        help="hybrid drafter: head (default): also look continuations up in the head directory's draft corpus "
        "(text the target wrote, draft_corpus.safetensors, from `jetspec draft-corpus`) and in the outputs "
        "of requests already finished; none: the request's own tokens only (bench/replay take a list, "
        "e.g. head,none: one hybrid per value; serve and generate use the first)",
    )


def add_drafter_arguments(parser: argparse.ArgumentParser, default: str = "head") -> None:
    """--drafter and the lookup flags, for the commands that run one drafter (serve, generate)."""
    parser.add_argument(
        "--drafter",
        choices=["head", "hybrid", "lookup"],
        default=default,
        help=f"(default {default}) head: the draft head from --head, trees of --tree-width; hybrid: the same "
        "trees with the prompt-lookup guess merged in (scored by --lookup-accept); lookup: prompt lookup "
        "alone, no model, one chain copied from the request's own tokens (tree width 1; pays on copy-heavy text)",
    )
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


ACCEPTANCE_RULES = ("match", "residual", "draw")
ACCEPTANCE_HELP = (
    "lossless rule for sampled requests; draw: the head's children are drawn from its "
    "distribution and accepted against it (core/drawn_children.py)"
)
acceptance_list = comma_list(
    str, lambda v: v in ACCEPTANCE_RULES, f"one of {', '.join(ACCEPTANCE_RULES)}", "match,draw"
)


def add_tree_arguments(parser: argparse.ArgumentParser, rounds: str | None = "one", acceptances: str = "one") -> None:
    """Tree flags. --draft-rounds takes one value (rounds="one"), a list, one jetspec method each
    (rounds="several": bench, replay, gap), or is absent (None: serve, where the policy sets rounds per cohort).
    --acceptance takes one rule, or (acceptances="several": bench, replay) a list, each speculative method
    run once per rule."""
    parser.add_argument("--tree-width", type=int, default=8, help="top-K candidates per depth")
    parser.add_argument("--fanout", choices=["uniform", "top2gap"], default="uniform")
    if acceptances == "several":
        parser.add_argument(
            "--acceptance",
            type=acceptance_list,
            default=["match"],
            help=ACCEPTANCE_HELP + "; comma-separated, e.g. match,draw: each method once per rule "
            "(other than match, labelled method+rule)",
        )
    else:
        parser.add_argument("--acceptance", choices=ACCEPTANCE_RULES, default="match", help=ACCEPTANCE_HELP)
    rounds_help = (
        "tree-causal draft rounds after the marginal tree: each re-drafts every node's children conditioned on its "
        "real path and rebuilds the tree within the same budget (needs a head trained with --reveal prefix; 0 = off)"
    )
    if rounds == "several":
        parser.add_argument(
            "--draft-rounds",
            type=draft_rounds_list,
            default=[0],
            help=rounds_help
            + "; comma-separated, e.g. 0,1,2: the jetspec method once per value (jetspec, jetspec-r1, ...)",
        )
    elif rounds == "one":
        parser.add_argument("--draft-rounds", type=draft_rounds_value, default=0, help=rounds_help)


SIZING_HELP = (
    "fixed: verify the whole tree of --budget nodes; adaptive: each step verifies only the nodes whose "
    "draft probability pays for their share of the verify pass, by the target's verify cost measured on this "
    "machine at start-up and refined by every verify pass after it (core/tree_sizing.py; down to the roots alone, "
    "an ordinary decoding step), and the draft "
    "head sits out steps while it does not pay (prompt lookup still proposes)"
)
sizing_list = comma_list(str, lambda v: v in TREE_SIZINGS, f"one of {', '.join(TREE_SIZINGS)}", ",".join(TREE_SIZINGS))


def add_sizing_argument(parser: argparse.ArgumentParser, several: bool = False, default: str = "fixed") -> None:
    """--tree-sizing: one value, or (several=True: bench) a list, each speculative method run once per value."""
    if several:
        parser.add_argument(
            "--tree-sizing",
            type=sizing_list,
            default=[default],
            help=SIZING_HELP + "; comma-separated, e.g. fixed,adaptive: each method once per value "
            "(adaptive ones labelled +adaptive)",
        )
    else:
        parser.add_argument(
            "--tree-sizing", choices=TREE_SIZINGS, default=default, help=f"(default {default}) " + SIZING_HELP
        )
