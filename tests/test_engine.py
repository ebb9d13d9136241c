"""Reference engine on the real SmolLM2 target: bookkeeping invariants, stops, bad input."""

import pytest
import torch

from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request
from sglang_jetspec.reference.invariants import InvariantError, check_invariants
from sglang_jetspec.reference.target import Segment

PROMPTS = ["def add(a, b):\n    return", "The three primary colours are", "import os\nimport sys\n\ndef main():\n"]


@pytest.fixture(scope="module")
def head_engine(smollm2, untrained_drafter):
    return ReferenceEngine(
        smollm2, untrained_drafter, EngineConfig(tree_width=4, max_batch_size=2, check_invariants=True)
    )


def requests(tokenizer, max_new_tokens=12, **kwargs):
    return [
        Request(tokenizer(p)["input_ids"], SamplingParams(max_new_tokens=max_new_tokens, **kwargs), str(i))
        for i, p in enumerate(PROMPTS)
    ]


def fresh_state(target, committed_ids, taps):
    """KV and tapped rows of committed_ids[:-1] computed from scratch in one prefill."""
    ids = committed_ids[:-1]
    cache = target.new_cache(lanes=1, capacity=len(ids))
    out = target.forward(cache, [Segment.chain(ids, 0)], taps)
    cache.commit(0, list(range(len(ids))))
    return cache, out.taps[0]


