"""What `jetspec bench`, `replay` and `gap` start from: checked options, the prompts, the target, the
contending drafters, the requests, and the header that records how a run was made."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import transformers

from ..core.head_config import HeadConfigError
from ..core.head_io import read_head_config
from ..core.prompt_lookup import LookupMerge
from ..core.sampling import SamplingParams
from ..models.fetch import sha256_file
from ..reference.engine import Drafter, Request
from ..reference.loading import (
    DrafterOptionError,
    check_lookup_options,
    load_corpus,
    load_drafter,
    load_target,
    lookup_drafter,
    lookup_merge,
)
from ..reference.precision import cpu_model
from ..reference.prompts import HUMANEVAL, PromptError, encode, humaneval_prompts, read_prompt_file, refuse_constraints
from ..reference.target import TargetModel


class BenchError(ValueError):
    """Bench input that cannot be used; the message names the flag and the fix."""


@dataclass(frozen=True)
class Contender:
    """A method ready to run: its drafter, the tree width and the tree-causal rounds it drafts with,
    and for the hybrid drafter how prompt-lookup guesses join the head's trees."""

    method: str
    drafter: Drafter
    tree_width: int
    draft_rounds: int = 0
    lookup: LookupMerge | None = None
    tree_sizing: str = "fixed"
    acceptance: str = "match"


def jetspec_label(rounds: int) -> str:
    return "jetspec" if rounds == 0 else f"jetspec-r{rounds}"


def hybrid_label(accept: float, variants: int, corpus: str, corpora: int) -> str:
    label = "hybrid" if variants == 1 else f"hybrid-a{accept:g}"
    return label if corpora == 1 else f"{label}-{'corpus' if corpus == 'head' else 'own'}"


def _head_is_causal(flag: str, head_dir: str) -> bool:
    try:
        return read_head_config(head_dir).causal_head
    except HeadConfigError as exc:
        raise BenchError(f"{flag} {head_dir}: {exc}") from exc


def check_options(args) -> None:
    """Refuse missing or swapped heads and impossible lookup settings before anything slow is loaded."""
    methods = set(args.methods)
    if "dflash" in methods:
        if not args.dflash_head:
            raise BenchError(
                "--methods includes dflash but --dflash-head is missing: pass a bidirectional (DFlash-style) head "
                "directory, or drop dflash from --methods"
            )
        if _head_is_causal("--dflash-head", args.dflash_head):
            raise BenchError(
                f"--dflash-head {args.dflash_head}: config.json has dflash_config.causal_head true, "
                "a causal (JetSpec) head; dflash needs a bidirectional head (causal_head false). "
                "Pass this head as --head instead"
            )
    # --head unset or 'untrained' means the shipped or a fresh head, both causal
    if (
        methods & {"jetspec", "chain", "hybrid"}
        and args.head not in (None, "untrained")
        and not _head_is_causal("--head", args.head)
    ):
        raise BenchError(
            f"--head {args.head}: config.json has dflash_config.causal_head false, a bidirectional head; "
            "jetspec, chain and hybrid need a causal head. Pass this head as --dflash-head instead"
        )
    if "jetspec" in methods and max(args.draft_rounds) > 0 and not _reads_tree_tokens(args.head):
        raise BenchError(
            f"--draft-rounds {','.join(map(str, args.draft_rounds))} needs a head trained with revealed tokens "
            f"(config.json dflash_config.draft_reveal); --head {args.head or '(shipped head)'} drafts per-depth "
            "marginals only. Train one with `jetspec train --reveal prefix` and pass it as --head, "
            "or use --draft-rounds 0"
        )
    check_lookup_options(args)


def _reads_tree_tokens(head: str | None) -> bool:
    """Unset or 'untrained' means the shipped or a fresh head: neither was trained with revealed tokens."""
    if head in (None, "untrained"):
        return False
    try:
        return read_head_config(head).reads_tree_tokens
    except HeadConfigError as exc:
        raise BenchError(f"--head {head}: {exc}") from exc


def select_prompts(source: str, selection: slice | None) -> tuple[list, range]:
    """Prompt records (raw strings for HumanEval) chosen by --prompt-range, and their indices."""
    if source == HUMANEVAL:
        records: list = humaneval_prompts()
    elif not Path(source).is_file():
        raise BenchError(
            f"--prompts {source}: no such file; pass 'humaneval' or a JSONL file with a prompt or messages field "
            "per line"
        )
    else:
        try:
            records = read_prompt_file(source)
            refuse_constraints(source, records)
        except PromptError as exc:
            raise BenchError(f"--prompts {exc}") from exc
    indices = range(len(records))[selection or slice(None)]
    if not indices:
        raise BenchError(
            f"--prompt-range selects none of the {len(records)} prompts in {source}; "
            f"pick start:stop within 0:{len(records)}"
        )
    return [records[i] for i in indices], indices


def _load_head(target: TargetModel, flag: str, value: str | None) -> tuple[Drafter, str]:
    try:
        return load_drafter(target, value)
    except HeadConfigError as exc:
        raise BenchError(f"{flag} {value}: {exc}") from exc


