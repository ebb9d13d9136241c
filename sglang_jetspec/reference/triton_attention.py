"""Masked attention in Triton: the reference engine's tree-verify attention without SDPA.

One kernel serves prefill, decoding and tree verification. Each query row attends to its lane's
KV slots wherever the engine's boolean mask allows: the committed prefix, plus ancestor-or-self
inside a draft tree (FlashInfer's "custom mask", dense). The softmax is FlashAttention's online
recurrence in fp32; fp32 inputs use IEEE dot products (no TF32), so fp32 greedy output can stay
token-identical to autoregressive decoding. It plugs into transformers as the attention
implementation ATTN_IMPLEMENTATION (`TargetModel(..., attention="triton")`); the target's layers,
KV cache and masks are unchanged.

Status (issue 8): checked against SDPA on CPU through Triton's interpreter (TRITON_INTERPRET=1),
kernel alone and inside the SmolLM2 target. Not yet compiled, checked or timed on a GPU. Not done:
skipping fully visible prefix tiles (the mask is read for every tile), a bit-packed tree mask, and
FlashInfer's paged prefill with a custom mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ATTN_IMPLEMENTATION = "jetspec_triton"
BLOCK_N = 16  # query rows per program (tl.dot needs >= 16)
BLOCK_S = 32  # key slots per inner step


@triton.jit
def _masked_attention_kernel(
    Q,
    K,
    V,
    M,
    Out,
    scale,
    sqb,
    sqh,
    sqn,
    sqd,
    skb,
    skh,
    sks,
    skd,
    svb,
    svh,
    svs,
    svd,
    smb,
    smn,
    sms,
    sob,
    soh,
    son,
    sod,
    H,
    N,
    S,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv_h = h // GROUP  # grouped-query attention: GROUP query heads share one KV head
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < N
    dim_ok = dims < D
    q = tl.load(
        Q + b * sqb + h * sqh + rows[:, None] * sqn + dims[None, :] * sqd,
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_N], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_N], tl.float32)
    acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start in range(0, S, BLOCK_S):
        cols = start + tl.arange(0, BLOCK_S)
        col_ok = cols < S
        k = tl.load(
            K + b * skb + kv_h * skh + cols[:, None] * sks + dims[None, :] * skd,
            mask=col_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )
        v = tl.load(
            V + b * svb + kv_h * svh + cols[:, None] * svs + dims[None, :] * svd,
            mask=col_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )
        allowed = (
            tl.load(
                M + b * smb + rows[:, None] * smn + cols[None, :] * sms, mask=row_ok[:, None] & col_ok[None, :], other=0
            )
            != 0
        )
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        else:
            scores = tl.dot(q, tl.trans(k)) * scale
        scores = tl.where(allowed, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding rows (past N) have l = 0 and are not stored
    tl.store(
        Out + b * sob + h * soh + rows[:, None] * son + dims[None, :] * sod,
        out.to(Out.dtype.element_ty),
        mask=row_ok[:, None] & dim_ok[None, :],
    )


def masked_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(q k^T * scale, where `allowed`) v.

    query [B, H, N, D]; key, value [B, H_kv, S, D] (H a multiple of H_kv); allowed [B, N, S] bool,
    every row with at least one True. Returns [B, H, N, D] in the query's dtype.
    """
    batch, heads, rows, dim = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    if heads % kv_heads or allowed.shape != (batch, rows, slots) or allowed.dtype != torch.bool:
        raise ValueError(
            f"masked_attention: query {tuple(query.shape)}, key {tuple(key.shape)}, mask "
            f"{tuple(allowed.shape)} {allowed.dtype}: want H % H_kv == 0 and a bool mask [B, N, S]"
        )
    out = torch.empty_like(query)
    mask = allowed.view(torch.uint8)  # same storage, readable by the kernel
    grid = (triton.cdiv(rows, BLOCK_N), batch * heads)
    _masked_attention_kernel[grid](
        query,
        key,
        value,
        mask,
        out,
        scale,
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *mask.stride(),
        *out.stride(),
        heads,
        rows,
        slots,
        GROUP=heads // kv_heads,
        D=dim,
        BLOCK_D=max(16, triton.next_power_of_2(dim)),
        BLOCK_N=BLOCK_N,
        BLOCK_S=BLOCK_S,
        IEEE=query.dtype == torch.float32,
    )
    return out


def masked_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: [B, N, H, D] out, no weights."""
    if attention_mask is None or attention_mask.dtype != torch.bool or attention_mask.dim() != 4:
        raise ValueError(
            f"{ATTN_IMPLEMENTATION} attention needs the reference engine's boolean [B, 1, N, S] mask, "
            f"got {None if attention_mask is None else (attention_mask.dtype, tuple(attention_mask.shape))}"
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = masked_attention(query, key, value, attention_mask[:, 0], scale)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make ATTN_IMPLEMENTATION known to transformers (idempotent); returns its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, masked_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)  # the engine passes its own 4D bool mask
    return ATTN_IMPLEMENTATION
