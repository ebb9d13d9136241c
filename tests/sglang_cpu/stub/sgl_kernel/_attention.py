"""Paged attention over SGLang's ``req_to_token`` table: ``torch.ops.sgl_kernel.extend_attention_cpu``
and ``torch.ops.sgl_kernel.decode_attention_cpu``, vectorised over the batch.

Argument order is the one ``sglang/srt/layers/attention/intel_amx_backend.py`` (SGLang 0.5.23) passes
(``forward_extend`` / ``forward_decode``); semantics follow sgl-kernel's ``csrc/cpu/extend.cpp`` and
``decode.cpp``:

* extend: request ``b`` has ``seq_lens[b]`` tokens in all, the last ``extend_seq_lens[b]`` of them new.
  Its queries are rows ``extend_start_loc[b] + i`` of ``q_extend``; the prefix keys/values are read
  from ``k_buffer``/``v_buffer`` at the slots ``req_to_token[req_pool_indices[b], :prefix]``, the new
  ones from ``k_extend``/``v_extend`` (same rows as the queries). The whole prefix is visible; among the
  new tokens visibility is causal, or all-to-all when ``is_causal`` is False, or given by
  ``tree_mask``: a flat bool tensor ``[bs * N * N]`` with ``N = max_len_extend`` (TreeMaskMode
  QLEN_ONLY; row i = query node, column j = key node, True = visible; the prefix stays implicitly
  visible). With ``JETSPEC_TEST_IGNORE_TREE_MASK=1`` in the environment the tree mask is ignored and
  the new tokens see each other causally (a negative control for end-to-end tests).
* decode: one query per request; ``key``/``value`` (when given) are first written to the caches at
  ``loc``, then the query attends to the ``seq_lens[b]`` slots of its ``req_to_token`` row.
* ``sliding_window_size`` > 0 keeps key position k visible to query position p only when
  ``p - k < sliding_window_size`` (SGLang passes ``layer.sliding_window_size + 1``; 0 = no window).
* ``sinks`` (one logit per query head) adds ``exp(sink)`` to the softmax denominator.

Not supported (a clear NotImplementedError): a nonzero ``logit_cap``, cross-attention / encoder
lengths, quantised (fp8) KV caches or K/V scales other than 1.0. ``attn_logits`` is the real decode
kernel's scratch buffer and is not used.

Each call is one ``scaled_dot_product_attention`` over padded ``[bs, L]`` index tensors (a manual
float32 softmax where ``sinks`` are given); there is no per-request Python loop. The index tensors and
masks depend only on the forward's metadata, which every layer of one forward passes as the same tensor
objects, so they are built once per forward (``_PerForward``) as a kernel would derive them for free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE_TREE_MASK_ENV = "JETSPEC_TEST_IGNORE_TREE_MASK"

EXTEND_SCHEMA = (
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
    "Tensor k_buffer, Tensor v_buffer, float k_buf_scale, float v_buf_scale, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, "
    "int max_len_extend, float sm_scale, float logit_cap, bool is_cross_attn, int sliding_window_size, "
    "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()"
)
DECODE_SCHEMA = (
    "decode_attention_cpu(Tensor query, Tensor(b!) k_buffer, Tensor(c!) v_buffer, float k_buf_scale, "
    "float v_buf_scale, Tensor(a!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, "
    "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
    "bool is_cross_attn, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()"
)


def ignore_tree_mask() -> bool:
    return os.environ.get(IGNORE_TREE_MASK_ENV, "") == "1"


def _check_supported(op: str, k_buffer, v_buffer, k_scale, v_scale, logit_cap, is_cross_attn, encoder_lens) -> None:
    if logit_cap != 0:
        raise NotImplementedError(f"sgl_kernel stand-in {op}: logit_cap={logit_cap} (only 0 is supported)")
    if is_cross_attn or encoder_lens is not None:
        raise NotImplementedError(f"sgl_kernel stand-in {op}: cross-attention / encoder_lens are not supported")
    if k_buffer.element_size() == 1 or v_buffer.element_size() == 1 or k_scale != 1.0 or v_scale != 1.0:
        raise NotImplementedError(
            f"sgl_kernel stand-in {op}: quantised KV cache ({k_buffer.dtype}, k_scale={k_scale}, "
            f"v_scale={v_scale}) is not supported")


class _PerForward:
    """What one forward's layers share: built by the first layer's call, reused by the others.

    Every layer of a forward passes the same metadata tensor objects (``init_forward_metadata`` builds
    them once per forward) and its own KV buffer. A forward ends when a buffer comes back (layer 0 of the
    next forward) or any metadata object or scalar differs; the held references keep the objects alive,
    so a new forward's tensors cannot take their ids."""

    def __init__(self) -> None:
        self.tensors: tuple = ()
        self.scalars: tuple = ()
        self.buffers: set[int] = set()
        self.value = None

    def get(self, tensors: tuple, scalars: tuple, buffer: torch.Tensor, build):
        same = (
            self.value is not None
            and scalars == self.scalars
            and len(tensors) == len(self.tensors)
            and all(a is b for a, b in zip(tensors, self.tensors))
        )
        if same and buffer.data_ptr() not in self.buffers:
            self.buffers.add(buffer.data_ptr())
            return self.value
        self.value = build()
        self.tensors, self.scalars, self.buffers = tensors, scalars, {buffer.data_ptr()}
        return self.value