def load_contenders(args, target: TargetModel) -> tuple[list[Contender], dict[str, str]]:
    """Drafters for the requested methods (each head loaded once) and the label of each head used."""
    labels: dict[str, str] = {}
    head = dflash_head = None
    if {"jetspec", "chain", "hybrid"} & set(args.methods):
        head, labels["head"] = _load_head(target, "--head", args.head)
    if "dflash" in args.methods:
        dflash_head, labels["dflash_head"] = _load_head(target, "--dflash-head", args.dflash_head)
    lookup = lookup_drafter(target.info.vocab_size, args)
    drafting = {"dflash": (dflash_head, args.tree_width), "chain": (head, 1), "lookup": (lookup, 1)}
    contenders = []
    for method in args.methods:
        if method == "jetspec":
            contenders += [Contender(jetspec_label(r), head, args.tree_width, r) for r in args.draft_rounds]
        elif method == "hybrid":
            corpus = load_corpus(target, args.head) if "head" in args.draft_corpus else None
            contenders += [
                Contender(
                    hybrid_label(p, len(args.lookup_accept), c, len(args.draft_corpus)),
                    head,
                    args.tree_width,
                    0,
                    lookup_merge(p, args, corpus if c == "head" else None),
                )
                for c in args.draft_corpus
                for p in args.lookup_accept
            ]
        else:
            contenders.append(Contender(method, *drafting[method]))
    # replay measures fixed trees only (it has no --tree-sizing)
    sizings = getattr(args, "tree_sizing", ["fixed"])
    return [variant(c, sizing, rule) for rule in args.acceptance for sizing in sizings for c in contenders], labels


def variant(contender: Contender, sizing: str, acceptance: str) -> Contender:
    """The contender under a --tree-sizing value and an --acceptance rule; each setting other than
    the default (fixed, match) is appended to the label: method+adaptive+draw."""
    suffix = "".join(f"+{value}" for value, default in ((sizing, "fixed"), (acceptance, "match")) if value != default)
    return replace(contender, method=contender.method + suffix, tree_sizing=sizing, acceptance=acceptance)


def make_requests(prompt_ids: list[list[int]], temperature: float, max_new_tokens: int, seed: int) -> list[Request]:
    """One request per prompt; sampled requests get their own seed so every method sees the same streams."""
    return [
        Request(ids, SamplingParams(temperature=temperature, seed=seed + i, max_new_tokens=max_new_tokens), str(i))
        for i, ids in enumerate(prompt_ids)
    ]


def describe_head(label: str) -> dict:
    """A head's source and the sha256 of each of its files (labels of untrained heads have no files)."""
    path = Path(label)
    if not path.is_dir():
        return {"source": label, "sha256": None}
    return {
        "source": str(path.resolve()),
        "sha256": {f.name: sha256_file(f) for f in sorted(path.iterdir()) if f.is_file()},
    }


def run_header(args, target: TargetModel, head_labels: dict[str, str], indices: range) -> dict:
    machine = {"device": args.device, "cpu": cpu_model(), "threads": torch.get_num_threads()}
    if target.device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(target.device)
    return {
        "machine": machine,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": target.precision[0],
        "dtype_choice": target.precision[1],
        "attention": args.attention,
        "target": str(target.path),
        "heads": {flag: describe_head(label) for flag, label in head_labels.items()},
        "command_line": shlex.join(["jetspec", *args.argv]),
        "prompts": args.prompts,
        "prompt_range": f"{indices.start}:{indices.stop}",
        "max_new_tokens": args.max_new_tokens,
        "tree": {"width": args.tree_width, "fanout": args.fanout, "draft_rounds": args.draft_rounds},
        "acceptance": args.acceptance,
        "seed": args.seed,
        # commands without the lookup method's flags (jetspec gap) record none
        "lookup": {
            "min_ngram": args.lookup_min_ngram,
            "max_ngram": args.lookup_max_ngram,
            "max_depth": args.lookup_depth,
            "accept": args.lookup_accept,
            "draft_corpus": args.draft_corpus,
        }
        if hasattr(args, "lookup_depth")
        else None,
    }


@dataclass
class LoadedRun:
    """What `bench` and `replay` start from: checked options, the target, the encoded prompts, the drafters."""

    target: TargetModel
    prompt_ids: list[list[int]]
    indices: range
    contenders: list[Contender]
    head_labels: dict[str, str]


def load_run(args) -> LoadedRun:
    """Check the options, then load; bad input fails before anything slow is loaded."""
    check_options(args)
    prompts, indices = select_prompts(args.prompts, args.prompt_range)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, args.dtype, args.device, args.attention)
    contenders, head_labels = load_contenders(args, target)
    return LoadedRun(target, [encode(p, target.tokenizer) for p in prompts], indices, contenders, head_labels)


def run_command(name: str, job, args) -> int:
    """Run `jetspec <name>`: 0 on success, 2 with a message naming the flag on bad input."""
    try:
        job(args)
    except (BenchError, DrafterOptionError) as exc:
        print(f"jetspec {name}: {exc}", file=sys.stderr)
        return 2
    return 0
