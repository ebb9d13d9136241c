"""Small objects that many tests build: a tiny draft head configuration and the target it fits, and a
tiny random target checkpoint.

Importable from any test (pyproject's pytest `pythonpath = ["."]`): `from tests.builders import ...`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sglang_jetspec.core.head_config import HeadConfig, TargetInfo

# A target shape tiny heads fit: 64 wide, 8 layers (taps up to 6), a 100-token vocabulary.
TINY_TARGET = TargetInfo(hidden_size=64, vocab_size=100, num_hidden_layers=8)


def tiny_head_config(**overrides) -> HeadConfig:
    """A tiny causal draft head for TINY_TARGET: 2 layers of 4 query / 2 KV heads of 16, block 6, taps
    1, 3, 5. Keywords override any HeadConfig field; mask_token_id defaults to the vocabulary's last id."""
    values = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=100,
        block_size=6,
        target_layer_ids=(1, 3, 5),
    )
    values.update(overrides)
    values.setdefault("mask_token_id", values["vocab_size"] - 1)
    return HeadConfig(**values)


# A 6-layer, 64-wide random target of SmolLM2's vocabulary (LlamaConfig / Qwen3Config keywords): training,
# data and engine code at test speed.
TINY_TARGET_MODEL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=49152,
    max_position_embeddings=512,
)


def save_tiny_target(model, out: Path, tokenizer_dir: Path) -> Path:
    """`model` saved as a checkpoint directory `out`, with the tokenizer of `tokenizer_dir` (SmolLM2's:
    any tokenizer of this vocabulary)."""
    from transformers import AutoTokenizer

    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(out))
    return out


def train_args(tmp_path: Path, target: Path, *extra: str, prompts: int = 8, max_new_tokens: int = 16) -> list[str]:
    """`jetspec train` arguments for a tiny run on `target`, then `extra`: `prompts` code prompts written
    to tmp_path/prompts.jsonl, data in tmp_path/data, `max_new_tokens` regenerated in batches of 4,
    a head of block 6 reading 2 taps."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"def function_{i}(x):\n    return"}) + "\n" for i in range(prompts)))
    return [
        "train",
        "--target",
        str(target),
        "--prompts",
        str(path),
        "--data-dir",
        str(tmp_path / "data"),
        "--max-new-tokens",
        str(max_new_tokens),
        "--regen-batch-size",
        "4",
        "--block-size",
        "6",
        "--taps",
        "2",
        *extra,
    ]


def grouped_attention_inputs(keys: int, masked_share: float, seed: int = 0):
    """Random SDPA inputs with grouped heads, (q, k, v, mask): 2 sequences, 9 query heads over 3 KV heads
    of 16, 5 queries, `keys` keys; a boolean mask hiding about `masked_share` of the keys but never
    key 0 (every query attends somewhere)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(2, 9, 5, 16, generator=gen),
        torch.randn(2, 3, keys, 16, generator=gen),
        torch.randn(2, 3, keys, 16, generator=gen),
    )
    mask = torch.rand(2, 1, 5, keys, generator=gen) > masked_share
    mask[..., 0] = True
    return q, k, v, mask


def break_target_processing(monkeypatch, **wrong) -> None:
    """A deliberately broken acceptor: every target distribution acceptance processes is computed with the
    request's parameters changed by `wrong` (temperature=1.0, top_p=1.0, ...), on both of its paths
    (processed_probs: the residual and drawn walks and sample-then-match's rare redo; kept_candidates:
    sample-then-match)."""
    from dataclasses import replace

    from sglang_jetspec.core import acceptance, sampling

    def broken(process):
        return lambda logits, params, *rest: process(logits, replace(params, **wrong), *rest)

    monkeypatch.setattr(acceptance, "processed_probs", broken(sampling.processed_probs))
    monkeypatch.setattr(acceptance, "kept_candidates", broken(sampling.kept_candidates))


def internal_state_worker(control):
    """What adapter.internal_state reads of a JETSPEC worker (its PolicyControl `control`, nothing running),
    for tests of SGLang's internal-state hooks without a worker."""
    from types import SimpleNamespace

    from sglang_jetspec.adapter.tensor_parallel import SingleRank

    return SimpleNamespace(
        policy_control=control,
        ranks=SingleRank(),
        live_draft_states=lambda: 0,
        context_pool_state=lambda: {"slots": 0, "bytes": 0, "valid_slots": 0},
        verify_widths_state=lambda: {"rungs": [], "steps_by_width": {}, "padded_steps": 0},
    )
