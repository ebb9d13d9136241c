"""Draft head: published layout round trip, refusal of heads that do not fit, attention masks, context cache."""

import json

import pytest
import torch

from harness.step_probe import StepProbe
from sglang_jetspec.core.context_cache import ContextCache
from sglang_jetspec.core.head import RMSNorm, apply_rope, block_mask, rope_cos_sin, rope_frequencies
from sglang_jetspec.core.head_config import HeadConfigError, TargetInfo, default_tap_layers
from sglang_jetspec.core.head_io import init_head, load_head, read_head_config, save_head
from tests.builders import TINY_TARGET, tiny_head_config

PUBLISHED_KEYS = {
    "fc.weight",
    "hidden_norm.weight",
    "norm.weight",
    *(
        f"layers.{i}.{name}"
        for i in range(2)
        for name in (
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "self_attn.q_norm.weight",
            "self_attn.k_norm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
        )
    ),
}


def test_published_layout_round_trip(tmp_path):
    head = init_head(tiny_head_config(), seed=3)
    save_head(head, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["model_type"] == "qwen3"
    assert raw["block_size"] == 6
    assert raw["dflash_config"] == {"target_layer_ids": [1, 3, 5], "mask_token_id": 99, "causal_head": True}
    from safetensors.torch import load_file

    assert set(load_file(str(tmp_path / "model.safetensors"))) == PUBLISHED_KEYS
    loaded = load_head(tmp_path, TINY_TARGET)
    for key, value in head.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key])
    assert read_head_config(tmp_path) == head.config


def test_loads_a_published_style_checkpoint_with_model_prefix_and_default_taps(tmp_path):
    head = init_head(tiny_head_config(), seed=1)
    from safetensors.torch import save_file

    save_file(
        {f"model.{k}": v for k, v in head.state_dict().items()} | {"embed_tokens.weight": torch.zeros(100, 64)},
        str(tmp_path / "model.safetensors"),
    )
    raw = head.config.to_json_dict()
    raw["num_target_layers"] = 8
    del raw["dflash_config"]["target_layer_ids"]
    del raw["head_dim"]
    raw["dflash_config"]["causal_head"] = False
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = read_head_config(tmp_path)
    assert cfg.target_layer_ids == tuple(default_tap_layers(8, 2)) == (1, 5)
    assert cfg.head_dim == 16 and cfg.causal_head is False


