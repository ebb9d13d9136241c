"""A reduced draft vocabulary (the FR-Spec idea; EAGLE-3 heads ship a `d2t` map for the same purpose).

The draft's logits cost one lm_head row per vocabulary entry for every drafted depth: on a small
target that matmul is most of the draft pass. Drafting over the V_d tokens the target itself emits
most often keeps nearly every token a tree would have proposed and costs V_d / V of it. It is
lossless whatever V_d: the draft only proposes, the target's verify decides, and acceptance never
reads draft probabilities (drafts are point masses). A token outside the set is simply never
drafted; the verify's bonus token still comes from the full vocabulary.

Stored in the head directory as `draft_vocab.safetensors`: `token_ids` [V_d] int64, target ids in
descending frequency, plus metadata naming the data it was counted on. Read by the reference engine
and the SGLang worker alike (through `HeadDrafter`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

from .head_io import read_head_file_tensor

DRAFT_VOCAB_FILE = "draft_vocab.safetensors"


class DraftVocabError(ValueError):
    """A draft vocabulary that cannot serve this head or target; the message names the file and the fix."""


def rank_tokens(
    sequences: Iterable[Iterable[int]], size: int, vocab_size: int, always: Iterable[int] = ()
) -> torch.Tensor:
    """The `size` most frequent token ids over `sequences` (ties: lower id first), with the ids in
    `always` (end-of-sequence tokens: a draft must be able to propose the end) included first."""
    if not 0 < size <= vocab_size:
        raise DraftVocabError(f"draft vocabulary size {size}: must be within 1..{vocab_size} (the target's vocabulary)")
    counts = Counter(t for seq in sequences for t in seq)
    chosen = list(dict.fromkeys(t for t in always if 0 <= t < vocab_size))
    ranked = sorted((t for t in counts if 0 <= t < vocab_size), key=lambda t: (-counts[t], t))
    seen = set(chosen)
    for token in ranked:
        if len(chosen) >= size:
            break
        if token not in seen:
            chosen.append(token)
            seen.add(token)
    # fewer distinct tokens than `size` in the data: fill with the lowest unused ids (never drafted well, harmless)
    token = 0
    while len(chosen) < size:
        if token not in seen:
            chosen.append(token)
            seen.add(token)
        token += 1
    return torch.tensor(chosen[:size], dtype=torch.long)


def coverage(token_ids: torch.Tensor, sequences: Iterable[Iterable[int]]) -> float:
    """Share of the tokens of `sequences` that the draft vocabulary contains."""
    member = set(token_ids.tolist())
    total = hit = 0
    for seq in sequences:
        for t in seq:
            total += 1
            hit += t in member
    return hit / total if total else 0.0


def save_draft_vocab(head_dir: str | Path, token_ids: torch.Tensor, metadata: dict[str, str]) -> Path:
    path = Path(head_dir) / DRAFT_VOCAB_FILE
    save_file(
        {"token_ids": token_ids.to(torch.long).contiguous()},
        str(path),
        metadata={k: str(v) for k, v in metadata.items()},
    )
    return path


def load_draft_vocab(head_dir: str | Path, vocab_size: int) -> torch.Tensor | None:
    """The head directory's draft vocabulary, or None when it has none (the full vocabulary is drafted)."""
    path = Path(head_dir) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    ids = read_head_file_tensor(path, "token_ids", DraftVocabError, "jetspec draft-vocab")
    if ids.dim() != 1 or ids.numel() == 0 or ids.dtype not in (torch.int32, torch.int64):
        raise DraftVocabError(
            f"{path}: token_ids must be a non-empty 1-D integer tensor, got {tuple(ids.shape)} {ids.dtype}"
        )
    ids = ids.long()
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise DraftVocabError(
            f"{path}: token ids outside the target's vocabulary 0..{vocab_size - 1}; it was built for another "
            "target: rebuild it with `jetspec draft-vocab`"
        )
    if ids.unique().numel() != ids.numel():
        raise DraftVocabError(f"{path}: token_ids repeats ids; rebuild it with `jetspec draft-vocab`")
    return ids
