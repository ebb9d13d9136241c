"""The target's forward without SGLang's tap capture, for steps that read no taps.

The worker asks SGLang once, at start-up, to capture the tap layers' hidden states
(`set_dflash_layers_to_capture`); SGLang then runs its capture path on every forward of the target: a
copy of the hidden state at each tap layer, handed through the logits processor. A step whose cohort
is gated off keeps no draft context and reads none of it, so it need not pay for the copies
(bench/results/INDEX.md, c16-chat-fallback-bf16.md, has the measurement). The switch follows the
step's plan, which every tensor-parallel rank shares, so all ranks run the same forward. Only targets
whose hook sets the two attributes SGLang's Llama-family classes use are switched; any other keeps
capturing (exact, slower).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def taps_uncaptured(model) -> Iterator[None]:
    """Within the block, `model` (SGLang's target) captures no tap layers; restored after, errors too."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers_to_capture", None)
    if getattr(model, "capture_aux_hidden_states", None) is not True or not isinstance(layers, list):
        yield
        return
    model.capture_aux_hidden_states, inner.layers_to_capture = False, []
    try:
        yield
    finally:
        model.capture_aux_hidden_states, inner.layers_to_capture = True, layers
