"""The target model for the reference engine: any local HF Llama- or Qwen3-family checkpoint.

One forward call serves prefill, ordinary decoding and tree verification: every lane brings some
new tokens with their positions and a mask among them (causal chain, a single token, or a tree's
ancestor-or-self mask); all see their lane's committed prefix. The call also returns the hidden
states of the head's tap layers for every new token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..core.head_config import TargetInfo
from ..core.packed_linear import MIN_ROWS, available, pack_linears
from .kv_cache import SlotKVCache

SUPPORTED_MODEL_TYPES = ("llama", "qwen3", "qwen2")
ATTENTION_BACKENDS = ("sdpa", "triton")  # triton: reference/triton_attention.py (the GPU path of issue 8)


class TargetError(ValueError):
    """A target directory that cannot be used; the message names what to fix."""


@dataclass
class Segment:
    """New tokens for one lane: ids [n], positions [n], mask [n, n] (True = may attend)."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def chain(cls, ids: list[int], start: int) -> "Segment":
        n = len(ids)
        return cls(torch.tensor(ids), torch.arange(start, start + n), torch.ones(n, n, dtype=torch.bool).tril())


@dataclass
class ForwardOutput:
    hidden: torch.Tensor  # [lanes, n_max, H] final-normed hidden states
    taps: torch.Tensor | None  # [lanes, n_max, taps*H] tapped decoder-layer outputs (pre final norm)


def read_target_config(target_dir: str | Path) -> dict:
    path = Path(target_dir) / "config.json"
    if not path.is_file():
        raise TargetError(
            f"{target_dir}: no config.json; pass a Hugging Face checkpoint directory "
            "(or run `jetspec model fetch smollm2`)"
        )
    cfg = json.loads(path.read_text())
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise TargetError(
            f"{path}: model_type={model_type!r} is not supported; "
            f"use a Llama- or Qwen3-family model ({', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    return cfg


class TargetModel:
    def __init__(
        self,
        target_dir: str | Path,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        attention: str = "sdpa",
        packed_linears: bool | None = None,
    ) -> None:
        """`packed_linears`: run the linears on oneDNN-packed weights (core/packed_linear.py); by default
        for a bf16 target on a CPU, never for fp32, the oracle of the identity tests."""
        self.path = Path(target_dir)
        read_target_config(self.path)
        self.device = torch.device(device)
        self.dtype = dtype
        if attention not in ATTENTION_BACKENDS:
            raise TargetError(f"attention={attention!r}: use one of {', '.join(ATTENTION_BACKENDS)}")
        if attention == "triton":
            from .triton_attention import register  # imports triton: only when asked for
        else:
            from .gqa_attention import register
        implementation = register()
        self.attention = attention
        self.model = (
            AutoModelForCausalLM.from_pretrained(str(self.path), dtype=dtype, attn_implementation=implementation)
            .to(self.device)
            .eval()
        )
        if packed_linears is None:
            packed_linears = dtype == torch.bfloat16 and self.device.type == "cpu"
        # only where the packed path will run: elsewhere padding the forward would buy nothing
        self.packed_linears = (
            bool(packed_linears)
            and available(self.model.get_input_embeddings().weight)
            and pack_linears(self.model) > 0
        )
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        cfg = self.model.config
        self.info = TargetInfo(
            hidden_size=cfg.hidden_size,
            vocab_size=cfg.vocab_size,
            num_hidden_layers=cfg.num_hidden_layers,
            rope_theta=float(
                getattr(cfg, "rope_theta", None)
                or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
            ),
            max_position_embeddings=cfg.max_position_embeddings,
        )
        self.eos_token_ids = self._eos_ids()
        self._captured: dict[int, torch.Tensor] = {}
        self._capture_every_layer()

    @property
    def embed_tokens(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (self.model.config, getattr(self.model, "generation_config", None)):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(value)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)

    def _capture_every_layer(self) -> None:
        """Keep each decoder layer's output (HF hidden_states[L + 1]) for the duration of one forward,
        so every caller names its own taps and no engine's choice leaks into another's."""
        for index, layer in enumerate(self.model.model.layers):

            def capture(_module, _inputs, output, index=index):
                self._captured[index] = output[0] if isinstance(output, tuple) else output

            layer.register_forward_hook(capture)

    def new_cache(self, lanes: int = 1, capacity: int = 256) -> SlotKVCache:
        return SlotKVCache(self.model.config.num_hidden_layers, lanes=lanes, capacity=capacity)

    @torch.no_grad()
    def forward(self, cache: SlotKVCache, segments: list[Segment], taps: tuple[int, ...] = ()) -> ForwardOutput:
        """Run new tokens for every lane of `cache` (one segment per lane, in lane order); `taps` names
        the decoder layers whose outputs come back concatenated (none: taps is None)."""
        if len(segments) != cache.lanes:
            raise ValueError(f"{len(segments)} segments for {cache.lanes} lanes")
        n_max = max(int(s.ids.numel()) for s in segments)
        # packed linears want MIN_ROWS rows: pad the pass once here (padding rows are dropped from
        # the output and their KV slots are never committed), not each linear call
        rows = max(n_max, MIN_ROWS) if self.packed_linears else n_max
        cache.prepare_write(rows)
        visible = cache.visible_len
        lanes = len(segments)
        ids = torch.zeros(lanes, rows, dtype=torch.long)
        positions = torch.zeros(lanes, rows, dtype=torch.long)
        mask = torch.zeros(lanes, 1, rows, visible, dtype=torch.bool)
        for b, seg in enumerate(segments):
            n, start = int(seg.ids.numel()), int(cache.lengths[b])
            ids[b, :n] = seg.ids
            positions[b, :n] = seg.positions
            positions[b, n:] = int(seg.positions[-1]) if n else start
            mask[b, 0, :n, :start] = True
            mask[b, 0, :n, start : start + n] = seg.mask
            # Padding queries attend only to their own slot so no softmax row is empty.
            pad = torch.arange(n, rows)
            mask[b, 0, pad, start + pad] = True
        out = self.model.model(
            input_ids=ids.to(self.device),
            position_ids=positions.to(self.device),
            attention_mask=mask.to(self.device),
            past_key_values=cache,
            use_cache=True,
        )
        tapped = torch.cat([self._captured[layer][:, :n_max] for layer in taps], dim=-1) if taps else None
        self._captured.clear()
        return ForwardOutput(hidden=out.last_hidden_state[:, :n_max], taps=tapped)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