def close_at_scale(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to fp32 rounding, which differs between step-wise decoding and a one-shot prefill and
    grows with the largest magnitudes in the reductions (hidden rows carry outliers of several hundred);
    a wrong or stale slot is off by the size of typical values, far above this bound."""
    return got.shape == want.shape and bool((got - want).abs().max() <= 1e-4 + 1e-5 * want.abs().max())


def test_kv_and_hidden_rows_match_a_fresh_prefill_after_every_step(smollm2, head_engine):
    checked = []

    def deep_check(record):
        cache, lanes = head_engine.live.cache, head_engine.live.lanes
        for b, lane in enumerate(lanes):
            ref_cache, ref_taps = fresh_state(smollm2, lane.committed_ids, head_engine.tap_layers)
            for layer in (0, 15, 29):
                k, v = cache.lane_kv(b, layer)
                rk, rv = ref_cache.lane_kv(0, layer)
                assert close_at_scale(k, rk) and close_at_scale(v, rv)
            assert close_at_scale(lane.tap_rows(), ref_taps)
            checked.append(lane.request.request_id)

    # max_batch_size 2 with 3 requests: the third joins when one finishes (continuous batching)
    head_engine.generate(requests(smollm2.tokenizer, ignore_eos=True), budget=16, on_step=deep_check)
    assert {"0", "1", "2"} <= set(checked)


def test_invariant_checker_catches_leftover_and_miscounted_state(smollm2, head_engine):
    batch = head_engine.start_batch()
    assert batch.admit(requests(smollm2.tokenizer)[0]) is None
    batch.step(8)
    cache, lanes = batch.cache, batch.lanes
    check_invariants(cache, lanes)
    length = int(cache.lengths[0])
    with torch.inference_mode():  # the engine's state is made in inference mode: only there can it change in place
        cache.layers[3].keys[0, :, length + 1] = 1.0  # a rejected node's key left behind
    with pytest.raises(InvariantError, match="past kv_len"):
        check_invariants(cache, lanes)
    with torch.inference_mode():
        cache.layers[3].keys[0, :, length + 1] = 0.0
        cache.lengths[0] += 1
    with pytest.raises(InvariantError, match="committed_len"):
        check_invariants(cache, lanes)


def test_stop_strings_eos_and_max_tokens_end_requests_identically(smollm2, head_engine):
    tok = smollm2.tokenizer
    prompt = tok("def add(a, b):\n")["input_ids"]
    plain = head_engine.generate([Request(prompt, SamplingParams(max_new_tokens=24, ignore_eos=True))], budget=0)[0]
    text = tok.decode(plain.output_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), "need a visible stop string from the model's own output"
    for budget in (0, 16):
        out = head_engine.generate([Request(prompt, SamplingParams(max_new_tokens=24, stop=(stop,)))], budget=budget)[0]
        assert out.finish_reason == "stop"
        assert stop in tok.decode(out.output_ids) and stop not in out.text
        assert out.output_ids == plain.output_ids[: len(out.output_ids)]
        limited = head_engine.generate(
            [Request(prompt, SamplingParams(max_new_tokens=5, ignore_eos=True))], budget=budget
        )[0]
        assert limited.finish_reason == "length" and limited.output_ids == plain.output_ids[:5]
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    for budget in (0, 16):
        out = head_engine.generate([Request(list(chat), SamplingParams(max_new_tokens=64))], budget=budget)[0]
        assert out.finish_reason == "eos" and out.output_ids[-1] in smollm2.eos_token_ids


def test_sampled_requests_with_a_seed_reproduce_across_batches(smollm2, head_engine):
    reqs = requests(smollm2.tokenizer, max_new_tokens=10, temperature=0.8, top_p=0.9, seed=7)
    alone = head_engine.generate(reqs[:1], budget=8)[0]
    together = head_engine.generate(reqs, budget=8)[0]
    assert alone.output_ids == together.output_ids


def test_bad_requests_are_refused(smollm2):
    engine = ReferenceEngine(smollm2)
    with pytest.raises(ValueError, match="needs a drafter"):
        engine.generate([Request([1, 2, 3])], budget=8)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        engine.generate([Request([])], budget=0)


class ContextCheckingDrafter:
    """Wraps a drafter; at every draft, checks the draft context covers every committed token but the root."""

    def __init__(self, inner):
        self.inner, self.checked = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, lanes, depth):
        out = self.inner.propose(lanes, depth)
        for lane in lanes:
            assert lane.draft_cache.length == lane.tap_rows().shape[0] == len(lane.committed_ids) - 1
            self.checked += 1
        return out


def test_switching_speculation_off_and_on_is_lossless_and_drafts_from_fresh_rows(smollm2, untrained_drafter):
    drafter = ContextCheckingDrafter(untrained_drafter)
    engine = ReferenceEngine(smollm2, drafter, EngineConfig(tree_width=4, max_batch_size=2, check_invariants=True))
    reqs = requests(smollm2.tokenizer, max_new_tokens=16, ignore_eos=True)
    plain = [o.output_ids for o in engine.generate(reqs, budget=0)]
    assert drafter.checked == 0, "budget 0 must do no draft work"
    steps = iter(range(10**6))
    outputs = engine.generate(reqs, budget=lambda batch_size: 16 if next(steps) % 3 == 2 else 0)  # mostly off
    assert [o.output_ids for o in outputs] == plain
    assert drafter.checked > 0


def test_request_stopping_mid_path_keeps_only_committed_state(smollm2):
    from sglang_jetspec.reference.oracle import OracleDrafter

    prompt = smollm2.tokenizer("def fibonacci(n):\n")["input_ids"]
    reference = (
        ReferenceEngine(smollm2)
        .generate([Request(prompt, SamplingParams(max_new_tokens=24, ignore_eos=True))], budget=0)[0]
        .output_ids
    )
    oracle = OracleDrafter(smollm2, max_depth=15)
    oracle.add_reference(prompt, reference)
    engine = ReferenceEngine(smollm2, oracle, EngineConfig(max_batch_size=2, check_invariants=True))
    # the oracle's first verify would accept far more than the 7 tokens this request may have
    out = engine.generate([Request(prompt, SamplingParams(max_new_tokens=7, ignore_eos=True))], budget=16)[0]
    assert out.output_ids == reference[:7] and out.finish_reason == "length"
    assert sum(out.accept_lengths) == 6  # the prefill's first token is not a verify


def test_drawn_children_keep_the_engine_exact_and_seeded_requests_reproducible(smollm2, untrained_drafter, monkeypatch):
    """acceptance "draw": sampled lanes verify trees whose children were drawn (after every step the KV
    and rows equal a fresh prefill), seeds reproduce across batches, greedy lanes stay autoregressive."""
    import sglang_jetspec.reference.engine as engine_module

    engine = ReferenceEngine(
        smollm2,
        untrained_drafter,
        EngineConfig(tree_width=4, max_batch_size=3, check_invariants=True, acceptance="draw"),
    )
    drawn_steps, real = [], engine_module.accept_batch

    def spy(trees, logits, params, generators, method):
        drawn_steps.extend(t.drawn is not None for t, p in zip(trees, params) if not p.greedy and t.size > 1)
        assert method == "draw" and all(t.drawn is None for t, p in zip(trees, params) if p.greedy)
        return real(trees, logits, params, generators, method)

    monkeypatch.setattr(engine_module, "accept_batch", spy)
    sampled = requests(smollm2.tokenizer, max_new_tokens=10, temperature=1.0, seed=11)
    alone = engine.generate(sampled[:1], budget=8)[0]
    greedy = Request(sampled[2].prompt_ids, SamplingParams(max_new_tokens=10), "g")
    together = engine.generate([sampled[0], sampled[1], greedy], budget=8)
    assert drawn_steps and all(drawn_steps)
    assert alone.output_ids == together[0].output_ids
    assert together[2].output_ids == engine.generate([greedy], budget=0)[0].output_ids
