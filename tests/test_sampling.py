"""The target-side processing must be exactly what ordinary decoding samples from."""

import math

import pytest
import torch

from sglang_jetspec.core.sampling import SamplingParams, processed_probs

# probs at temperature 1: [0.4, 0.3, 0.2, 0.1]
LOGITS = torch.tensor([math.log(0.4), math.log(0.3), math.log(0.2), math.log(0.1)])


def expect(values):
    t = torch.tensor(values, dtype=torch.float32)
    return t / t.sum()


@pytest.mark.parametrize(
    "params, expected",
    [
        (SamplingParams(temperature=1.0), [0.4, 0.3, 0.2, 0.1]),
        (SamplingParams(temperature=1.0, top_k=2), [0.4, 0.3, 0, 0]),
        # mass before token 2 is 0.7 > 0.6 -> dropped; before token 1 is 0.4 <= 0.6 -> kept
        (SamplingParams(temperature=1.0, top_p=0.6), [0.4, 0.3, 0, 0]),
        (SamplingParams(temperature=1.0, top_p=0.75), [0.4, 0.3, 0.2, 0]),
        # min_p 0.5 of max 0.4 = 0.2 threshold, inclusive
        (SamplingParams(temperature=1.0, min_p=0.5), [0.4, 0.3, 0.2, 0]),
        (SamplingParams(temperature=1.0, top_k=3, top_p=0.6, min_p=0.7), [0.4, 0.3, 0, 0]),
        (SamplingParams(temperature=1.0, top_k=3, top_p=0.8, min_p=0.8), [0.4, 0, 0, 0]),
        (SamplingParams(temperature=0.0), [1, 0, 0, 0]),
    ],
)
def test_processed_probs_matches_hand_computed(params, expected):
    assert torch.allclose(processed_probs(LOGITS, params), expect(expected), atol=1e-6)


def test_temperature_sharpens_before_filtering():
    probs = processed_probs(LOGITS, SamplingParams(temperature=0.5))
    raw = torch.tensor([0.4, 0.3, 0.2, 0.1]) ** 2
    assert torch.allclose(probs, raw / raw.sum(), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"min_p": 1.0}, "min_p"),
        ({"top_k": 0}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)
