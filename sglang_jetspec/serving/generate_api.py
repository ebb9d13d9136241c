"""`POST /generate` of the reference server: SGLang's request and response shapes (a subset).

    {"text": str | "input_ids": [int],
     "sampling_params": {"temperature", "top_p", "top_k", "min_p", "max_new_tokens", "stop", "seed",
                         "ignore_eos"}}
 -> {"text", "output_ids", "meta_info": {"id", "prompt_tokens", "completion_tokens", "finish_reason",
                                         "spec_verify_ct", "spec_accept_length"}}

Omitted sampling fields take SGLang's defaults (temperature 1.0, max_new_tokens 128, ...), so a
client written for SGLang gets the same decoding here. Anything else is refused with a message
naming the field, rather than silently ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..core.sampling import SamplingParams
from ..reference.engine import Request, RequestOutput

# SGLang's SamplingParams defaults for the fields we support.
SGLANG_DEFAULTS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "max_new_tokens": 128,
    "stop": (),
    "seed": None,
    "ignore_eos": False,
}
TOP_LEVEL_FIELDS = ("text", "input_ids", "sampling_params")


class BadRequest(ValueError):
    """A request the server refuses (HTTP 400); the message names the field and the fix."""


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{field}: expected a number, got {value!r}")
    return float(value)


def _integer(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{field}: expected an integer, got {value!r}")
    return value


def _optional_integer(field: str, value: Any) -> int | None:
    return None if value is None else _integer(field, value)


def _flag(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"{field}: expected true or false, got {value!r}")
    return value


def _stop_strings(field: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) and s for s in strings):
        raise BadRequest(f"{field}: expected a non-empty string or a list of them, got {value!r}")
    return tuple(strings)


SAMPLING_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "temperature": _number,
    "top_p": _number,
    "top_k": _integer,
    "min_p": _number,
    "max_new_tokens": _integer,
    "stop": _stop_strings,
    "seed": _optional_integer,
    "ignore_eos": _flag,
}


def _unknown(field: str, allowed) -> BadRequest:
    return BadRequest(f"{field}: not supported by the reference server -- use only {', '.join(allowed)}")


def parse_sampling_params(data: Any) -> SamplingParams:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadRequest(f"sampling_params: expected an object, got {data!r}")
    values = dict(SGLANG_DEFAULTS)
    for name, value in data.items():
        if name not in SAMPLING_FIELDS:
            raise _unknown(f"sampling_params.{name}", SAMPLING_FIELDS)
        values[name] = SAMPLING_FIELDS[name](f"sampling_params.{name}", value)
    try:
        return SamplingParams(**values)
    except ValueError as exc:  # range checks; the message starts with the field name
        raise BadRequest(f"sampling_params.{exc}") from None


def _prompt_ids(payload: dict[str, Any], tokenizer, vocab_size: int) -> list[int]:
    if ("text" in payload) == ("input_ids" in payload):
        raise BadRequest("text, input_ids: give exactly one of them (a single prompt; batches are not supported)")
    if "text" in payload:
        text = payload["text"]
        if not isinstance(text, str) or not text:
            raise BadRequest(f"text: expected a non-empty string, got {text!r}")
        return tokenizer(text)["input_ids"]  # like SGLang: no chat template, the tokenizer's own special tokens
    ids = payload["input_ids"]
    if not isinstance(ids, list) or not ids:
        raise BadRequest(f"input_ids: expected a non-empty list of token ids, got {ids!r}")
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise BadRequest(f"input_ids[{i}]: {token!r} is not a token id -- use integers in 0..{vocab_size - 1}")
    return ids


def parse_generate_request(body: bytes, tokenizer, vocab_size: int, max_positions: int, request_id: str) -> Request:
    """The engine request for a /generate body; raises BadRequest naming the offending field."""
    try:
        payload = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body: not JSON ({exc}) -- send a JSON object") from None
    if not isinstance(payload, dict):
        raise BadRequest(f"body: expected a JSON object, got {payload!r}")
    for name in payload:
        if name not in TOP_LEVEL_FIELDS:
            raise _unknown(name, TOP_LEVEL_FIELDS)
    params = parse_sampling_params(payload.get("sampling_params"))
    prompt_ids = _prompt_ids(payload, tokenizer, vocab_size)
    if len(prompt_ids) + params.max_new_tokens > max_positions:
        raise BadRequest(
            f"sampling_params.max_new_tokens: {params.max_new_tokens} new tokens after a "
            f"{len(prompt_ids)}-token prompt exceed the model's {max_positions} positions -- lower it"
        )
    return Request(prompt_ids, params, request_id)


def _finish_reason(output: RequestOutput, params: SamplingParams, tokenizer) -> dict[str, Any]:
    """SGLang's form: {"type": "length", "length": N} or {"type": "stop", "matched": token id | string}."""
    if output.finish_reason == "length":
        return {"type": "length", "length": params.max_new_tokens}
    if output.finish_reason == "eos":
        return {"type": "stop", "matched": output.output_ids[-1]}
    decoded = tokenizer.decode(output.output_ids)  # the engine matches stop strings on this text
    return {"type": "stop", "matched": next((s for s in params.stop if s in decoded), None)}


def generate_response(output: RequestOutput, params: SamplingParams, tokenizer) -> dict[str, Any]:
    verifies = len(output.accept_lengths)
    return {
        "text": output.text,
        "output_ids": output.output_ids,
        "meta_info": {
            "id": output.request_id,
            "prompt_tokens": len(output.prompt_ids),
            "completion_tokens": len(output.output_ids),
            "finish_reason": _finish_reason(output, params, tokenizer),
            "spec_verify_ct": verifies,
            # Mean committed tokens per verify step, bonus included (the first token comes from prefill).
            "spec_accept_length": sum(output.accept_lengths) / verifies if verifies else 0.0,
        },
    }