@pytest.mark.parametrize(
    "target, field",
    [
        (TargetInfo(hidden_size=32, vocab_size=100, num_hidden_layers=8), "hidden_size"),
        (TargetInfo(hidden_size=64, vocab_size=120, num_hidden_layers=8), "vocab_size"),
        (TargetInfo(hidden_size=64, vocab_size=100, num_hidden_layers=4), "target_layer_ids"),
    ],
)
def test_head_that_does_not_fit_is_refused_naming_the_field(tmp_path, target, field):
    save_head(init_head(tiny_head_config()), tmp_path)
    with pytest.raises(HeadConfigError, match=field):
        load_head(tmp_path, target)


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda raw: raw.pop("block_size"), "block_size"),
        (lambda raw: raw["dflash_config"].pop("mask_token_id"), "mask_token_id"),
        (lambda raw: raw["dflash_config"].update(mask_token_id=500), "mask_token_id"),
        (lambda raw: raw.update(num_key_value_heads=3), "num_key_value_heads"),
        (lambda raw: raw.update(intermediate_size=256), "mlp"),  # weights no longer match the config
    ],
)
def test_malformed_head_directory_is_refused(tmp_path, edit, field):
    save_head(init_head(tiny_head_config()), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    edit(raw)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(HeadConfigError, match=field):
        load_head(tmp_path, TINY_TARGET)


def test_missing_directory_names_config_json(tmp_path):
    with pytest.raises(HeadConfigError, match="config.json"):
        load_head(tmp_path / "nope")


def _forward(head, block):
    torch.manual_seed(0)
    rows = torch.randn(1, 7, 3 * 64)
    context = head.project_context(rows, torch.arange(7).unsqueeze(0))
    valid = torch.ones(1, 7, dtype=torch.bool)
    positions = 7 + torch.arange(block.shape[1]).unsqueeze(0)
    return head(block, positions, context, block_mask(valid, block.shape[1], head.config.causal_head))


@pytest.mark.parametrize("causal", [True, False])
def test_in_block_attention_is_causal_only_for_the_jetspec_head(causal):
    head = init_head(tiny_head_config(causal_head=causal), seed=2)
    block = torch.randn(1, 6, 64)
    changed = block.clone()
    changed[0, 4] += 1.0  # perturb a late block row
    a, b = _forward(head, block), _forward(head, changed)
    assert torch.allclose(a[0, :4], b[0, :4], atol=1e-6) is causal
    assert not torch.allclose(a[0, 4:], b[0, 4:])


def test_block_mask_layout():
    valid = torch.tensor([[True, True, False]])
    causal = block_mask(valid, 3, causal=True)[0, 0]
    assert causal.tolist() == [
        [True, True, False, True, False, False],
        [True, True, False, True, True, False],
        [True, True, False, True, True, True],
    ]
    assert block_mask(valid, 3, causal=False)[0, 0, :, 3:].all()


def test_context_cache_grows_incrementally_like_a_full_projection():
    head = init_head(tiny_head_config(), seed=4)
    rows = torch.randn(9, 3 * 64)
    cache = ContextCache()
    cache.sync(head, rows[:4])
    cache.sync(head, rows[:9])
    full = head.project_context(rows.unsqueeze(0), torch.arange(9).unsqueeze(0))
    for mine, ref in zip(cache.layers, full):
        assert torch.allclose(mine.keys, ref.keys, atol=1e-6) and torch.allclose(mine.values, ref.values, atol=1e-6)
    assert cache.length == 9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_is_hfs_rotate_half_bit_for_bit(dtype):
    """apply_rope's one roll against a signed sin table gives HF's x * cos + cat(-x2, x1) * sin exactly."""
    head_dim, theta = 16, 10000.0
    positions = torch.tensor([[0, 5, 17], [3, 900, 40000]])
    x = torch.randn(2, 3, 4, head_dim).to(dtype)  # [B, S, H, D]
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = positions.float().unsqueeze(-1) * inv_freq
    emb = torch.cat([angles, angles], dim=-1).unsqueeze(-2)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    half = head_dim // 2
    expected = x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
    mine = apply_rope(x, *rope_cos_sin(positions, rope_frequencies(head_dim, theta, x.device), dtype))
    assert torch.equal(mine, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_heads_norm_is_hfs_cast_around_formula_bit_for_bit(dtype):
    """HF's Qwen3 norm normalises in float32, rounds to the input's dtype, then scales by the weight in that
    dtype. The head's RMSNorm leaves the casts to rms_norm itself (fewer ops: the next test); on the
    values, over rows of very different scales, it must not differ by a bit."""
    gen = torch.Generator().manual_seed(0)
    norm = RMSNorm(64, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(64, generator=gen) * 2)
        for scale in (1e-3, 1.0, 37.0, 3e3):
            x = (torch.randn(5, 7, 64, generator=gen) * scale).to(dtype)
            cast_around = norm.weight * torch.nn.functional.rms_norm(x.float(), (64,), eps=1e-6).to(dtype)
            assert norm(x).dtype == dtype
            assert torch.equal(norm(x), cast_around), scale


def test_the_heads_norm_launches_as_many_kernels_in_bf16_as_in_fp32():
    """One fused norm and one scale whatever the dtype: a cast into float32 and one back around the norm
    were two more kernels per norm in bf16, seven norms a drafting pass (issue 56's op count at batch 1)."""
    for dtype in (torch.float32, torch.bfloat16):
        norm, x = RMSNorm(16, 1e-6).to(dtype), torch.randn(2, 3, 16).to(dtype)
        with torch.no_grad(), StepProbe() as probe:
            norm(x)
        counts = probe.take()
        assert (counts.device_ops, counts.kernel_ops) == (2, 2), (dtype, counts.op_names)


def test_a_bf16_head_dispatches_fp32s_ops_plus_only_the_rope_tables_casts():
    """Projecting context and one drafting pass, in bf16 against fp32 (issue 56's op count): the only extra
    ops are the RoPE tables' two casts per call (cos and sin computed in float32, each rounded once), two
    calls here. A cast that creeps in around a norm, a linear or the attention fails here."""

    def ops(dtype) -> dict[str, int]:
        head = init_head(tiny_head_config(), seed=5).to(dtype)
        taps, block = torch.randn(2, 7, 3 * 64).to(dtype), torch.randn(2, 6, 64).to(dtype)
        mask = block_mask(torch.ones(2, 7, dtype=torch.bool), 6, causal=True)
        with torch.no_grad(), StepProbe() as probe:
            context = head.project_context(taps, torch.arange(7).expand(2, 7))
            head(block, (torch.arange(6) + 7).expand(2, 6), context, mask)
        return dict(probe.take().op_names)

    fp32, bf16 = ops(torch.float32), ops(torch.bfloat16)
    differ = {op: bf16.get(op, 0) - fp32.get(op, 0) for op in {*fp32, *bf16} if bf16.get(op) != fp32.get(op)}
    assert differ == {"_to_copy.default": 4}, differ
