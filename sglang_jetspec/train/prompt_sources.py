"""The default training prompts, built offline and never from HumanEval.

Two sources: (1) tasks derived from documented functions of Python's standard library, as raw
code-completion prompts (signature + docstring) and as chat requests; (2) general instructions from
small template generators. Deterministic for a given seed.
"""

from __future__ import annotations

import importlib
import inspect
import random

STDLIB_MODULES = (
    "string",
    "textwrap",
    "itertools",
    "functools",
    "math",
    "statistics",
    "collections",
    "heapq",
    "bisect",
    "re",
    "json",
    "os.path",
    "random",
    "datetime",
    "fractions",
    "decimal",
    "operator",
    "copy",
    "difflib",
    "shlex",
    "html",
    "urllib.parse",
    "base64",
    "binascii",
    "zlib",
    "csv",
    "calendar",
    "colorsys",
    "glob",
    "fnmatch",
    "ipaddress",
    "uuid",
    "secrets",
    "struct",
    "enum",
    "dataclasses",
    "keyword",
    "unicodedata",
    "pathlib",
    "shutil",
    "tempfile",
    "argparse",
    "logging",
    "pprint",
    "reprlib",
    "graphlib",
    "sched",
    "queue",
    "contextlib",
    "abc",
    "numbers",
    "cmath",
    "array",
    "weakref",
    "types",
    "inspect",
    "ast",
    "tokenize",
    "email.utils",
    "mimetypes",
    "quopri",
    "uu",
    "wave",
    "plistlib",
    "configparser",
    "netrc",
    "gettext",
    "locale",
)

TOPICS = (
    "recursion",
    "list comprehensions",
    "dictionaries",
    "binary search",
    "hash tables",
    "sorting algorithms",
    "unit testing",
    "exceptions",
    "generators",
    "decorators",
    "context managers",
    "regular expressions",
    "file input and output",
    "classes and inheritance",
    "dynamic programming",
    "linked lists",
    "stacks and queues",
    "string formatting",
    "type hints",
    "iterators",
    "closures",
    "big-O notation",
    "graph traversal",
    "caching",
    "immutability",
    "floating point rounding",
    "unicode strings",
    "command-line arguments",
    "logging",
    "JSON",
)
TASKS = (
    "reverse the words in a sentence",
    "count vowels in a string",
    "check whether a number is prime",
    "merge two sorted lists",
    "find the second largest number in a list",
    "remove duplicates while keeping order",
    "compute the factorial of n",
    "flatten a nested list",
    "check whether a string is a palindrome",
    "compute the greatest common divisor of two integers",
    "convert Celsius to Fahrenheit",
    "rotate a list by k",
    "count word frequencies in a text",
    "transpose a matrix",
    "find all anagrams of a word in a list",
    "compute the running average of a list",
    "parse a date string in ISO format",
    "validate an email address",
    "group items by a key function",
    "compute Fibonacci numbers iteratively",
    "find the longest common prefix",
    "sum the digits of an integer",
    "check balanced parentheses",
    "convert a Roman numeral to an integer",
    "compute the median of a list",
    "chunk a list into pieces of size n",
    "capitalize every word in a string",
)
GENERAL = (
    "Explain {topic} in Python to a beginner, with a short example.",
    "What are common mistakes people make with {topic}?",
    "Write a Python function to {task}. Include a docstring and a short test.",
    "Write a Python function that can {task}, then explain how it works.",
    "Give three tips for writing clean code that uses {topic}.",
    "Compare two ways to {task} in Python and say which is faster.",
)


def _first_paragraph(doc: str) -> str:
    return inspect.cleandoc(doc).split("\n\n")[0].strip()


def stdlib_functions() -> list[tuple[str, str, str]]:
    """(qualified name, signature, first docstring paragraph) of documented pure-Python stdlib functions."""
    found = []
    for module_name in STDLIB_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not inspect.isfunction(obj) or obj.__module__ != module.__name__:
                continue
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < 30:
                continue
            try:
                signature = str(inspect.signature(obj))
            except (TypeError, ValueError):
                continue
            found.append((f"{module_name}.{name}", f"{name}{signature}", _first_paragraph(doc)))
    return found


def default_prompt_records(seed: int = 0, general: int = 240) -> list[dict]:
    """Raw completion and chat prompts from the stdlib, plus `general` templated instructions."""
    records: list[dict] = []
    for qualified, signature, doc in stdlib_functions():
        indented = "\n    ".join(doc.splitlines())
        records.append(
            {"prompt": f'def {signature}:\n    """{indented}\n    """\n', "source": f"stdlib-completion:{qualified}"}
        )
        records.append(
            {
                "messages": [{"role": "user", "content": f"Write a Python function `{signature}`.\n{doc}"}],
                "source": f"stdlib-chat:{qualified}",
            }
        )
    rng = random.Random(seed)
    for i in range(general):
        template = GENERAL[i % len(GENERAL)]
        text = template.format(topic=rng.choice(TOPICS), task=rng.choice(TASKS))
        records.append({"messages": [{"role": "user", "content": text}], "source": "general"})
    return records
