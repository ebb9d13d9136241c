"""The distillation objective: blocks at anchors, the block-causal training mask, and the losses.

One sequence trains many blocks in one head pass. Block j is [ids[a_j], MASK x (B-1)] at positions
a_j..a_j+B-1; it sees the context rows 0..a_j-1 (the committed tokens but its root), and inside the
block either causally (JetSpec) or fully (DFlash-style baseline); never another block. Row d of a
block is trained towards the target's distribution for token a_j+d (teacher logits at a_j+d-1).

Prefix reveal (tree-causal drafting): a block may hold the TRUE tokens ids[a+1..a+k] in rows 1..k
and MASK after them; only the masked rows are trained, so row k+1 learns the next token given a real
branch, exactly what the tree-causal draft pass asks of a child slot. k = 0 is today's all-mask block.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from .config import LOSSES


def training_mask(anchors: torch.Tensor, block_size: int, context_len: int, causal: bool) -> torch.Tensor:
    """bool [1, 1, nb*B, L + nb*B]: True where a block query may attend (context keys first)."""
    nb = anchors.numel()
    device = anchors.device
    query_block = torch.arange(nb, device=device).repeat_interleave(block_size)  # [nb*B]
    ctx = torch.arange(context_len, device=device).unsqueeze(0) < anchors[query_block].unsqueeze(1)
    same_block = query_block.unsqueeze(1) == query_block.unsqueeze(0)
    if causal:
        within = torch.arange(block_size, device=device).repeat(nb)
        same_block &= within.unsqueeze(0) <= within.unsqueeze(1)
    return torch.cat([ctx, same_block], dim=1)[None, None]


def sample_reveals(
    rng: random.Random, anchors: torch.Tensor, block_size: int, seq_len: int, all_mask_share: float
) -> torch.Tensor:
    """Revealed tokens k per block: 0 with probability `all_mask_share`, else uniform in 1..B-2,
    capped so at least one masked row still has a token to predict (a+k+1 < seq_len)."""
    picks = [0 if rng.random() < all_mask_share else rng.randint(1, block_size - 2) for _ in range(anchors.numel())]
    return torch.minimum(torch.tensor(picks, device=anchors.device), seq_len - 2 - anchors)


def block_inputs(
    ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int, revealed: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block token ids [nb*B] (root, `revealed` true tokens, then masks) and their positions [nb*B]."""
    offsets = torch.arange(block_size, device=ids.device)
    positions = (anchors.unsqueeze(1) + offsets).flatten()
    block_ids = torch.full((anchors.numel(), block_size), mask_token_id, dtype=torch.long, device=ids.device)
    block_ids[:, 0] = ids[anchors]
    if revealed is not None:
        shown = offsets.unsqueeze(0) <= revealed.unsqueeze(1)  # rows 0..k hold real tokens
        block_ids = torch.where(shown, ids[(anchors.unsqueeze(1) + offsets).clamp(max=ids.numel() - 1)], block_ids)
    return block_ids.flatten(), positions


def target_rows(
    anchors: torch.Tensor, block_size: int, seq_len: int, revealed: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For every trained row (a masked depth d > k inside the sequence): its query index, the teacher
    position a+d-1 whose logits are its target, and its distance d-k from the last real token
    (the depth itself when nothing is revealed)."""
    depth = torch.arange(1, block_size, device=anchors.device)
    shown = torch.zeros_like(anchors) if revealed is None else revealed
    teacher_pos = (anchors.unsqueeze(1) + depth - 1).flatten()
    query = (torch.arange(anchors.numel(), device=anchors.device).unsqueeze(1) * block_size + depth).flatten()
    distance = (depth.unsqueeze(0) - shown.unsqueeze(1)).flatten()
    keep = (teacher_pos + 1 < seq_len) & (distance >= 1)  # the token a+d must exist and be masked
    return query[keep], teacher_pos[keep], distance[keep]


def position_weights(depths: torch.Tensor, decay: float | None) -> torch.Tensor:
    """Optional exp(-(d-1)/decay) weights over the distance d from the last real token: early depths
    decide acceptance most."""
    if decay is None:
        return torch.ones_like(depths, dtype=torch.float32)
    return torch.exp(-(depths.float() - 1) / decay)


def distillation_per_row(
    draft_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    kind: str = "forward_kl",
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per row: T^2 * KL(teacher || draft) (or reverse KL, or cross-entropy on labels)."""
    if kind not in LOSSES:
        raise ValueError(f"loss={kind!r}: choose one of {LOSSES}")
    if kind == "sft":
        return F.cross_entropy(draft_logits.float(), labels, reduction="none")
    draft_logp = F.log_softmax(draft_logits.float() / temperature, dim=-1)
    teacher_logp = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if kind == "forward_kl":
        per_row = (teacher_logp.exp() * (teacher_logp - draft_logp)).sum(-1)
    else:
        per_row = (draft_logp.exp() * (draft_logp - teacher_logp)).sum(-1)
    return per_row * temperature**2


def distillation_loss(
    draft_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    kind: str = "forward_kl",
    temperature: float = 1.0,
) -> torch.Tensor:
    """Weighted mean over rows of `distillation_per_row`."""
    return (
        distillation_per_row(draft_logits, teacher_logits, labels, kind, temperature) * weights
    ).sum() / weights.sum()


def per_sequence_mean(values: torch.Tensor, weights: torch.Tensor, sequence: torch.Tensor, count: int) -> torch.Tensor:
    """[count]: the weighted mean of each sequence's rows (row r belongs to sequence `sequence[r]`), so a
    batch of padded sequences weighs each as a batch of one would."""
    total = torch.zeros(count, device=values.device, dtype=values.dtype).index_add(0, sequence, values * weights)
    return total / torch.zeros(count, device=weights.device, dtype=weights.dtype).index_add(0, sequence, weights)
