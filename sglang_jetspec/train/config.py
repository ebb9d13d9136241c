"""The settings of a training run and of the head files made from its data: plain dataclasses and
names, no torch, so `jetspec train --help` (sglang_jetspec/cli/train.py) shows the defaults without
loading the training code."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

FEATURE_MODES = ("teacher-forced", "generation")
REGEN_BACKENDS = ("engine", "hf-generate")
LOSSES = ("forward_kl", "reverse_kl", "sft")
REVEALS = ("none", "prefix")
DEFAULT_VOCAB_SIZE = 2048  # `jetspec draft-vocab`: tokens in a head's reduced draft vocabulary
DEFAULT_CORPUS_TOKENS = 1_000_000  # `jetspec draft-corpus`: most tokens kept in a head's draft corpus


@dataclass(frozen=True)
class RegenerationConfig:
    max_new_tokens: int = 96
    sampled_share: float = 0.25  # share of prompts that also get a sampled response
    temperature: float = 0.8
    batch_size: int = 16
    seed: int = 0
    dtype: str = "fp32"  # the target's dtype while regenerating and computing teacher features
    features: str = "teacher-forced"  # or "generation": features captured while generating
    tap_layers: tuple[int, ...] = ()  # with features="generation": the taps captured (fixed per data dir)
    backend: str = (
        "engine"  # or "hf-generate": batched transformers generate + padded feature passes (train/batched_data.py)
    )

    def __post_init__(self) -> None:
        if self.features not in FEATURE_MODES:
            raise ValueError(f"features={self.features!r}: choose one of {FEATURE_MODES}")
        if self.dtype not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"dtype={self.dtype!r}: choose fp32, bf16 or fp16")
        if self.backend not in REGEN_BACKENDS:
            raise ValueError(f"backend={self.backend!r}: choose one of {REGEN_BACKENDS}")
        if self.backend == "hf-generate" and self.features != "teacher-forced":
            raise ValueError(
                "backend='hf-generate' computes teacher-forced features; "
                "generation features come from the engine backend"
            )
        if self.sampled_share > 1 and self.sampled_share != int(self.sampled_share):
            raise ValueError(
                f"sampled_share={self.sampled_share}: above 1 it is a whole number of sampled responses per prompt"
            )
        if self.features == "generation" and not self.tap_layers:
            raise ValueError("features='generation' needs tap_layers (the taps are captured while generating)")

    def as_json(self) -> dict:
        """The config as its manifest stores it (tuples as lists); `backend` only when it is not the engine,
        so configs from before it existed keep their digest and data directory."""
        fields = asdict(self)
        if fields["backend"] == "engine":
            del fields["backend"]
        return json.loads(json.dumps(fields))

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_json(), sort_keys=True).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    seqs_per_step: int = 4
    blocks_per_seq: int = 8
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    loss: str = "forward_kl"
    kd_temperature: float = 1.0
    position_decay: float | None = None
    heldout_share: float = 0.03
    eval_every: int = 250
    save_every: int = 250
    seed: int = 0
    bf16: bool = False
    reveal: str = "none"  # "prefix": blocks may hold true tokens before their masks (tree-causal drafting)
    all_mask_share: float = 0.5  # with reveal "prefix": share of blocks with nothing revealed
    init_from_target_layers: tuple[int, ...] = ()  # target layers copied into head layers 0, 1, ... before training
    time_budget_s: float | None = (
        None  # fit the run into this wall time: `steps` is lowered after TIMED_STEPS timed steps
    )

    def __post_init__(self) -> None:
        if self.reveal not in REVEALS:
            raise ValueError(f"reveal={self.reveal!r}: choose one of {REVEALS}")
        if not 0.0 <= self.all_mask_share <= 1.0:
            raise ValueError(f"all_mask_share={self.all_mask_share}: must be within [0, 1]")
        object.__setattr__(self, "init_from_target_layers", tuple(self.init_from_target_layers))
