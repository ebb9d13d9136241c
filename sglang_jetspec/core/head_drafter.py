"""Turn a draft head into draft distributions for a batch of requests.

Two passes: `propose`, one block [root, MASK x (B-1)] giving per-depth marginals; and
`propose_children`, the tree-causal pass over a drafted tree giving every node the distribution of
its children conditioned on the node's own path (heads trained with revealed tokens only).
The head's context K/V of each request comes from a context source: per-request caches synced from
tapped rows (core.context_cache, the reference engine) or a pool kept per KV slot (core.context_pool,
the SGLang worker).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from .context_cache import CachedContexts
from .head import DraftHead, LayerContext, block_mask, tree_causal_mask
from .lanes import DraftLane
from .packed_linear import PackedWeight, linear
from .tree import DraftTree


class ContextSource(Protocol):
    def padded(self, head: DraftHead, lanes: list) -> tuple[list[LayerContext], torch.Tensor, torch.Tensor]:
        """Per layer the lanes' context K/V [B, H_kv, L, D] right-padded, the valid mask [B, L], lengths [B]."""


class HeadDrafter:
    """One head pass over [root, MASK x (B-1)] per request gives logits for depths 1..B-1.

    With a `draft_vocab` (core/draft_vocab.py: target ids, [V_d]) the logits cover only those tokens:
    column j is token draft_vocab[j]; callers map candidates back with it (tree.top_k_per_depth)."""

    def __init__(
        self,
        head: DraftHead,
        embed_tokens: nn.Module,
        lm_head: nn.Module,
        draft_vocab: torch.Tensor | None = None,
        context: ContextSource | None = None,
    ) -> None:
        self.head = head
        self.context = context if context is not None else CachedContexts()
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.draft_vocab = (
            None if draft_vocab is None else draft_vocab.to(device=head.fc.weight.device, dtype=torch.long)
        )
        # its host copy, made once: a step that maps a grammar's allowed tokens to draft columns reads it
        self.draft_vocab_host = None if self.draft_vocab is None else self.draft_vocab.cpu()
        self._rows: tuple[tuple, torch.Tensor] | None = (
            None  # (key of the lm_head weight it came from, its draft_vocab rows)
        )
        self._packed_rows = PackedWeight()
        # core.draft_graphs.DraftGraphs once the worker has set one up (a GPU with decode graphs): `propose`
        # then replays the step's bucket instead of launching the pass kernel by kernel
        self.graphs = None

    @property
    def max_depth(self) -> int:
        return self.head.config.max_depth

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return self.head.config.target_layer_ids

    @property
    def reads_tree_tokens(self) -> bool:
        """Whether `propose_children` means anything: the head was trained with revealed block tokens."""
        return self.head.config.reads_tree_tokens

    def _draft_rows(self) -> torch.Tensor:
        """The lm_head rows of the draft vocabulary, gathered once per version of the target's weight
        (a weight update that replaces or rewrites it is seen at the next step)."""
        weight = self.lm_head.weight
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device, tuple(weight.shape))
        if self._rows is None or self._rows[0] != key:
            self._rows = (key, weight.index_select(0, self.draft_vocab).contiguous())
        return self._rows[1]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.draft_vocab is None:
            return self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()
        rows = self._draft_rows()
        return linear(hidden.to(rows.dtype), rows, None, self._packed_rows).float()

    @torch.no_grad()
    def propose(self, lanes: list[DraftLane], depth: int) -> torch.Tensor:
        """[B, depth, V] draft logits for depths 1..depth (<= block_size-1); a lane's context is its
        tapped rows (one per committed token but the root). Only the needed rows pay for the lm_head;
        a causal head's rows see only earlier ones, so its block is cut to the depth+1 rows it needs."""
        if self.graphs is not None:
            replayed = self.graphs.propose(lanes, depth)
            if replayed is not None:
                return replayed
        context, valid, lengths = self.context.padded(self.head, lanes)
        roots = torch.tensor([lane.root_token for lane in lanes], device=valid.device)
        return self.block_logits(context, valid, lengths, roots, depth)

    def block_logits(
        self, context: list[LayerContext], valid: torch.Tensor, lengths: torch.Tensor, roots: torch.Tensor, depth: int
    ) -> torch.Tensor:
        """`propose` from device data alone: the contexts (valid mask [B, L]), their lengths [B] and the
        roots [B]; shapes fixed by B, L and `depth` (what a captured draft pass replays)."""
        cfg = self.head.config
        device = valid.device
        size = min(depth + 1, cfg.block_size) if cfg.causal_head else cfg.block_size
        ids = torch.full((len(roots), size), cfg.mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = roots
        positions = lengths.unsqueeze(1) + torch.arange(size, device=device)
        embeds = self.embed_tokens(ids).to(self.head.fc.weight.dtype)
        hidden = self.head(embeds, positions, context, block_mask(valid, size, cfg.causal_head))
        return self._logits(hidden[:, 1 : depth + 1])

    @torch.no_grad()
    def propose_children(self, lanes: list[DraftLane], trees: list[DraftTree]) -> list[torch.Tensor]:
        """Per lane, [N_i, V] logits: row j is the distribution of node j's children given node j's path.

        One head pass over 2N rows per tree (N = the batch's largest tree): node rows hold the node
        tokens at position ctx_len + depth under the ancestor-or-self mask; child slot j holds MASK at
        ctx_len + depth_j + 1 and sees node j's ancestors-or-self. This is the block a prefix-reveal
        head was trained on (path tokens revealed, the next row masked). Only slot rows pay for the lm_head.
        """
        if not self.reads_tree_tokens:
            raise ValueError(
                "propose_children needs a head trained with revealed tokens (config.json dflash_config.draft_reveal; "
                "`jetspec train --reveal prefix`); this head drafts per-depth marginals only"
            )
        cfg = self.head.config
        context, valid, lengths = self.context.padded(self.head, lanes)
        device, n = valid.device, max(t.size for t in trees)
        ids = torch.full((len(lanes), 2 * n), cfg.mask_token_id, dtype=torch.long, device=device)
        depths = torch.zeros(len(lanes), n, dtype=torch.long, device=device)
        ancestors = torch.zeros(len(lanes), n, n, dtype=torch.bool, device=device)
        for b, tree in enumerate(trees):
            ids[b, : tree.size] = tree.tokens.to(device)
            depths[b, : tree.size] = tree.depths.to(device)
            ancestors[b, : tree.size, : tree.size] = tree.ancestor_mask().to(device)
        node_positions = lengths.unsqueeze(1) + depths
        positions = torch.cat([node_positions, node_positions + 1], dim=1)
        embeds = self.embed_tokens(ids).to(self.head.fc.weight.dtype)
        hidden = self.head(embeds, positions, context, tree_causal_mask(valid, ancestors))
        slots = torch.cat([hidden[b, n : n + tree.size] for b, tree in enumerate(trees)])
        return list(self._logits(slots).split([tree.size for tree in trees]))
