"""``copy_all_layer_kv_cache_cpu``: move KV rows between slots in every layer's K and V buffer.

Called from ``sglang/kernels/ops/kvcache/cache_move.py::copy_all_layer_kv_cache_func`` (SGLang 0.5.23)
as ``copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc[:num_locs], src_loc[:num_locs])``;
``data_ptrs`` holds the raw address of each contiguous buffer (``MHATokenToKVPool.data_ptrs``, uint64)
and ``strides`` its row size in bytes. Semantics of the Triton kernel there
(``copy_all_layer_kv_cache_tiled``): for every buffer, rows ``src_loc`` are read, then written to rows
``tgt_loc`` (all reads before writes, so overlapping moves are safe). One vectorised gather/scatter
per buffer; the buffers are viewed from their addresses as bytes.
"""

from __future__ import annotations

import ctypes

import torch


def _rows(address: int, row_bytes: int, num_rows: int) -> torch.Tensor:
    raw = (ctypes.c_uint8 * (row_bytes * num_rows)).from_address(address)
    return torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, row_bytes)


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    if tgt_loc.numel() != src_loc.numel():
        raise RuntimeError(f"tgt_loc ({tgt_loc.numel()}) and src_loc ({src_loc.numel()}) differ in length")
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.long(), src_loc.long()
    if bool((tgt < 0).any()) or bool((src < 0).any()):
        raise RuntimeError("copy_all_layer_kv_cache_cpu: negative slot")
    num_rows = int(torch.maximum(tgt.max(), src.max())) + 1  # rows that must exist in every buffer
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        rows = _rows(int(address), int(row_bytes), num_rows)
        rows[tgt] = rows[src]  # rows[src] is a copy: reads happen before writes
