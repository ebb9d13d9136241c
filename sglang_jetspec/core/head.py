"""The JetSpec / DFlash draft head: a few Qwen3-style layers reading fused target hidden states.

Fused context = RMSNorm(fc(concat of tapped target hidden rows)). It never enters the residual
stream: every layer projects it with its own k_proj / v_proj (k_norm, RoPE at the rows' positions)
and prepends it to the block's keys and values. The block is [root, MASK x (B-1)]; attention inside
it is causal for the JetSpec head and bidirectional for the DFlash-style baseline. The head owns no
embedding or lm_head: callers embed with the target's embedding and read logits with its lm_head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .head_config import HeadConfig
from .masked_sdpa import masked_sdpa
from .packed_linear import PackedLinear


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalised in float32, scaled in the input's dtype (as HF's Qwen3 norm); one fused op, not five.
        # rms_norm upcasts a bf16 input to float32 itself and rounds its result to the input's dtype once,
        # the same values as casting around it, without the two casts (two kernels a norm on a GPU)
        return self.weight * nn.functional.rms_norm(x, (x.shape[-1],), eps=self.eps)


def rope_frequencies(head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's inverse frequencies laid out over the whole head dim [head_dim] (both halves), float32, and the
    sign [head_dim] that negates the first half of the sin table (see apply_rope)."""
    half = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**half)
    sign = torch.cat([-torch.ones_like(inv_freq), torch.ones_like(inv_freq)])
    return torch.cat([inv_freq, inv_freq]), sign


def rope_cos_sin(
    positions: torch.Tensor, frequencies: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin tables [..., 1, head_dim] for integer positions [...] (`frequencies`:
    rope_frequencies'), to multiply rows [..., heads, head_dim] (apply_rope)."""
    inv_freq, sign = frequencies
    angles = (positions.float().unsqueeze(-1) * inv_freq).unsqueeze(-2)
    return angles.cos().to(dtype), (angles.sin() * sign).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D]; cos/sin [B, S, 1, D] (rope_cos_sin's). HF's rotate-half convention, x * cos +
    cat(-x2, x1) * sin, bit for bit: the sin table carries the minus, so the rotation is one roll of the
    halves (fewer kernels than slicing, negating and concatenating: this runs three times a layer)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


@dataclass
class LayerContext:
    """One layer's projected context keys/values: [B, H_kv, L, D] each (RoPE already applied to keys)."""

    keys: torch.Tensor
    values: torch.Tensor


class DraftAttention(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        bias = cfg.attention_bias
        self.q_proj = PackedLinear(cfg.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = PackedLinear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = PackedLinear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = PackedLinear(self.num_heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """[B, S, n * D] -> [B, S, n, D]: a view; the norms and RoPE read rows contiguous in this layout, and
        attention takes the transpose [B, n, S, D] as a view too."""
        b, s, _ = x.shape
        return x.view(b, s, n, self.head_dim)

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> LayerContext:
        """Keys (k_norm + RoPE) and values for rows x [B, S, H]."""
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads)), cos, sin)
        return LayerContext(k.transpose(1, 2), self._heads(self.v_proj(x), self.num_kv_heads).transpose(1, 2))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context: LayerContext, mask: torch.Tensor
    ) -> torch.Tensor:
        """x: block rows [B, S, H]; mask: bool [B, 1, S, L+S], True where a query may attend."""
        q = apply_rope(self.q_norm(self._heads(self.q_proj(x), self.num_heads)), cos, sin).transpose(1, 2)
        own = self.project_kv(x, cos, sin)
        k = torch.cat([context.keys, own.keys], dim=2)
        v = torch.cat([context.values, own.values], dim=2)
        out = masked_sdpa(q, k, v, mask)  # grouped-query heads read as they are: no copy of the context
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class DraftMLP(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = PackedLinear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = PackedLinear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = PackedLinear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, x, cos, sin, context: LayerContext, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DraftHead(nn.Module):
    """Parameter names match the published checkpoints (layers.i.*, norm, fc, hidden_norm)."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.config = cfg
        self.fc = PackedLinear(cfg.num_taps * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self._frequencies: tuple[torch.Tensor, torch.Tensor] | None = None

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # the frequencies are kept per device (not as a buffer: the head's dtype casts would round them)
        if self._frequencies is None or self._frequencies[0].device != positions.device:
            self._frequencies = rope_frequencies(self.config.head_dim, self.config.rope_theta, positions.device)
        return rope_cos_sin(positions, self._frequencies, dtype)

    def project_context(self, tap_rows: torch.Tensor, positions: torch.Tensor) -> list[LayerContext]:
        """Per-layer context K/V for tapped target rows [B, L, taps*H] at positions [B, L].

        Rows are independent, so a cache may project new rows alone and concatenate.
        """
        fused = self.hidden_norm(self.fc(tap_rows))
        cos, sin = self.rope(positions, fused.dtype)
        return [layer.self_attn.project_kv(fused, cos, sin) for layer in self.layers]

    def forward(
        self, block_embeds: torch.Tensor, positions: torch.Tensor, context: list[LayerContext], mask: torch.Tensor
    ) -> torch.Tensor:
        """Final-normed hidden states for block rows [B, S, H] at positions [B, S].

        mask: bool [B, 1, S, L+S] over [context keys ; block keys].
        """
        cos, sin = self.rope(positions, block_embeds.dtype)
        x = block_embeds
        for layer, ctx in zip(self.layers, context):
            x = layer(x, cos, sin, ctx, mask)
        return self.norm(x)


def block_mask(context_valid: torch.Tensor, block_size: int, causal: bool) -> torch.Tensor:
    """bool [B, 1, S, L+S]: every block row sees the valid context; inside the block causal or full."""
    batch, ctx_len = context_valid.shape
    ctx = context_valid[:, None, None, :].expand(batch, 1, block_size, ctx_len)
    inner = torch.ones(block_size, block_size, dtype=torch.bool, device=context_valid.device)
    if causal:
        inner = inner.tril()
    return torch.cat([ctx, inner.expand(batch, 1, block_size, block_size)], dim=-1)


def tree_causal_mask(context_valid: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """bool [B, 1, 2N, L+2N] for the tree-causal draft pass over rows [N node rows ; N child-slot rows].

    context_valid: bool [B, L]; ancestors: bool [B, N, N], row i True at node i's ancestors and i
    itself (the paper's Eq. 8), all False on padding rows. Node row i sees its ancestors-or-self;
    child slot i sees node i's ancestors-or-self and itself. Padding rows see only themselves (and
    the context), so no row is ever fully masked.
    """
    batch, n, _ = ancestors.shape
    eye = torch.eye(n, dtype=torch.bool, device=ancestors.device).expand(batch, n, n)
    padding = ~ancestors.any(-1, keepdim=True)  # [B, N, 1]
    nodes = ancestors | (eye & padding)
    node_rows = torch.cat([nodes, torch.zeros_like(nodes)], dim=-1)
    slot_rows = torch.cat([ancestors, eye], dim=-1)
    ctx = context_valid[:, None, :].expand(batch, 2 * n, context_valid.shape[1])
    return torch.cat([ctx, torch.cat([node_rows, slot_rows], dim=1)], dim=-1).unsqueeze(1)
