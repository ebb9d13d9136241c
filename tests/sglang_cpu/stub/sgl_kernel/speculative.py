"""Cache-location, accept and tree ops of sgl-kernel's CPU build, in plain PyTorch.

Signatures are those of the real ``sgl_kernel/speculative.py`` wrappers (parameter names included:
SGLang calls ``verify_tree_greedy_cpu`` with keywords). Each docstring names the SGLang 0.5.23 call
site and the Triton kernel whose semantics it reproduces. The cache-location ops are vectorised
(one gather or scatter per call); the greedy tree walk loops over requests and tree levels on Python
lists, as the kernel loops over them (a handful of nodes per step).
"""

from __future__ import annotations

import numpy as np
import torch


def _flat(t: torch.Tensor, name: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise RuntimeError(f"sgl_kernel stand-in: {name} must be contiguous")
    return t.view(-1)


def _ragged(req_pool_indices, start_offset, end_offset, pool_len):
    """For windows [start[b], end[b]) of each request's row, laid end to end: the flat index of each
    entry in ``req_to_token`` (row stride ``pool_len``, int64 tensor) and the number of entries.

    Index arithmetic on a few dozen host integers, in numpy: a dozen tiny torch ops cost the scheduler
    about a millisecond a step inside the server, where the kernel this stands in for costs microseconds."""
    start = start_offset.numpy().astype(np.int64)
    lens = np.maximum(end_offset.numpy().astype(np.int64) - start, 0)
    rows = req_pool_indices.numpy().astype(np.int64) * pool_len + start  # flat index of each window's start
    first = np.cumsum(lens) - lens  # where each request's window starts in the packed output
    total = int(lens.sum())
    flat = np.repeat(rows - first, lens) + np.arange(total, dtype=np.int64)
    return torch.from_numpy(flat), total


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, start_offset: torch.Tensor,
                                 end_offset: torch.Tensor, out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """``req_to_token[req_pool_indices[b], start[b]:end[b]] = out_cache_loc[packed window b]``.

    Call site: ``sglang/srt/mem_cache/allocation.py::assign_req_to_token_pool_func``; kernel
    ``assign_req_to_token_pool`` in the same file (windows packed in request order)."""
    flat, total = _ragged(req_pool_indices, start_offset, end_offset, pool_len)
    _flat(req_to_token, "req_to_token")[flat] = out_cache_loc.reshape(-1)[:total].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, start_offset: torch.Tensor,
                                 end_offset: torch.Tensor, out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """``out_cache_loc[packed window b] = req_to_token[req_pool_indices[b], start[b]:end[b]]``.

    Call sites: ``sglang/kernels/ops/speculative/cache_locs.py::assign_extend_cache_locs_func`` and
    ``fill_front_out_cache_loc_func``; kernel ``assign_extend_cache_locs`` in the same file."""
    flat, total = _ragged(req_pool_indices, start_offset, end_offset, pool_len)
    _flat(out_cache_loc, "out_cache_loc")[:total] = _flat(req_to_token, "req_to_token")[flat].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                           seq_lens: torch.Tensor, out_cache_loc: torch.Tensor, pool_len: int,
                                           topk: int, num_steps: int) -> None:
    """``out_cache_loc[b * topk * num_steps + k] = req_to_token[req_pool_indices[b], seq_lens[b] + k]``
    for ``k < topk * num_steps``.

    Call site: ``sglang/kernels/ops/speculative/cache_locs.py::assign_draft_cache_locs_contiguous_func``;
    kernel ``assign_draft_cache_locs_contiguous`` in the same file."""
    width = topk * num_steps
    start = seq_lens.long()
    flat, total = _ragged(req_pool_indices, start, start + width, pool_len)
    _flat(out_cache_loc, "out_cache_loc")[:total] = _flat(req_to_token, "req_to_token")[flat].to(out_cache_loc.dtype)


def fill_accept_out_cache_loc_cpu(accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                                  accept_out_cache_loc: torch.Tensor) -> None:
    """Compact ``out_cache_loc[accept_index]`` over the entries of ``accept_index`` (flattened) that
    are not -1, in order.

    Call site: ``sglang/kernels/ops/speculative/eagle.py::fill_accept_out_cache_loc_func``; kernel
    ``fill_accept_out_cache_loc`` there (destination = number of earlier entries != -1; written only
    when the entry is > -1)."""
    index = accept_index.reshape(-1).long()
    dst = torch.cumsum((index != -1).long(), 0) - 1
    write = index > -1
    _flat(accept_out_cache_loc, "accept_out_cache_loc")[dst[write]] = (
        out_cache_loc.reshape(-1)[index[write]].to(accept_out_cache_loc.dtype))


def fill_bonus_tokens_cpu(accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor,
                          accept_stride: int) -> None:
    """``bonus_tokens[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1]`` (the last
    accepted token of each request).

    Call site: ``sglang/kernels/ops/speculative/eagle.py::fill_bonus_tokens_func``; kernel
    ``fill_bonus_tokens`` there."""
    bs = accept_lens.numel()
    index = accept_stride * torch.arange(bs, device=accept_lens.device) + accept_lens.reshape(-1).long() - 1
    _flat(bonus_tokens, "bonus_tokens")[:bs] = accept_tokens.reshape(-1)[index].to(bonus_tokens.dtype)


