"""A documented function rewritten as a HumanEval-shaped stub: a new descriptive name, a signature with
type hints, and a docstring cut to a summary, doctest examples, a description or an args section."""

from __future__ import annotations

import ast
import builtins
import inspect
import keyword
import random
import re
import textwrap
import warnings

from .doc_sources import HUMANEVAL_ENTRY_POINTS, DocFunction, clean_doc, doc_sections, doc_summary

STOPWORDS = frozenset(
    "a an the of to in on for and or is are be if by with from as at this that it its into given any all "
    "each which whether one two new this these those using use using".split()
)
VERBS_STRIPPED = ("returns", "return", "compute", "computes", "calculate", "calculates", "get", "gets")
MAX_DOC_LINES = 18
MAX_LINE = 100
_TYPE_HINTS = (
    (
        re.compile(
            r"^(s|text|string|name|prefix|suffix|sep|word|line|pattern|path|filename|fmt|chars|encoding|errors|sentence)$"
        ),
        "str",
    ),
    (
        re.compile(
            r"^(n|k|i|j|count|size|width|index|start|stop|step|base|length|num|depth|level|year|month|day|ndigits|maxsplit|seed)$"
        ),
        "int",
    ),
    (re.compile(r"^(x|y|z|value|alpha|beta|scale|tol|rtol|atol|threshold|ratio|p|q|rate)$"), "float"),
    (
        re.compile(r"^(numbers|values|items|seq|sequence|data|xs|lst|iterable|elements|lines|words|strings|arr|a)$"),
        "List[{elem}]",
    ),
    (re.compile(r"^(flag|strict|reverse|verbose|inplace|copy|keepdims|check)$"), "bool"),
    (re.compile(r"^(mapping|d|dct|table|counts|kwargs_dict)$"), "Dict[str, int]"),
)
EXAMPLE_NAMES = frozenset({"True", "False", "None", "np", "math", "x", "y", "a", "b", "s", "n", "data"})


def _uses_only(code: str, allowed: set[str], mode: str) -> ast.AST | None:
    try:
        tree = ast.parse(code, mode=mode)
    except SyntaxError:
        return None
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return tree if names <= allowed else None


def _doctest_examples(doc: str, fn: "DocFunction", new_name: str, limit: int) -> list[list[str]]:
    """Up to `limit` short doctest blocks: a call of the renamed function on literals (or on names one
    or two setup lines bind) and its 1-3 output lines; the original's calls rewritten to the new name."""
    lines = [line.strip() for line in doc.splitlines()]
    blocks: list[list[str]] = []
    setup: list[str] = []
    bound: set[str] = set()
    i = 0
    while i < len(lines) and len(blocks) < limit:
        if not lines[i].startswith(">>> "):
            setup, bound = ([], set()) if not lines[i] else (setup, bound)
            i += 1
            continue
        code = _rename_in_doc(lines[i][4:], fn, new_name)
        i += 1
        if i < len(lines) and lines[i].startswith("... "):
            while i < len(lines) and lines[i].startswith("... "):
                i += 1
            continue
        outputs = []
        while i < len(lines) and lines[i] and not lines[i].startswith(">>>"):
            outputs.append(lines[i])
            i += 1
        allowed = set(EXAMPLE_NAMES) | bound | {new_name}
        if len(code) + 4 > MAX_LINE or "doctest" in code or "import" in code or "random" in code:
            continue
        if not outputs:
            tree = _uses_only(code, allowed, "exec")
            if (
                tree is not None
                and len(setup) < 2
                and len(tree.body) == 1
                and isinstance(tree.body[0], ast.Assign)
                and all(isinstance(t, ast.Name) for t in tree.body[0].targets)
            ):
                setup.append(">>> " + code)
                bound |= {t.id for t in tree.body[0].targets}
            continue
        tree = _uses_only(code, allowed, "eval")
        if tree is None or len(outputs) > 3 or any(len(x) > MAX_LINE for x in outputs) or f"{new_name}(" not in code:
            continue
        blocks.append(setup + [">>> " + code] + outputs)
        setup, bound = [], set()
    return blocks


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z]+", text.lower()) if w not in STOPWORDS and len(w) > 1]


def descriptive_name(fn: DocFunction) -> str | None:
    words = _words(doc_summary(fn.doc).split(".")[0])
    while words and words[0] in VERBS_STRIPPED:
        words = words[1:]
    if len(words) < 2:
        return None
    return "_".join(words[:4])


