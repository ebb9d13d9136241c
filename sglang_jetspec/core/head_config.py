"""Draft head configuration in the published JetSpec / DFlash layout, and its fit to a target.

config.json is a plain Qwen3 config plus `block_size` and
`dflash_config = {target_layer_ids, mask_token_id, causal_head}`; published heads load unchanged.
A head trained to read real tokens in its block (tree-causal drafting) also records how in
`dflash_config.draft_reveal = {"scheme": "prefix", "all_mask_share": s}`; without it a head only
drafts per-depth marginals.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields

_NOT_QWEN3_KEYS = ("target_layer_ids", "mask_token_id", "causal_head", "draft_reveal", "extra")
REVEAL_SCHEMES = ("prefix",)


class HeadConfigError(ValueError):
    """A head configuration that is malformed or does not fit the target; the message names the field."""


@dataclass(frozen=True)
class TargetInfo:
    """What a head must agree with, read from the target's own config."""

    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192


def default_tap_layers(num_target_layers: int, num_taps: int) -> list[int]:
    """Evenly spaced target layers, as the public code picks them: round(1 + i*(T-4)/(n-1))."""
    if num_taps == 1:
        return [num_target_layers // 2]
    return [round(1 + i * (num_target_layers - 4) / (num_taps - 1)) for i in range(num_taps)]


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    causal_head: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    attention_bias: bool = False
    # how training revealed true tokens inside the block; None = all-mask only (marginal drafting)
    draft_reveal: dict | None = field(default=None, hash=False)
    extra: dict = field(default_factory=dict, compare=False)  # unknown keys, kept for round trips

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
        ):
            if getattr(self, name) < 1:
                raise HeadConfigError(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.block_size < 2:
            raise HeadConfigError(f"block_size={self.block_size}: must be >= 2 (root + at least one drafted depth)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise HeadConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if not self.target_layer_ids:
            raise HeadConfigError("dflash_config.target_layer_ids is empty: list the target layers the head reads")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise HeadConfigError(
                f"dflash_config.mask_token_id={self.mask_token_id}: "
                f"must be a token id below vocab_size={self.vocab_size}"
            )
        if self.draft_reveal is not None:
            scheme = self.draft_reveal.get("scheme") if isinstance(self.draft_reveal, dict) else None
            if scheme not in REVEAL_SCHEMES:
                raise HeadConfigError(
                    f"dflash_config.draft_reveal={self.draft_reveal!r}: scheme must be one of {list(REVEAL_SCHEMES)}"
                )
            if not self.causal_head:
                raise HeadConfigError(
                    "dflash_config.draft_reveal is set on a bidirectional head (causal_head false): "
                    "revealed tokens need a causal head; drop draft_reveal or set causal_head true"
                )

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def reads_tree_tokens(self) -> bool:
        """Trained with true tokens revealed in its block, so it can draft conditioned on a tree path."""
        return self.draft_reveal is not None

    @property
    def max_depth(self) -> int:
        """Deepest tree level a single draft pass predicts."""
        return self.block_size - 1

    def to_json_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in _NOT_QWEN3_KEYS}
        d.update(self.extra)
        dflash = {
            "target_layer_ids": list(self.target_layer_ids),
            "mask_token_id": self.mask_token_id,
            "causal_head": self.causal_head,
        }
        if self.draft_reveal is not None:
            dflash["draft_reveal"] = dict(self.draft_reveal)
        d.update(
            architectures=["DFlashDraftModel"],
            model_type="qwen3",
            dflash_config=dflash,
            num_target_layers=self.extra.get("num_target_layers", max(self.target_layer_ids) + 1),
        )
        return d

    @classmethod
    def from_json_dict(cls, raw: dict) -> "HeadConfig":
        raw = dict(raw)
        dflash = raw.pop("dflash_config", None) or {}
        if "block_size" not in raw:
            raise HeadConfigError("config.json: block_size is missing (the number of positions one draft pass covers)")
        if "mask_token_id" not in dflash:
            raise HeadConfigError("config.json: dflash_config.mask_token_id is missing")
        if dflash.get("target_hidden_size") not in (None, raw.get("hidden_size")):
            raise HeadConfigError(
                f"dflash_config.target_hidden_size={dflash['target_hidden_size']} "
                f"differs from hidden_size={raw.get('hidden_size')}: "
                "heads with a hidden-size adapter are not supported"
            )
        taps = dflash.get("target_layer_ids")
        if taps is None:
            if "num_target_layers" not in raw:
                raise HeadConfigError(
                    "config.json: neither dflash_config.target_layer_ids nor num_target_layers is given"
                )
            taps = default_tap_layers(raw["num_target_layers"], raw["num_hidden_layers"])
        own = [f for f in fields(cls) if f.name not in _NOT_QWEN3_KEYS]
        known = {f.name for f in own}
        if "head_dim" not in raw and "hidden_size" in raw and "num_attention_heads" in raw:
            raw["head_dim"] = raw["hidden_size"] // raw["num_attention_heads"]  # implied, as in HF configs
        missing = sorted(
            f.name for f in own if f.name not in raw and f.default is MISSING and f.default_factory is MISSING
        )
        if missing:
            raise HeadConfigError(f"config.json: missing fields {missing}")
        values = {k: raw.pop(k) for k in list(raw) if k in known}
        rope_scaling = raw.get("rope_scaling")
        if rope_scaling not in (None, {}) and (rope_scaling or {}).get("rope_type", "default") != "default":
            raise HeadConfigError(f"rope_scaling={rope_scaling}: only unscaled RoPE heads are supported")
        extra = {k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
        return cls(
            target_layer_ids=tuple(int(t) for t in taps),
            mask_token_id=int(dflash["mask_token_id"]),
            causal_head=bool(dflash.get("causal_head", False)),
            draft_reveal=dflash.get("draft_reveal"),
            extra=extra,
            **values,
        )

    def check_fits(self, target: TargetInfo) -> None:
        """Refuse a head that cannot read this target's hidden states or vocabulary."""
        if self.hidden_size != target.hidden_size:
            raise HeadConfigError(
                f"head hidden_size={self.hidden_size} but target hidden_size={target.hidden_size}: "
                "use a head trained for this target (jetspec train --target ...)"
            )
        if self.vocab_size != target.vocab_size:
            raise HeadConfigError(
                f"head vocab_size={self.vocab_size} but target vocab_size={target.vocab_size}: the head shares the "
                "target's embedding and lm_head, so it must be trained for this target's tokenizer"
            )
        check_tap_layers(self.target_layer_ids, target.num_hidden_layers)


def check_tap_layers(taps: tuple[int, ...] | list[int], num_target_layers: int) -> None:
    """Tap t is the output of target decoder layer t (HF hidden_states[t + 1], before the final norm),
    which SGLang captures at the input of layer t + 1 (`set_dflash_layers_to_capture`) and packs in
    ascending layer order. So the taps must be strictly increasing (a permuted list would silently
    feed the head permuted features) and lie in 0 .. num_hidden_layers - 2 (the last layer has no
    next layer to capture at: its tap never arrives and the head's fc gets the wrong width)."""
    field = f"dflash_config.target_layer_ids={list(taps)}"
    bad = [t for t in taps if not 0 <= t < num_target_layers]
    if bad:
        raise HeadConfigError(
            f"{field}: layers {bad} do not exist in a target with num_hidden_layers={num_target_layers}; "
            f"use layers 0..{num_target_layers - 2} (a head trained for this target: jetspec train --target ...)"
        )
    last = [t for t in taps if t == num_target_layers - 1]
    if last:
        raise HeadConfigError(
            f"{field}: layer {last[0]} is the target's last decoder layer (num_hidden_layers={num_target_layers}); "
            f"a tap is captured at the input of the next layer, so the last tap allowed is {num_target_layers - 2}: "
            "retrain the head with earlier tap layers (jetspec train --tap-layers ...)"
        )
    if any(b <= a for a, b in zip(taps, taps[1:])):
        repeated = sorted({t for t in taps if list(taps).count(t) > 1})
        what = f"layers {repeated} are repeated" if repeated else "they are not in ascending order"
        fix = (
            f"list each layer once, in ascending order ({sorted(set(taps))}), and retrain the head"
            if repeated
            else f"list them in ascending order ({sorted(taps)}) and permute the head's fc.weight input blocks "
            "to match (or retrain it)"
        )
        raise HeadConfigError(
            f"{field}: {what}; the target captures tap layers once each and packs them in ascending layer order, "
            f"so the head's fc would read permuted features: {fix}"
        )
