"""SGLang TARGET_VERIFY tensors for a batch of draft trees (pure PyTorch, no SGLang import).

SGLang verifies a uniform N nodes per request. Request b's tree has at most N nodes; the rest are
padding nodes that no retrieve link reaches, so the tree walk (greedy kernel or the core's
acceptance) can never accept one. Layouts, as `reconstruct_indices_from_tree_mask` and FlashInfer's
custom-mask path read them:

- draft_token [bs*N]: node tokens, node 0 = the root (last committed token, not yet in KV).
- positions [bs*N] int64: seq_len_b + depth (padding nodes at seq_len_b + 1).
- qlen_mask [bs, N, N] bool: row i is True at node i's ancestors and at i (tree part only);
  flattened, it is the QLEN_ONLY layout SGLang's CPU backend (intel_amx) reads.
- full_mask (the FULL layout of FlashInfer / Triton): for every request, N row-major rows of width
  seq_len_b + N: the prefix columns all True, then the qlen row. Concatenated over the batch:
  length sum_b N*(seq_len_b + N).
- retrieve_index [bs, N]: b*N + i.  retrieve_next_token [bs, N]: first child (lowest index),
  retrieve_next_sibling [bs, N]: next sibling by index; -1 for none. Children are in index order,
  which for core trees is sibling-rank order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_jetspec.adapter.attention_backends import MaskLayout
from sglang_jetspec.core.tree import DraftTree, padded_trees


@dataclass
class VerifyTensors:
    draft_token: torch.Tensor
    positions: torch.Tensor
    qlen_mask: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    num_nodes: int  # N, the uniform width per request
    max_depth: int  # deepest tree level in the batch

    def custom_mask(
        self, layout: MaskLayout, seq_lens: list[int], device: torch.device | str | None = None
    ) -> torch.Tensor:
        """The flattened tree mask in the layout the verify attention backend reads
        (attention_backends.tree_mask_layout), built on `device` (default: where qlen_mask is)."""
        if layout == MaskLayout.QLEN_ONLY:
            return self.qlen_mask.to(device).flatten()
        return self.full_mask(seq_lens, device)

    def full_mask(self, seq_lens: list[int], device: torch.device | str | None = None) -> torch.Tensor:
        """Flattened FULL custom mask (prefix columns + tree columns), FlashInfer/Triton layout, built on
        `device` (default: where qlen_mask is). It holds sum_b N*(seq_len_b + N) entries, mostly the
        all-True prefix columns, so only the small [bs, N, N] tree part crosses to the device and is
        scattered into an all-True buffer in one indexed write (no per-request loop)."""
        qlen = self.qlen_mask.to(device) if device is not None else self.qlen_mask
        n = self.num_nodes
        lens = torch.tensor(seq_lens, dtype=torch.long, device=qlen.device)
        widths = lens + n  # row width of each request
        starts = torch.cumsum(n * widths, 0) - n * widths  # offset of each request's first row
        rows = torch.arange(n, device=qlen.device)
        # entry (b, i, j) of the tree part sits at starts_b + i * width_b + seq_len_b + j
        index = (
            starts.view(-1, 1, 1)
            + rows.view(1, -1, 1) * widths.view(-1, 1, 1)
            + lens.view(-1, 1, 1)
            + rows.view(1, 1, -1)
        )
        total = sum(n * (length + n) for length in seq_lens)  # from the host's lengths: no read of the device
        mask = torch.ones(total, dtype=torch.bool, device=qlen.device)
        mask[index.flatten()] = qlen.flatten()
        return mask


def _first_true(table: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last dim, -1 where there is none (argmax returns the first maximum)."""
    return torch.where(table.any(-1), table.to(torch.uint8).argmax(-1), -1)


def build_verify_tensors(trees: list[DraftTree], seq_lens: list[int], num_nodes: int | None = None) -> VerifyTensors:
    """Verify tensors for one tree per request, each padded to `num_nodes` (default: largest tree). Built
    for the whole batch at once: a fixed number of tensor ops whatever the batch size (the ancestor mask
    log2(depth) batched matmuls), not a dozen per request (issue 56)."""
    if len(trees) != len(seq_lens):
        raise ValueError(f"{len(trees)} trees but {len(seq_lens)} seq_lens: pass one per request")
    width = num_nodes if num_nodes is not None else max(t.size for t in trees)
    too_big = [b for b, t in enumerate(trees) if t.size > width]
    if too_big:
        raise ValueError(
            f"trees {too_big} have more than num_nodes={width} nodes: raise num_nodes to the step's budget"
        )
    bs = len(trees)
    tokens, parents, depths = padded_trees(trees, width)  # padding: the root's token, no parent, depth 1
    positions = depths + torch.tensor(seq_lens, dtype=torch.long)[:, None]

    # row i: i itself and its ancestors, the transitive closure of "i or its parent" by repeated squaring
    # (a few batched matmuls, not one pass per level); padding rows see the root, like a depth-1 node
    deepest = max(t.max_depth for t in trees)
    reach = torch.eye(width).repeat(bs, 1, 1)
    reach[:, :, 0] = 1.0
    reach.scatter_(2, parents.clamp(min=0)[..., None], 1.0)
    for _ in range(max(deepest - 1, 0).bit_length()):
        reach = (reach @ reach).clamp_(max=1.0)
    mask = reach.bool()

    # links by index order: a node's first child, and the next node after it with the same parent
    nodes = torch.arange(width)
    is_child = parents[:, None, :] == nodes[None, :, None]  # [bs, parent, node]
    later_sibling = (parents[:, None, :] == parents[:, :, None]) & (nodes[None, :] > nodes[:, None])
    later_sibling &= (parents >= 0)[:, :, None]
    return VerifyTensors(
        draft_token=tokens.flatten(),
        positions=positions.flatten(),
        qlen_mask=mask,
        retrieve_index=torch.arange(bs * width, dtype=torch.long).view(bs, width),
        retrieve_next_token=_first_true(is_child),
        retrieve_next_sibling=_first_true(later_sibling),
        num_nodes=width,
        max_depth=deepest,
    )