def safe_name(name: str, taken: set[str]) -> str:
    name = re.sub(r"\W", "_", name).strip("_") or "function"
    if name[0].isdigit():
        name = "f_" + name
    candidate = name
    for suffix in ("", "_value", "_result", "_of", "_impl", "_v2", "_helper"):
        candidate = name + suffix
        if (
            candidate not in HUMANEVAL_ENTRY_POINTS
            and not keyword.iskeyword(candidate)
            and candidate not in taken
            and not hasattr(builtins, candidate)
        ):
            return candidate
    return candidate + "_fn"


KNOWN_TYPE_WORDS = frozenset(
    "int float str bool bytes list dict tuple set frozenset complex object None List Dict Tuple Set "
    "Optional Iterable Iterator Sequence Mapping Any Callable Union".split()
)
TYPING_WORDS = (
    "List",
    "Dict",
    "Tuple",
    "Set",
    "Optional",
    "Iterable",
    "Iterator",
    "Sequence",
    "Mapping",
    "Any",
    "Callable",
    "Union",
)


def _annotation(annotation) -> str | None:
    """A real annotation as source text, when it only names builtins and typing generics."""
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        text = annotation
    elif isinstance(annotation, type):
        text = annotation.__name__
    else:
        text = re.sub(r"\btyping\.", "", str(annotation))
    if (
        not re.fullmatch(r"[\w\[\], .|]+", text)
        or len(text) > 40
        or not set(re.findall(r"\w+", text)) <= KNOWN_TYPE_WORDS
    ):
        return None
    return text


def _guess_type(name: str, default, rng: random.Random, elems: tuple[str, ...] = ("int", "float", "str")) -> str | None:
    if default is not inspect.Parameter.empty and default is not None:
        if isinstance(default, bool):
            return "bool"
        if isinstance(default, int):
            return "int"
        if isinstance(default, float):
            return "float"
        if isinstance(default, str):
            return "str"
        return None
    for pattern, hint in _TYPE_HINTS:
        if pattern.match(name):
            return hint.format(elem=rng.choice(elems))
    return None


def _default_text(default) -> str | None:
    if default is inspect.Parameter.empty:
        return None
    text = repr(default)
    if len(text) > 30 or "<" in text or "\n" in text:
        return "None"
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if not re.fullmatch(r"[A-Za-z_][\w.]*", text):
            return "None"
    return text


def signature_text(fn: DocFunction, hints: bool, rng: random.Random) -> tuple[str, set[str]]:
    """The parameter list (a valid `def` header part) and the typing names it uses."""
    parts: list[str] = []
    typing_names: set[str] = set()
    kinds = [p.kind for p in fn.params]
    slash_after = max((i for i, k in enumerate(kinds) if k == inspect.Parameter.POSITIONAL_ONLY), default=None)
    star_written = False
    seen_default = False
    for i, p in enumerate(fn.params):
        if p.kind == inspect.Parameter.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star_written = True
            continue
        if p.kind == inspect.Parameter.VAR_KEYWORD:
            parts.append(f"**{p.name}")
            continue
        if p.kind == inspect.Parameter.KEYWORD_ONLY and not star_written:
            parts.append("*")
            star_written = True
        default = _default_text(p.default)
        if default is None and seen_default and p.kind != inspect.Parameter.KEYWORD_ONLY:
            default = "None"
        seen_default = seen_default or default is not None
        hint = (
            _annotation(p.annotation)
            if p.annotation is not inspect.Parameter.empty
            else (
                _guess_type(
                    p.name, p.default, rng, ("int", "float", "str") if fn.origin == "stdlib" else ("int", "float")
                )
                if hints
                else None
            )
        )
        piece = p.name + (f": {hint}" if hint else "")
        if default is not None:
            piece += f" = {default}" if hint else f"={default}"
        if hint:
            typing_names |= {w for w in re.findall(r"\w+", hint) if w in TYPING_WORDS}
        parts.append(piece)
        if slash_after is not None and i == slash_after and rng.random() < 0.3:
            parts.append("/")
    return ", ".join(parts), typing_names


def _return_hint(fn: DocFunction, rng: random.Random) -> str | None:
    explicit = _annotation(fn.returns)
    if explicit:
        return explicit
    summary = doc_summary(fn.doc).lower()
    if re.match(r"(return )?(true|whether)\b|.*\breturn true if\b|^(test|check)s? (if|whether)", summary):
        return "bool"
    if re.match(r"return (the )?(number|count|index|length)\b", summary):
        return "int"
    if re.match(r"return (a |the )?(list|sorted list)\b", summary):
        return rng.choice(("list", "List[int]", "List[str]"))
    if re.match(r"return (a |the )?(copy of the )?(string|str)\b", summary):
        return "str"
    if re.match(r"return (a |the )?(float|mean|average|median|variance|ratio)\b", summary):
        return "float"
    return None


