"""adapter/tap_capture.py: a forward that reads no taps runs without SGLang's capture path, and the
capture comes back after it, also when the forward raises; a target without the Llama-family
attributes is left capturing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_jetspec.adapter.tap_capture import taps_uncaptured


def _target(layers=(2, 11)):
    # what SGLang's LlamaForCausalLM.set_dflash_layers_to_capture leaves behind
    return SimpleNamespace(capture_aux_hidden_states=True, model=SimpleNamespace(layers_to_capture=list(layers)))


def test_capture_is_off_inside_and_back_after():
    target = _target()
    with taps_uncaptured(target):
        assert target.capture_aux_hidden_states is False and target.model.layers_to_capture == []
    assert target.capture_aux_hidden_states is True and target.model.layers_to_capture == [2, 11]


def test_capture_comes_back_when_the_forward_raises():
    target = _target()
    with pytest.raises(RuntimeError, match="forward failed"), taps_uncaptured(target):
        raise RuntimeError("forward failed")
    assert target.capture_aux_hidden_states is True and target.model.layers_to_capture == [2, 11]


@pytest.mark.parametrize(
    "target",
    [
        SimpleNamespace(capture_aux_hidden_states=True, model=SimpleNamespace()),  # other attribute names
        SimpleNamespace(capture_aux_hidden_states=False, model=SimpleNamespace(layers_to_capture=[])),  # no hook call
        SimpleNamespace(),
    ],
)
def test_targets_it_does_not_know_keep_what_they_had(target):
    before = vars(target).copy()
    with taps_uncaptured(target):
        assert vars(target) == before
    assert vars(target) == before
