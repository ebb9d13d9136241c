"""The SGLang-endpoint reference client against a small HTTP server that answers SGLang's /generate
logprob fields with real SmolLM2 log-probabilities computed locally (not a mocked target)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sglang_jetspec.spool.record import RecordSampling, ShadowRecord
from shadow.checks import sampled_transform
from shadow.target_logits import HttpReference, LocalReference, ReferenceError
from tests.loopback import QuietHandler, serving


@pytest.fixture(scope="module")
def sglang_like(smollm2):
    """SGLang 0.5.23's prompt-logprob contract (managers/scheduler_components/logprob_result_processor.py):
    rows run over input tokens s = logprob_start_len, s+1, ...; row 0 is [None, token_s, None] (not
    computed), row j >= 1 is [log p(token_{s+j} | tokens_<s+j), token_{s+j}, None], and
    input_top_logprobs[j] the top-N of that distribution (None for row 0)."""
    local = LocalReference(smollm2)
    requests = []

    class Handler(QuietHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.body())
            requests.append(body)
            ids, start, top = body["input_ids"], body["logprob_start_len"], body["top_logprobs_num"]
            probe = ShadowRecord(
                request_id="x",
                model="",
                prompt_ids=ids[: start + 1],
                output_ids=ids[start + 1 :],
                sampling=RecordSampling(temperature=0, top_p=1, top_k=-1, min_p=0, max_new_tokens=1),
                finish_reason="length",
                started_at=0,
                finished_at=0,
            )
            logprobs = torch.log_softmax(local.score(probe).logits.double(), -1)
            values, indices = logprobs.topk(top, dim=-1)
            meta = {
                "input_token_logprobs": [[None, ids[start], None]]
                + [[float(logprobs[j, t]), t, None] for j, t in enumerate(ids[start + 1 :])],
                "input_top_logprobs": [None]
                + [
                    [[float(v), int(i), None] for v, i in zip(vs, ix)]
                    for vs, ix in zip(values.tolist(), indices.tolist())
                ],
            }
            self.answer(200, json.dumps({"text": "", "output_ids": [], "meta_info": meta}).encode())

    with serving(Handler) as url:
        yield url, requests, local


def _record(smollm2, temperature: float) -> ShadowRecord:
    prompt = smollm2.tokenizer("def fibonacci(n):")["input_ids"]
    output = smollm2.tokenizer("\n    if n < 2:\n        return n")["input_ids"]
    return ShadowRecord(
        request_id="7",
        model="smollm2",
        prompt_ids=prompt,
        output_ids=output,
        sampling=RecordSampling(temperature=temperature, top_p=0.95, top_k=-1, min_p=0.0, max_new_tokens=32),
        finish_reason="length",
        started_at=0.0,
        finished_at=1.0,
    )


def test_full_vocabulary_scores_match_the_local_target(sglang_like, smollm2):
    url, requests, local = sglang_like
    record = _record(smollm2, 0.8)
    remote = HttpReference(url, smollm2.info.vocab_size).score(record)
    assert remote.complete and requests[-1]["top_logprobs_num"] == smollm2.info.vocab_size
    assert requests[-1]["logprob_start_len"] == len(record.prompt_ids) - 1
    assert requests[-1]["sampling_params"]["max_new_tokens"] == 0
    params = record.sampling.params()
    a = sampled_transform(remote.logits, record.output_ids, params, np.random.default_rng(0))
    b = sampled_transform(local.score(record).logits, record.output_ids, params, np.random.default_rng(0))
    np.testing.assert_allclose(a.pit, b.pit, atol=1e-5)  # logprobs = logits up to a per-row constant


def test_greedy_asks_for_the_top_two_only(sglang_like, smollm2):
    url, requests, local = sglang_like
    record = _record(smollm2, 0.0)
    remote = HttpReference(url, smollm2.info.vocab_size).score(record)
    assert requests[-1]["top_logprobs_num"] == 2 and not remote.complete
    assert torch.equal(remote.logits.argmax(-1), local.score(record).logits.argmax(-1))
    known = torch.isfinite(remote.logits).sum(-1)
    assert known.min() >= 2 and known.max() <= 3  # top 2 plus the emitted token


def test_unreachable_endpoint_names_the_fix(smollm2):
    with pytest.raises(ReferenceError, match="is the reference server up"):
        HttpReference("http://127.0.0.1:9", smollm2.info.vocab_size).score(_record(smollm2, 0.8))
