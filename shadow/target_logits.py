"""Non-speculative references for the shadow checker: the target's logits at every emitted position of a record.

Both score by one prefill of prompt+output (teacher forcing), which is non-speculative by
construction: row i holds the logits that predict output token i given everything before it.

- `LocalReference`: the reference engine's TargetModel (load it in fp32 for the checker).
- `HttpReference`: an SGLang-compatible server without speculation, through `/generate` with
  `return_logprob`, `logprob_start_len` = prompt length and `top_logprobs_num`; `max_new_tokens` 0.
  SGLang's prompt logprobs are log-softmax of the raw logits, equal to the logits up to a constant
  per row, which `processed_probs` ignores. Greedy requests ask for the top 2 only (argmax and
  runner-up); sampled ones for the whole vocabulary, since temperature / top-p / min-p need it. With
  `sampled_top_logprobs` < vocab, tokens outside the top N get probability 0 (rows are `complete`
  False and the report says so): exact only when the request's own top-k is <= N.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Protocol

import torch

from sglang_jetspec.spool.record import ShadowRecord

GREEDY_TOP_LOGPROBS = 2


class ReferenceError(RuntimeError):
    """The reference could not score a record; the message says what to fix."""


def post_generate(url: str, body: dict, timeout_s: float) -> dict | list:
    """POST `body` to the server's /generate (SGLang's native API): the decoded JSON reply, or
    ReferenceError saying what failed."""
    request = urllib.request.Request(
        f"{url}/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ReferenceError(f"{url}/generate answered {exc.code}: {exc.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ReferenceError(f"{url}/generate: {exc} -- is the reference server up?") from None


@dataclass
class Scores:
    logits: torch.Tensor  # [len(output_ids), vocab] float32; -inf where the reference gave no value
    complete: bool  # every vocabulary entry is known


class Reference(Protocol):
    name: str

    def score(self, record: ShadowRecord) -> Scores: ...


class LocalReference:
    def __init__(self, target) -> None:  # sglang_jetspec.reference.target.TargetModel
        self.target = target
        self.name = f"local:{target.path}"

    @torch.no_grad()
    def score(self, record: ShadowRecord) -> Scores:
        from sglang_jetspec.reference.target import Segment

        full = record.prompt_ids + record.output_ids
        if len(full) > self.target.info.max_position_embeddings:
            raise ReferenceError(f"request {record.request_id}: {len(full)} tokens exceed the target's positions")
        cache = self.target.new_cache(lanes=1, capacity=len(full))
        out = self.target.forward(cache, [Segment.chain(full, 0)])
        start = len(record.prompt_ids) - 1
        hidden = out.hidden[0, start : start + len(record.output_ids)]
        return Scores(self.target.logits(hidden).float().cpu(), complete=True)


class HttpReference:
    def __init__(self, url: str, vocab_size: int, sampled_top_logprobs: int | None = None, timeout_s: float = 300.0):
        self.url = url.rstrip("/")
        self.name = self.url
        self.vocab_size = vocab_size
        self.sampled_top_logprobs = sampled_top_logprobs or vocab_size
        self.timeout_s = timeout_s

    def score(self, record: ShadowRecord) -> Scores:
        n = len(record.output_ids)
        top = GREEDY_TOP_LOGPROBS if record.sampling.greedy else self.sampled_top_logprobs
        logits = torch.full((n, self.vocab_size), -math.inf)
        if n == 0:
            return Scores(logits, complete=True)
        meta = self._post(record, top)
        # SGLang's rows start at logprob_start_len (the last prompt token) with a None row: its value is
        # not computed (sglang/srt/managers/scheduler_components/logprob_result_processor.py), so row i+1
        # scores output token i
        emitted = _positions(meta, "input_token_logprobs", n + 1, record)[1:]
        tops = _positions(meta, "input_top_logprobs", n + 1, record)[1:]
        for i, (entry, row) in enumerate(zip(emitted, tops)):
            token = record.output_ids[i]
            if entry is None or entry[0] is None or int(entry[1]) != token:
                raise ReferenceError(
                    f"{self.url}: input_token_logprobs[{i + 1}] is {entry!r}, expected token {token} "
                    "-- the server does not align logprobs with logprob_start_len"
                )
            for value, token_id, *_ in row or []:
                logits[i, int(token_id)] = float(value)
            logits[i, token] = float(entry[0])
        return Scores(logits, complete=top >= self.vocab_size)

    def _post(self, record: ShadowRecord, top: int) -> dict:
        body = {
            "input_ids": record.prompt_ids + record.output_ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": len(record.prompt_ids) - 1,
            "top_logprobs_num": top,
        }
        payload = post_generate(self.url, body, self.timeout_s)
        if isinstance(payload, list):
            payload = payload[0]
        try:
            return payload["meta_info"]
        except (KeyError, TypeError):
            raise ReferenceError(f"{self.url}/generate: no meta_info in the reply -- is it an SGLang server?") from None


def _positions(meta: dict, key: str, n: int, record: ShadowRecord) -> list:
    rows = meta.get(key)
    if not isinstance(rows, list) or len(rows) < n:
        raise ReferenceError(
            f"meta_info.{key}: expected {n} rows for request {record.request_id}, got "
            f"{None if rows is None else len(rows)} -- the server must support return_logprob "
            "with logprob_start_len"
        )
    return rows[:n]
