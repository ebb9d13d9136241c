"""Shared fixtures: the real SmolLM2 target (fetched once into the cache) and small heads for it."""

from __future__ import annotations

import pytest
import torch

from sglang_jetspec.core.head_config import HeadConfig, default_tap_layers


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_dir():
    from sglang_jetspec.models.fetch import fetch

    return fetch("smollm2")


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    from sglang_jetspec.reference.target import TargetModel

    return TargetModel(smollm2_dir, dtype=torch.float32)


def small_head_config(target_info, layers: int = 1, block_size: int = 16, causal: bool = True, taps: int = 4) -> HeadConfig:
    """A small head shaped for `target_info` (the shape the shipped SmolLM2 head uses)."""
    return HeadConfig(
        hidden_size=target_info.hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=target_info.vocab_size,
        block_size=block_size,
        target_layer_ids=tuple(default_tap_layers(target_info.num_hidden_layers, taps)),
        mask_token_id=0,
        causal_head=causal,
        rope_theta=target_info.rope_theta,
    )
