"""Constrained records in the shadow checker (shadow/constraints.py), on the real SmolLM2 target (fp32, CPU).

The outputs are decoded here under masks built with xgrammar directly (an oracle independent of the
SGLang backend class the checker uses): greedy and seeded sampled ones check clean with their grammar;
the same greedy record checked without it shows errors (the grammar forced tokens the free target would
not pick: the masks matter); a token the grammar forbids is an error of infinite margin; a constrained
record without a tokenizer to rebuild its grammar fails its window instead of passing unchecked.
"""

from __future__ import annotations

import math

import pytest
import torch

from sglang_jetspec.core.sampling import SamplingParams, processed_probs
from sglang_jetspec.reference.target import Segment
from sglang_jetspec.spool.record import RecordConstraint, RecordSampling, ShadowRecord
from shadow.checker import ShadowChecker
from shadow.constraints import ConstraintMasks
from shadow.metrics import ShadowMetrics
from shadow.target_logits import LocalReference

xgr = pytest.importorskip("xgrammar")
pytest.importorskip("sglang.srt.constrained.xgrammar_backend")

# a date the free model would not write after this prompt: the grammar forces its digits and dashes
PROMPT = "Tell me about your favourite holiday."
REGEX = r"Date: 20[0-9]{2}-[01][0-9]-[0-3][0-9]\."


@pytest.fixture(scope="module")
def vocab(smollm2) -> int:
    return smollm2.info.vocab_size


def masked_decode(smollm2, prompt_ids: list[int], vocab: int, params: SamplingParams, seed: int = 0) -> list[int]:
    """Tokens decoded one by one from the target's logits masked by xgrammar's own matcher."""
    tokenizer = smollm2.tokenizer
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=[tokenizer.eos_token_id])
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_regex(REGEX))
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    generator = torch.Generator().manual_seed(seed)
    out: list[int] = []
    while not matcher.is_terminated() and len(out) < 24:
        ids = prompt_ids + out
        hidden = smollm2.forward(smollm2.new_cache(lanes=1, capacity=len(ids)), [Segment.chain(ids, 0)]).hidden
        logits = smollm2.logits(hidden[:, -1]).float()
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        if params.temperature == 0:
            token = int(logits.argmax())
        else:
            token = int(torch.multinomial(processed_probs(logits[0], params), 1, generator=generator))
        assert matcher.accept_token(token)
        out.append(token)
    return out


def constrained_record(
    smollm2, output_ids: list[int], temperature: float, constraint: RecordConstraint | None, request_id: str = "r"
) -> ShadowRecord:
    return ShadowRecord(
        request_id=request_id,
        model="smollm2",
        prompt_ids=smollm2.tokenizer(PROMPT)["input_ids"],
        output_ids=output_ids,
        finish_reason="eos",
        started_at=1.0,
        finished_at=2.0,
        sampling=RecordSampling(temperature=temperature, top_p=1.0, top_k=-1, min_p=0.0, seed=1, max_new_tokens=24),
        constraint=constraint,
    )


@pytest.fixture(scope="module")
def regex(smollm2) -> RecordConstraint:
    return RecordConstraint(kind="regex", value=REGEX, stop_token_ids=[smollm2.tokenizer.eos_token_id])


@pytest.fixture(scope="module")
def greedy_ids(smollm2, vocab) -> list[int]:
    ids = masked_decode(smollm2, smollm2.tokenizer(PROMPT)["input_ids"], vocab, SamplingParams(temperature=0.0))
    assert smollm2.tokenizer.decode(ids).startswith("Date: 20")
    return ids


def checker(smollm2, with_tokenizer: bool = True) -> ShadowChecker:
    from opentelemetry.trace import NoOpTracerProvider

    masks = ConstraintMasks(lambda: smollm2.path) if with_tokenizer else None
    return ShadowChecker(
        LocalReference(smollm2), 0.001, ShadowMetrics(), NoOpTracerProvider().get_tracer("t"), constraints=masks
    )


def test_a_greedy_constrained_record_checks_clean_with_its_grammar_and_not_without(smollm2, greedy_ids, regex):
    check, _ = checker(smollm2).check_request(constrained_record(smollm2, greedy_ids, 0.0, regex))
    assert check.mismatches == [] and check.tokens == len(greedy_ids)
    # negative control: rescored without the mask, the forced tokens are not the free target's argmax
    free, _ = checker(smollm2).check_request(constrained_record(smollm2, greedy_ids, 0.0, None))
    assert sum(m.kind == "error" for m in free.mismatches) >= 1


def test_a_token_the_grammar_forbids_is_an_error_of_infinite_margin(smollm2, greedy_ids, regex):
    letter = smollm2.tokenizer("x", add_special_tokens=False)["input_ids"][0]
    position = next(i for i, t in enumerate(greedy_ids) if smollm2.tokenizer.decode([t]).strip().isdigit())
    broken = greedy_ids[:position] + [letter] + greedy_ids[position + 1 :]
    check, _ = checker(smollm2).check_request(constrained_record(smollm2, broken, 0.0, regex))
    wrong = [m for m in check.mismatches if m.position == position]
    assert wrong and wrong[0].kind == "error" and math.isinf(wrong[0].margin)


def test_sampled_constrained_records_have_every_token_inside_the_masked_support(smollm2, vocab, regex):
    params = SamplingParams(temperature=1.0)
    prompt = smollm2.tokenizer(PROMPT)["input_ids"]
    records = [
        constrained_record(smollm2, masked_decode(smollm2, prompt, vocab, params, seed), 1.0, regex, f"s{seed}")
        for seed in range(3)
    ]
    report = checker(smollm2).check_window(1, records)
    assert report.requests.sampled == 3 and not report.failed
    assert report.mismatches.get("impossible", 0) == 0 and report.mismatches.get("error", 0) == 0
    assert len(report.pit_values) == sum(len(r.output_ids) for r in records)
    # forced tokens (the fixed "Date: 20", the dashes) carry probability 1 under the mask: their PIT is uniform
    assert all(0.0 <= u <= 1.0 for u in report.pit_values)


def test_a_constrained_record_without_a_tokenizer_fails_its_window(smollm2, greedy_ids, regex):
    report = checker(smollm2, with_tokenizer=False).check_window(
        1, [constrained_record(smollm2, greedy_ids, 0.0, regex)]
    )
    assert "r" in report.failed and "grammar" in report.failed["r"] and report.requests.greedy == 0


def test_the_constraint_travels_in_the_spool_line(smollm2, greedy_ids, regex):
    record = constrained_record(smollm2, greedy_ids, 0.0, regex)
    again = ShadowRecord.model_validate_json(record.model_dump_json())
    assert again.constraint == regex and again == record
