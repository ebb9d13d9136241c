"""Tap layers a head may name: SGLang captures tap t at the input of target layer t + 1 and packs the
captures in ascending layer order, so the taps must be strictly increasing and below the last layer.
The reference target taps the same thing (the output of layer t = HF hidden_states[t + 1])."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from sglang_jetspec.core.head_config import HeadConfig, HeadConfigError, TargetInfo, default_tap_layers
from sglang_jetspec.reference.loading import SHIPPED_HEADS
from tests.builders import TINY_TARGET, tiny_head_config

HEAD = tiny_head_config(num_hidden_layers=1)


def test_increasing_taps_below_the_last_layer_fit():
    HEAD.check_fits(TINY_TARGET)
    replace(HEAD, target_layer_ids=(0, 6)).check_fits(TINY_TARGET)  # 6 = the last allowed (input of layer 7)


@pytest.mark.parametrize(
    "taps, says",
    [
        ((1, 3, 7), "layer 7 is the target's last decoder layer"),
        ((7,), "the last tap allowed is 6"),
        ((1, 8), "layers [8] do not exist in a target with num_hidden_layers=8"),
        ((-1, 3), "layers [-1] do not exist"),
        ((5, 3, 1), "not in ascending order"),
        ((1, 5, 3), "list them in ascending order ([1, 3, 5])"),
        ((1, 3, 3), "layers [3] are repeated"),
    ],
)
def test_unusable_taps_are_refused_naming_the_field_and_the_fix(taps, says):
    with pytest.raises(HeadConfigError) as err:
        replace(HEAD, target_layer_ids=taps).check_fits(TINY_TARGET)
    message = str(err.value)
    assert message.startswith(f"dflash_config.target_layer_ids={list(taps)}: ")
    assert says in message
    assert any(fix in message for fix in ("retrain", "jetspec train", "use layers", "ascending order ("))


def test_loading_a_head_checks_its_taps(tmp_path):
    from sglang_jetspec.core.head_io import init_head, load_head, save_head

    save_head(init_head(replace(HEAD, target_layer_ids=(1, 3, 7))), tmp_path)
    with pytest.raises(
        HeadConfigError, match=r"dflash_config\.target_layer_ids=\[1, 3, 7\]: layer 7 is the target's last"
    ):
        load_head(tmp_path, TINY_TARGET)


@pytest.mark.parametrize("layers, taps", [(8, 2), (8, 4), (28, 5), (30, 4), (36, 5)])
def test_default_taps_fit(layers, taps):
    chosen = default_tap_layers(layers, taps)
    replace(HEAD, target_layer_ids=tuple(chosen)).check_fits(replace(TINY_TARGET, num_hidden_layers=layers))


def test_the_shipped_head_fits_smollm2():
    raw = json.loads((SHIPPED_HEADS / "smollm2-135m-instruct" / "config.json").read_text())
    cfg = HeadConfig.from_json_dict(raw)
    assert cfg.target_layer_ids == (1, 10, 18, 27)
    cfg.check_fits(TargetInfo(hidden_size=576, vocab_size=49152, num_hidden_layers=30, rope_theta=100000.0))


def test_a_new_head_config_names_the_targets_depth(smollm2):
    from sglang_jetspec.reference.loading import untrained_head_config

    written = untrained_head_config(smollm2).to_json_dict()
    assert written["num_target_layers"] == 30  # SmolLM2-135M's decoder layers, not the last tap + 1
    assert HeadConfig.from_json_dict(written).to_json_dict()["num_target_layers"] == 30  # survives a round trip


def test_reference_target_taps_are_the_outputs_sglang_captures(smollm2, single_thread):
    """Tap t = output of decoder layer t = HF hidden_states[t + 1] = the input SGLang captures before
    layer t + 1; concatenated in the listed (ascending) order."""
    from sglang_jetspec.reference.target import Segment

    taps = (1, 10, 28)
    ids = list(range(100, 107))
    out = smollm2.forward(smollm2.new_cache(1, 16), [Segment.chain(ids, 0)], taps)
    with torch.no_grad():
        hf = smollm2.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    hidden = smollm2.info.hidden_size
    for i, t in enumerate(taps):
        assert torch.allclose(out.taps[0, :, i * hidden : (i + 1) * hidden], hf[t + 1][0], atol=1e-4)