def verify_tree_greedy_cpu(predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor,
                           candidates: torch.Tensor, retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                           retrive_next_sibling: torch.Tensor, target_predict: torch.Tensor) -> None:
    """SGLang's greedy tree walk. Per request: start at node 0; at each level look for the child of
    the last accepted node whose candidate token equals the target's prediction at that node
    (children in first-child / next-sibling order); accept it and go on, else stop. Writes
    ``accept_index[b, 0..num]`` (global node ids from ``retrive_index``; other entries are left as
    they are), ``accept_token_num[b] = num`` (accepted drafts, bonus excluded) and
    ``predicts[node] = target_predict[node]`` along the accepted path and at its last node.

    Call site: ``sglang/kernels/ops/speculative/spec_tree.py::verify_tree_greedy_func`` (keywords);
    a port of ``verify_tree_greedy_kernel_triton`` there."""
    bs, n = candidates.shape
    num_speculative_tokens = accept_index.shape[1]
    cand, index = candidates.tolist(), retrive_index.tolist()
    next_token, next_sibling = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()
    accepted = accept_index.tolist()
    counts, predicted = [], {}
    for b in range(bs):
        last = index[b][0]
        accepted[b][0] = last
        num, cur = 0, 0
        for _ in range(1, num_speculative_tokens):
            cur = next_token[b][cur]
            token = target[last]
            while cur != -1 and cand[b][cur] != token:
                cur = next_sibling[b][cur]
            if cur == -1:
                break
            predicted[last] = token
            num += 1
            last = index[b][cur]
            accepted[b][num] = last
        counts.append(num)
        predicted[last] = target[last]
    accept_index.copy_(torch.tensor(accepted, dtype=accept_index.dtype))
    accept_token_num.copy_(torch.tensor(counts, dtype=accept_token_num.dtype).reshape(accept_token_num.shape))
    if predicted:
        where = torch.tensor(list(predicted), dtype=torch.long)
        _flat(predicts, "predicts")[where] = torch.tensor(list(predicted.values()), dtype=predicts.dtype)


def reconstruct_indices_from_tree_mask(tree_mask: torch.Tensor, verified_seq_len: torch.Tensor, positions: torch.Tensor,
                                       retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                                       retrive_next_sibling: torch.Tensor, batch_size: int,
                                       draft_token_num: int) -> None:
    """NGRAM verify metadata from a ``[bs * n * n]`` tree mask (``mask[b, i, j]``: node j is an
    ancestor of node i, or i itself): ``positions = verified_seq_len[b] + number of strict
    ancestors``, ``retrive_index = b * n + i``, ``retrive_next_token`` = first child,
    ``retrive_next_sibling`` = next node with the same parent (-1 for the root / none).

    Call site: ``sglang/kernels/ops/speculative/reconstruct_tree.py::reconstruct_indices_from_tree_mask_func``
    (imported as ``sgl_kernel.speculative.reconstruct_indices_from_tree_mask``); semantics of
    ``_reconstruct_tree_mask_kernel`` in the same file, vectorised over the batch."""
    bs, n = int(batch_size), int(draft_token_num)
    if bs == 0:
        return
    mask = tree_mask.reshape(-1)[: bs * n * n].reshape(bs, n, n).bool()
    node = torch.arange(n, device=mask.device)
    ancestors = mask & (node[None, :] < node[:, None])[None]  # [b, i, j]: j a strict ancestor of i
    depth = ancestors.sum(-1)
    parent = torch.where(ancestors.any(-1), torch.where(ancestors, node, -1).amax(-1), -1)  # [b, i]
    first_child = torch.where(ancestors, node[None, :, None], n).amin(1)  # [b, t]: min i with t an ancestor
    next_token = torch.where(first_child < n, first_child, -1)
    same_parent = (parent[:, :, None] == parent[:, None, :]) & (node[:, None] > node[None, :])[None]  # [b, k, t]
    first_sibling = torch.where(same_parent, node[None, :, None], n).amin(1)
    next_sibling = torch.where((parent >= 0) & (first_sibling < n), first_sibling, -1)

    _flat(positions, "positions")[: bs * n] = (depth + verified_seq_len.reshape(-1)[:bs].long()[:, None]).reshape(-1).to(
        positions.dtype)
    _flat(retrive_index, "retrive_index")[: bs * n] = torch.arange(bs * n, device=mask.device).to(retrive_index.dtype)
    _flat(retrive_next_token, "retrive_next_token")[: bs * n] = next_token.reshape(-1).to(retrive_next_token.dtype)
    _flat(retrive_next_sibling, "retrive_next_sibling")[: bs * n] = next_sibling.reshape(-1).to(
        retrive_next_sibling.dtype)


def _eagle_only(name: str):
    raise NotImplementedError(f"sgl_kernel stand-in: {name} (EAGLE on CPU) is not implemented; the stand-in "
                              "covers plain decoding, NGRAM and plugin workers verifying trees in TARGET_VERIFY")


def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
                                    retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num,
                                    tree_mask_mode) -> None:
    """Imported at module level by ``sglang/kernels/ops/speculative/spec_tree.py`` on CPU; EAGLE only."""
    _eagle_only("build_tree_kernel_efficient_cpu")


def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len):
    """Imported by ``IntelAMXMultiStepDraftBackend`` (EAGLE multi-step draft); EAGLE only."""
    _eagle_only("build_draft_decode_metadata_cpu")


def rotate_input_ids_cpu(input_ids, extend_start_loc, extend_seq_lens, topk_index, select_index=None) -> None:
    """Imported at module level by ``sglang/kernels/ops/speculative/multi_layer_eagle.py`` on CPU;
    multi-layer EAGLE only."""
    _eagle_only("rotate_input_ids_cpu")
