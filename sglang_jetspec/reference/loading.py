"""Resolve command-line names to loaded objects: a target ("smollm2" or a directory) and a drafter
(--drafter head: a trained or untrained head; --drafter lookup: prompt lookup, no model)."""

from __future__ import annotations

import math
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import torch

from ..core.draft_vocab import load_draft_vocab
from ..core.head_config import HeadConfig, default_tap_layers
from ..core.head_drafter import HeadDrafter
from ..core.head_io import init_head, load_head
from ..core.prompt_lookup import LookupMerge, PromptLookupDrafter
from ..core.suffix_store import SuffixStore, load_draft_corpus
from .engine import Drafter
from .precision import resolve_dtype
from .target import TargetModel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHIPPED_HEADS = Path(__file__).parent.parent / "heads"  # sglang_jetspec/heads


def resolve_target_dir(spec: str) -> Path:
    """`smollm2` (fetched into the cache on first use) or a local HF Llama/Qwen3 checkpoint directory."""
    from ..models.fetch import MODELS, fetch

    if spec in MODELS:
        return fetch(spec)
    path = Path(spec)
    if not path.is_dir():
        raise SystemExit(
            f"--target {spec}: not a directory and not one of {sorted(MODELS)}; "
            "pass a HF checkpoint directory or 'smollm2'"
        )
    return path


def load_target(spec: str, dtype: str = "fp32", device: str = "cpu", attention: str = "sdpa") -> TargetModel:
    """The target in `dtype` ("auto": reference/precision.py picks for this machine); the choice and its
    reason are kept as `target.precision` (name, reason) for report headers."""
    name, reason = resolve_dtype(dtype, device)
    target = TargetModel(resolve_target_dir(spec), dtype=DTYPES[name], device=device, attention=attention)
    target.precision = (name, reason)
    return target


def shipped_head_dir(target_dir: Path) -> Path | None:
    """The committed default head for the target in this checkpoint directory, if one ships with the package."""
    candidate = SHIPPED_HEADS / target_dir.name
    return candidate if (candidate / "config.json").is_file() else None


def untrained_head_config(target: TargetModel, layers: int = 1, block_size: int = 16, taps: int = 4) -> HeadConfig:
    cfg = target.model.config
    return HeadConfig(
        hidden_size=cfg.hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        vocab_size=cfg.vocab_size,
        block_size=block_size,
        target_layer_ids=tuple(default_tap_layers(cfg.num_hidden_layers, taps)),
        mask_token_id=target.tokenizer.pad_token_id or 0,
        rope_theta=target.info.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
        # the target's depth, not max(tap) + 1: a published-layout consumer reads it as the target's
        extra={"num_target_layers": cfg.num_hidden_layers},
    )


def resolve_head_dir(target_dir: Path, head: str | None) -> Path | None:
    """The checkpoint directory --head names: DIR, else the shipped head; None for an untrained head.
    Needs only the target's directory, so a command can check a head before loading the model."""
    if head == "untrained":
        return None
    return Path(head) if head else shipped_head_dir(target_dir)


def load_drafter(target: TargetModel, head: str | None) -> tuple[HeadDrafter, str]:
    """A drafter from --head DIR, else the shipped head, else an untrained head (said so in the label),
    drafting over the head directory's reduced draft vocabulary when it has one."""
    vocab = None
    if head == "untrained":
        model, label = init_head(untrained_head_config(target)), "untrained head (random weights)"
    else:
        head_dir = resolve_head_dir(target.path, head)
        if head_dir is None:
            model, label = (
                init_head(untrained_head_config(target)),
                "untrained head (no trained head ships for this target yet)",
            )
        else:
            model, label = load_head(head_dir, target.info), str(head_dir)
            vocab = load_draft_vocab(head_dir, target.info.vocab_size)
            if vocab is not None:
                label += f" (draft vocabulary {vocab.numel()} of {target.info.vocab_size})"
    model = model.to(device=target.device, dtype=target.dtype)
    return HeadDrafter(model, target.embed_tokens, target.lm_head, vocab), label