def _rename_in_doc(text: str, fn: DocFunction, new: str) -> str:
    """Calls of the original become calls of the new name: np.mean(x) / stats.zscore(x) / mean(x) ->
    new(x); for a method, 'a b'.split() / s.split(',') -> new('a b') / new(s, ',')."""
    name = re.escape(fn.name)
    if "." in fn.qualname:
        receiver = r"""('[^']*'|"[^"]*"|\b[A-Za-z_]\w*)"""
        text = re.sub(rf"{receiver}\.{name}\(\)", rf"{new}(\1)", text)
        text = re.sub(rf"{receiver}\.{name}\(", rf"{new}(\1, ", text)
        return text
    return re.sub(rf"(?<![\w.])(?:[A-Za-z_]\w*\.)*{name}\(", f"{new}(", text)


def _docstring(fn: DocFunction, new_name: str, style: str, rng: random.Random) -> str | None:
    doc = clean_doc(fn.doc)
    sections = doc_sections(doc)
    description = [line for line in sections.get("", []) if not line.strip().startswith((".. ", ">>>", "..."))]
    paragraphs = "\n".join(description).strip().split("\n\n")
    body: list[str] = []
    if style == "summary":
        body = paragraphs[0].splitlines()
    elif style == "description":
        body = "\n\n".join(paragraphs[:2]).splitlines()
    elif style == "args":
        body = paragraphs[0].splitlines()
        params = sections.get("parameters", [])
        entries = []
        for line in params:
            match = re.match(r"^(\*{0,2}\w+)\s*:\s*(.*)$", line) if not line.startswith(" ") else None
            if match and len(entries) < 6:
                entries.append([match.group(1), match.group(2).strip()])
            elif entries and line.strip() and len(entries[-1]) == 2:
                entries[-1].append(line.strip())  # first description line only
        if entries:
            body += ["", "Args:"] + [f"    {e[0]}: {e[2] if len(e) > 2 else e[1]}" for e in entries]
    examples = (
        _doctest_examples(doc, fn, new_name, rng.randint(1, 3)) if style in ("summary", "examples", "args") else []
    )
    if style == "examples":
        body = paragraphs[0].splitlines()
        if not examples:
            return None
    if examples:
        if rng.random() < 0.3:
            body += ["", rng.choice(("Examples:", "For example:", "Example:"))]
        body += [line for block in examples for line in block]
    body = [line.rstrip() for line in body]
    while body and not body[-1]:
        body.pop()
    if not body or not body[0].strip():
        return None
    if len(body) > MAX_DOC_LINES:
        body = body[:MAX_DOC_LINES]
        while body and (body[-1].startswith(">>>") or not body[-1].strip()):
            body.pop()
    if any(len(line) > 2 * MAX_LINE for line in body):
        body = textwrap.fill(" ".join(body), MAX_LINE).splitlines() if not examples else None
        if body is None:
            return None
    text = "\n".join(("    " + line) if line else "" for line in body)
    opener = rng.choice(('""" ', '"""', '"""\n    '))
    return opener + text.lstrip() + '\n    """\n'


def completion_prompt(fn: DocFunction, new_name: str, rng: random.Random, style: str) -> str | None:
    """One HumanEval-shaped stub for `fn` under `new_name`, or None when it does not come out valid."""
    doc = _docstring(fn, new_name, style, rng)
    if doc is None:
        return None
    hints = rng.random() < 0.7
    params, typing_names = signature_text(fn, hints, rng)
    ret = _return_hint(fn, rng) if hints else None
    if ret:
        typing_names |= {w for w in re.findall(r"\w+", ret) if w in TYPING_WORDS}
    header = f"def {new_name}({params})" + (f" -> {ret}" if ret else "") + ":\n"
    imports = []
    if typing_names:
        imports.append(f"from typing import {', '.join(sorted(typing_names))}")
    if rng.random() < 0.25 and fn.origin == "stdlib" and fn.module not in ("builtins",) and "." not in fn.module:
        imports.insert(0, f"import {fn.module}")
    elif rng.random() < 0.3 and fn.origin == "thirdparty":
        root = fn.module.split(".")[0]
        imports.insert(
            0,
            {"numpy": "import numpy as np", "pandas": "import pandas as pd", "networkx": "import networkx as nx"}.get(
                root, f"import {root}"
            ),
        )
    prefix = ("\n".join(imports) + "\n\n\n") if imports else rng.choice(("", "\n\n", "\n"))
    prompt = prefix + header + "    " + doc
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(prompt + "    pass\n")
    except SyntaxError:
        return None
    return prompt