_EXTEND_PLANS = _PerForward()
_DECODE_PLANS = _PerForward()


def _row_slots(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, length: int,
               valid_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """KV slot ids of token positions 0..length-1 of each request's ``req_to_token`` row, [bs, length]
    int64 (0 where masked), and the mask ``position < valid_len``."""
    if length > req_to_token.shape[1]:
        raise RuntimeError(f"seq_len {length} out of scope: req_to_token has {req_to_token.shape[1]} columns")
    cols = torch.arange(length, device=req_to_token.device)
    valid = cols[None, :] < valid_len[:, None]
    slots = req_to_token[req_pool_indices.long()[:, None], cols[None, :]].long()
    return torch.where(valid, slots, torch.zeros_like(slots)), valid


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, sm_scale: float,
            sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T * sm_scale, masked) v for padded batches, accumulated in float32.

    q [bs, Lq, H, D]; k [bs, Lk, Hkv, D]; v [bs, Lk, Hkv, Dv]; allowed [bs, Lq, Lk] bool.
    Query head h reads KV head h // (H // Hkv). Returns [bs, Lq, H, Dv]; rows with nothing allowed
    come out NaN (callers never read them)."""
    h, hkv = q.shape[2], k.shape[2]
    if h % hkv:
        raise RuntimeError(f"num_heads {h} is not a multiple of num_heads_kv {hkv}")
    if sinks is None:
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed[:, None],
            scale=sm_scale, enable_gqa=True)
        return out.transpose(1, 2)
    bs, lq, _, d = q.shape
    lk, dv, g = k.shape[1], v.shape[3], h // hkv
    qf = q.float().reshape(bs, lq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(bs, hkv, g * lq, d)
    kf = k.float().permute(0, 2, 3, 1)  # [bs, hkv, d, lk]
    vf = v.float().permute(0, 2, 1, 3)  # [bs, hkv, lk, dv]
    scores = torch.matmul(qf, kf).mul_(sm_scale).view(bs, hkv, g, lq, lk)
    scores.masked_fill_(~allowed[:, None, None, :, :], float("-inf"))
    sink = sinks.float().reshape(hkv, g)[None, :, :, None, None].expand(bs, hkv, g, lq, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :lk]
    out = torch.matmul(probs.reshape(bs, hkv, g * lq, lk), vf)  # [bs, hkv, g*lq, dv]
    return out.view(bs, hkv, g, lq, dv).permute(0, 3, 1, 2, 4).reshape(bs, lq, h, dv)


@dataclass(frozen=True)
class _ExtendPlan:
    """One forward's extend layout. ``rows`` [bs, lq] are the rows of q/k/v/o_extend per request and
    query (None when requests are consecutive blocks of lq rows: then they are views); ``out_rows`` the
    rows of valid queries, in ``q_valid`` order; ``slots`` [bs, lp] the prefix's KV slots; ``allowed``
    [bs, lq, lp + lq] what each query sees."""

    bs: int
    lq: int
    rows: torch.Tensor | None
    q_valid: torch.Tensor | None
    out_rows: torch.Tensor | None
    slots: torch.Tensor
    allowed: torch.Tensor


def _extend_plan(req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, max_len_extend,
                 sliding_window_size, tree_mask, is_causal, use_tree) -> _ExtendPlan | None:
    bs, device = seq_lens.shape[0], seq_lens.device
    ext = extend_seq_lens.long()
    pre = seq_lens.long() - ext
    if bool((pre < 0).any()):
        raise RuntimeError("extend attention: prefix len < 0")
    lq, lp = int(ext.max()), int(pre.max())
    if lq == 0:
        return None
    if tree_mask is not None:
        n = int(max_len_extend)
        if tree_mask.dtype != torch.bool or tree_mask.numel() != bs * n * n:
            raise RuntimeError(f"extend attention: expect a bool tree_mask of num_seqs * max_len_extend^2 = "
                               f"{bs * n * n} elements, got {tree_mask.dtype} with {tree_mask.numel()}")
        if bool((ext != n).any()):
            raise RuntimeError("extend attention: tree_mask requires uniform extend_seq_lens == max_len_extend")
        if sliding_window_size > 0:
            raise RuntimeError("extend attention: tree_mask is not supported with sliding window attention")

    qi = torch.arange(lq, device=device)
    starts = extend_start_loc.long()
    blocks = bool((ext == lq).all()) and bool((starts == torch.arange(bs, device=device) * lq).all())
    q_valid = qi[None, :] < ext[:, None]  # [bs, lq]
    rows = None if blocks else torch.where(q_valid, starts[:, None] + qi[None, :], 0)
    slots, p_valid = _row_slots(req_to_token, req_pool_indices, lp, pre)

    if use_tree:
        new_vis = tree_mask.reshape(bs, lq, lq)
    elif is_causal:
        new_vis = (qi[None, :] <= qi[:, None]).expand(bs, lq, lq)
    else:
        new_vis = torch.ones((bs, lq, lq), dtype=torch.bool, device=device)
    allowed = torch.cat([p_valid[:, None, :].expand(bs, lq, lp), new_vis & q_valid[:, None, :]], dim=-1)
    if sliding_window_size > 0:
        q_pos = pre[:, None] + qi[None, :]  # [bs, lq]
        k_pos = torch.cat([torch.arange(lp, device=device)[None, :].expand(bs, lp), q_pos], dim=1)
        allowed = allowed & ((q_pos[:, :, None] - k_pos[:, None, :]) < sliding_window_size)
    if blocks:
        return _ExtendPlan(bs, lq, None, None, None, slots, allowed)
    return _ExtendPlan(bs, lq, rows, q_valid, rows[q_valid], slots, allowed)


def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_buf_scale, v_buf_scale,
                         req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, max_len_extend,
                         sm_scale, logit_cap, is_cross_attn, sliding_window_size, encoder_lens, sinks, tree_mask,
                         is_causal) -> None:
    _check_supported("extend_attention_cpu", k_buffer, v_buffer, k_buf_scale, v_buf_scale, logit_cap, is_cross_attn,
                     encoder_lens)
    if k_extend is None or v_extend is None:
        raise RuntimeError("k_extend and v_extend are required for non-cross attention")
    if seq_lens.shape[0] == 0:
        return
    use_tree = tree_mask is not None and not ignore_tree_mask()
    plan = _EXTEND_PLANS.get(
        (req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, tree_mask),
        (int(max_len_extend), int(sliding_window_size), bool(is_causal), use_tree),
        k_buffer,
        lambda: _extend_plan(req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
                             max_len_extend, sliding_window_size, tree_mask, is_causal, use_tree),
    )
    if plan is None:
        return

    def new(x: torch.Tensor) -> torch.Tensor:  # [bs, lq, heads, dim] rows of an extend tensor
        return x[: plan.bs * plan.lq].unflatten(0, (plan.bs, plan.lq)) if plan.rows is None else x[plan.rows]

    dtype = q_extend.dtype
    k = torch.cat([k_buffer[plan.slots].to(dtype), new(k_extend)], dim=1)  # [bs, lp + lq, hkv, d]
    v = torch.cat([v_buffer[plan.slots].to(dtype), new(v_extend)], dim=1)
    out = _attend(new(q_extend), k, v, plan.allowed, sm_scale, sinks)
    if plan.rows is None:
        o_extend[: plan.bs * plan.lq].unflatten(0, (plan.bs, plan.lq)).copy_(out)
    else:
        o_extend[plan.out_rows] = out[plan.q_valid].to(o_extend.dtype)


def _decode_plan(req_to_token, req_pool_indices, seq_lens, sliding_window_size) -> tuple[torch.Tensor, torch.Tensor]:
    """The KV slots [bs, L] each request reads and the mask [bs, 1, L] of those it sees."""
    seq = seq_lens.long()
    slots, valid = _row_slots(req_to_token, req_pool_indices, int(seq.max()), seq)
    if sliding_window_size > 0:
        cols = torch.arange(slots.shape[1], device=slots.device)
        valid = valid & (cols[None, :] >= (seq - sliding_window_size)[:, None])
    return slots, valid[:, None, :]


def decode_attention_cpu(query, k_buffer, v_buffer, k_buf_scale, v_buf_scale, output, key, value, loc, attn_logits,
                         req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap, is_cross_attn,
                         sliding_window_size, encoder_lens, sinks) -> None:
    _check_supported("decode_attention_cpu", k_buffer, v_buffer, k_buf_scale, v_buf_scale, logit_cap, is_cross_attn,
                     encoder_lens)
    if key is not None and value is not None:  # the decode kernel stores this step's K/V itself
        k_buffer[loc] = key.reshape(loc.shape[0], *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[loc] = value.reshape(loc.shape[0], *v_buffer.shape[1:]).to(v_buffer.dtype)
    bs = seq_lens.shape[0]
    if bs == 0:
        return
    slots, allowed = _DECODE_PLANS.get(
        (attn_logits, req_to_token, req_pool_indices, seq_lens),
        (int(sliding_window_size),),
        k_buffer,
        lambda: _decode_plan(req_to_token, req_pool_indices, seq_lens, sliding_window_size),
    )
    dtype = query.dtype
    q = query.reshape(bs, 1, query.shape[-2], query.shape[-1])
    out = _attend(q, k_buffer[slots].to(dtype), v_buffer[slots].to(dtype), allowed, sm_scale, sinks)
    output.copy_(out[:, 0].reshape(output.shape).to(output.dtype))


LIBRARY = torch.library.Library("sgl_kernel", "FRAGMENT")
LIBRARY.define(EXTEND_SCHEMA)
LIBRARY.impl("extend_attention_cpu", extend_attention_cpu, "CPU")
LIBRARY.define(DECODE_SCHEMA)
LIBRARY.impl("decode_attention_cpu", decode_attention_cpu, "CPU")
