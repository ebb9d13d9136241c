"""Optional full regeneration of greedy requests on a non-speculative SGLang-compatible endpoint.

Greedy output is a function of the prompt, so the endpoint's own generation must equal what the
speculative server emitted; the report shows both side by side from the first difference.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_jetspec.spool.record import ShadowRecord
from shadow.target_logits import post_generate
from shadow.window import RegenerationRow


class Regenerator:
    def __init__(self, url: str, tokenizer=None, timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer  # decodes the original ids for the side-by-side view, when available
        self.timeout_s = timeout_s

    def regenerate(self, record: ShadowRecord) -> dict:
        body = {
            "input_ids": record.prompt_ids,
            "sampling_params": {
                "temperature": 0.0,
                "max_new_tokens": len(record.output_ids) or 1,
                "ignore_eos": record.sampling.ignore_eos,
            },
        }
        return post_generate(self.url, body, self.timeout_s)

    def diff(self, records: Sequence[ShadowRecord]) -> list[RegenerationRow]:
        rows = []
        for record in records:
            if not record.sampling.greedy:
                continue
            reply = self.regenerate(record)
            regenerated = list(reply.get("output_ids", []))
            original = record.output_ids
            first = next((i for i, (a, b) in enumerate(zip(original, regenerated)) if a != b), None)
            if first is None and len(original) != len(regenerated):
                first = min(len(original), len(regenerated))
            rows.append(
                RegenerationRow(
                    request_id=record.request_id,
                    first_difference=first,
                    original_ids=original,
                    regenerated_ids=regenerated,
                    regenerated_text=reply.get("text"),
                    original_text=self.tokenizer.decode(original) if self.tokenizer is not None else None,
                )
            )
        return rows