class DrafterOptionError(ValueError):
    """Drafter flags that cannot run together; the message names the flag and the fix."""


def check_lookup_options(args: Namespace) -> None:
    if args.lookup_min_ngram > args.lookup_max_ngram:
        raise DrafterOptionError(
            f"--lookup-min-ngram {args.lookup_min_ngram} is above --lookup-max-ngram "
            f"{args.lookup_max_ngram}; lower the first or raise the second"
        )


def check_drafter_options(args: Namespace) -> None:
    """The --drafter choice against the flags of the other drafter; cheap, so commands call it before loading."""
    if args.drafter == "head":
        return
    check_lookup_options(args)
    if args.drafter == "hybrid":  # the head's tree plus prompt lookup: every head flag applies
        return
    if args.head is not None:
        raise DrafterOptionError(f"--head {args.head} is for --drafter head; drop it or use --drafter head")
    if getattr(args, "draft_rounds", 0):  # serve has no --draft-rounds: its policy checks rounds
        raise DrafterOptionError(
            f"--draft-rounds {args.draft_rounds} needs a head; --drafter lookup drafts one chain, use --draft-rounds 0"
        )


def load_corpus(target: TargetModel, head: str | None) -> SuffixStore:
    """The head directory's draft corpus (an empty store when it has none, or for an untrained head):
    the hybrid drafter looks up in it, and in the outputs the engine adds to it as requests finish."""
    head_dir = None if head == "untrained" else resolve_head_dir(target.path, head)
    corpus = load_draft_corpus(head_dir, target.info.vocab_size) if head_dir is not None else None
    return corpus if corpus is not None else SuffixStore()


def lookup_merge(accept: float, args: Namespace, corpus: SuffixStore | None = None) -> LookupMerge:
    """The hybrid drafter's merge of looked-up guesses, at acceptance chance `accept`, with the --lookup-* n-grams;
    with `corpus`, guesses also come from it and from the engine's finished outputs."""
    check_lookup_options(args)
    return LookupMerge(math.log(accept), args.lookup_min_ngram, args.lookup_max_ngram, corpus)


def lookup_drafter(vocab_size: int, args: Namespace) -> PromptLookupDrafter:
    """The prompt-lookup drafter its --lookup-* flags describe (it drafts one chain: run it at tree width 1)."""
    check_lookup_options(args)
    return PromptLookupDrafter(vocab_size, args.lookup_depth, args.lookup_min_ngram, args.lookup_max_ngram)


@dataclass(frozen=True)
class EngineDrafter:
    """What --drafter chose, ready for an EngineConfig: the drafter, its label and the tree width it drafts at."""

    drafter: Drafter
    label: str
    tree_width: int
    lookup: LookupMerge | None = None  # --drafter hybrid: how prompt-lookup guesses join the head's trees


def load_engine_drafter(target: TargetModel, args: Namespace) -> EngineDrafter:
    """--drafter head: the --head head at --tree-width; hybrid: the same with prompt-lookup guesses merged
    into its trees; lookup: prompt lookup alone, one chain (width 1)."""
    check_drafter_options(args)
    if args.drafter == "lookup":
        label = (
            f"prompt lookup (n-grams {args.lookup_min_ngram}-{args.lookup_max_ngram}, "
            f"chains of <= {args.lookup_depth} tokens)"
        )
        return EngineDrafter(lookup_drafter(target.info.vocab_size, args), label, tree_width=1)
    drafter, label = load_drafter(target, args.head)
    if args.drafter == "hybrid":
        accept, stores = args.lookup_accept[0], args.draft_corpus[0] == "head"
        corpus = load_corpus(target, args.head) if stores else None
        looked_up = (
            f"prompt lookup + draft corpus of {corpus.num_tokens} tokens + finished outputs"
            if stores
            else "prompt lookup"
        )
        return EngineDrafter(
            drafter,
            f"{label} + {looked_up} (hybrid, accept {accept:g})",
            args.tree_width,
            lookup_merge(accept, args, corpus),
        )
    return EngineDrafter(drafter, label, args.tree_width)
