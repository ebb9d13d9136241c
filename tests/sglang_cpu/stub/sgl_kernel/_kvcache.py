"""``copy_all_layer_kv_cache_cpu``: move KV rows between slots in every layer's K and V buffer.

Called from ``sglang/kernels/ops/kvcache/cache_move.py::copy_all_layer_kv_cache_func`` (SGLang 0.5.23)
as ``copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc[:num_locs], src_loc[:num_locs])``;
``data_ptrs`` holds the raw address of each contiguous buffer (``MHATokenToKVPool.data_ptrs``, uint64)
and ``strides`` its row size in bytes. Semantics of the Triton kernel there
(``copy_all_layer_kv_cache_tiled``): for every buffer, rows ``src_loc`` are read, then written to rows
``tgt_loc`` (all reads before writes, so overlapping moves are safe). One vectorised gather/scatter
per buffer; the buffers are viewed from their addresses as bytes, and the views are kept (SGLang's
pools never move), so a call costs what a kernel launch would rather than 60 view constructions.
Rows already in place (``tgt == src``: a verify's root, and accepted nodes that sit at their depth)
are not copied.
"""

from __future__ import annotations

import ctypes

import torch


_VIEWS: dict[tuple[int, int], torch.Tensor] = {}  # (address, row bytes) -> byte view of the rows known to exist


def _rows(address: int, row_bytes: int, num_rows: int) -> torch.Tensor:
    view = _VIEWS.get((address, row_bytes))
    if view is None or view.shape[0] < num_rows:
        raw = (ctypes.c_uint8 * (row_bytes * num_rows)).from_address(address)
        view = _VIEWS[(address, row_bytes)] = torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, row_bytes)
    return view


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    if tgt_loc.numel() != src_loc.numel():
        raise RuntimeError(f"tgt_loc ({tgt_loc.numel()}) and src_loc ({src_loc.numel()}) differ in length")
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.long(), src_loc.long()
    if bool((tgt < 0).any()) or bool((src < 0).any()):
        raise RuntimeError("copy_all_layer_kv_cache_cpu: negative slot")
    moved = tgt != src
    if not bool(moved.all()):
        tgt, src = tgt[moved], src[moved]
        if tgt.numel() == 0:
            return
    num_rows = int(torch.maximum(tgt.max(), src.max())) + 1  # rows that must exist in every buffer
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        rows = _rows(int(address), int(row_bytes), num_rows)
        rows[tgt] = rows[src]  # rows[src] is a copy: reads happen before writes
