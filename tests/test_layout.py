"""The layout the README's Layout table describes is the layout of the code.

- the table names every `sglang_jetspec` package, in an order in which each package imports only the
  packages above it (lazy and TYPE_CHECKING imports count too);
- no modules of the project import each other in a loop;
- nothing in `sglang_jetspec` imports `shadow` or `controller` (they sit above it), and nothing of the
  product imports `harness` (what bench scripts and tests share) or `bench`;
- no module outside tests/ imports from tests/ or puts a tests/ path on sys.path, and no bench script
  edits sys.path at all (they run as `python -m bench.<name>` against the installed packages);
- every module the table names exists and imports, and so does every module of the tree;
- every `jetspec` subcommand, every console script and every documented `python -m` path answers `--help`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("sglang_jetspec", "shadow", "controller", "policies", "ops", "harness")
PRODUCT_PACKAGES = ("sglang_jetspec", "shadow", "controller", "policies", "ops")  # what a deployment runs
README = (ROOT / "README.md").read_text()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PROJECT_PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


MODULES = project_modules()


def imported_modules(name: str, path: Path) -> set[str]:
    """Project modules that `name` imports anywhere in its body (`from pkg import module` included)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
                if node.level
                else node.module
            )
            # `from . import module` names modules, not the package that is already importing them
            candidates = ([base] if node.module else []) + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {c for c in candidates if c in MODULES and c != name}
    return found


GRAPH = {name: imported_modules(name, path) for name, path in MODULES.items()}


def documented_packages() -> list[str]:
    """`sglang_jetspec/<package>/` rows of the README's Layout table, top to bottom."""
    return re.findall(r"^\| `sglang_jetspec/(\w+)/` \|", README, flags=re.M)


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "sglang_jetspec" and len(parts) > 2 else None


def test_the_table_names_every_package():
    on_disk = {p.parent.name for p in (ROOT / "sglang_jetspec").glob("*/__init__.py")}
    assert set(documented_packages()) == on_disk
    loose = sorted(p.name for p in (ROOT / "sglang_jetspec").glob("*.py") if p.name != "__init__.py")
    assert loose == ["sglang_plugin.py"], "a module loose at sglang_jetspec/'s top level: give it a package"


def test_packages_import_only_the_packages_above_them():
    order = {name: i for i, name in enumerate(documented_packages())}
    upward = [
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if package_of(a) and package_of(b) and order[package_of(b)] > order[package_of(a)]
    ]
    assert upward == []


def test_sglang_jetspec_never_imports_shadow_or_controller():
    reaching_up = [
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        if a.startswith("sglang_jetspec")
        for b in targets
        if b.split(".")[0] in ("shadow", "controller")
    ]
    assert reaching_up == []


def test_the_product_never_imports_harness_or_bench():
    reaching_up = [
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        if a.split(".")[0] in PRODUCT_PACKAGES
        for b in targets
        if b.split(".")[0] in ("harness", "bench")
    ]
    assert reaching_up == []
    for name, path in MODULES.items():  # bench is not a project package: read the imports themselves
        if name.split(".")[0] in PRODUCT_PACKAGES:
            assert "bench" not in top_level_imports(path.read_text()), name


# ---- nothing outside tests/ reaches into tests/ ----

TESTS_PATH = re.compile(r"(^|[/\\])tests($|[/\\])")
# modules importable by bare name only where pytest (or a sys.path edit) puts a tests/ folder on the path;
# the stand-ins under stub/ carry real packages' names (sgl_kernel) and are left out
TEST_MODULE_NAMES = frozenset(
    p.stem for p in (ROOT / "tests").rglob("*.py") if "stub" not in p.relative_to(ROOT / "tests").parts
)


def python_files_outside_tests(root: Path = ROOT) -> list[Path]:
    """Every .py of the checkout outside tests/, virtualenvs, VCS and build folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        top = Path(dirpath) == root
        dirnames[:] = [
            d
            for d in dirnames
            if not (d.startswith(".") or d.endswith(".egg-info") or d in ("__pycache__", "build", "dist"))
            and not (top and d in ("tests", "venv"))
        ]
        found += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    return sorted(found)


def top_level_imports(source: str) -> set[str]:
    """Top-level names of the absolute imports in `source`."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _is_sys_path(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys"


def sys_path_edits(source: str) -> list[tuple[int, ast.AST]]:
    """(line, node) of each statement or call in `source` that changes sys.path (insert / append / extend /
    remove, assignment to it or a slice of it, site.addsitedir)."""
    edits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "addsitedir" or (
                node.func.attr in ("insert", "append", "extend", "remove") and _is_sys_path(node.func.value)
            ):
                edits.append((node.lineno, node))
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_sys_path(t) for t in targets):
                edits.append((node.lineno, node))
    return edits


def reaches_into_tests(source: str) -> list[str]:
    """What in `source` imports from tests/ (`tests.x`, or a module found only in a tests/ folder) or puts a
    tests/ path on sys.path, as `line N: what`. A path counts when a string naming a `tests` folder is in
    the edit, directly or through a module-level name it uses."""
    tree = ast.parse(source)
    assigned = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def names_tests(node: ast.AST, seen: frozenset = frozenset()) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and TESTS_PATH.search(sub.value):
                return True
            if isinstance(sub, ast.Name) and sub.id in assigned and sub.id not in seen:
                if names_tests(assigned[sub.id], seen | {sub.id}):
                    return True
        return False

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        found += [
            f"line {node.lineno}: imports {m}"
            for m in modules
            if m.split(".")[0] == "tests" or m.split(".")[0] in TEST_MODULE_NAMES
        ]
    found += [f"line {line}: sys.path gets a tests/ path" for line, edit in sys_path_edits(source) if names_tests(edit)]
    return sorted(found, key=lambda text: int(text.split()[1].rstrip(":")))


@pytest.mark.parametrize(
    "source",
    [
        "import tests.sglang_cpu.launch",
        "from tests.sglang_cpu import launch",
        "import e2e_client",
        "from test_controller_e2e import drive_load",
        "import sys\nsys.path.insert(0, 'tests/sglang_cpu')",
        "import sys\nfrom pathlib import Path\nsys.path.append(str(Path(__file__).parent / 'tests'))",
        "import sys\nREPO = '.'\nHERE = REPO + '/tests/sglang_cpu'\nsys.path[:0] = [HERE]",
        "import site\nsite.addsitedir('../tests')",
    ],
)
def test_the_tests_reach_finder_finds_each_way_in(source):
    assert len(reaches_into_tests(source)) == 1, source


def test_the_tests_reach_finder_lets_the_rest_pass():
    assert reaches_into_tests("import harness.sglang_cpu\nfrom sglang_jetspec import cli\nimport testing") == []
    # a child's environment is not this process's sys.path (the harness launcher names the stand-in so)
    assert reaches_into_tests("import os\nenv = {'PYTHONPATH': 'tests/sglang_cpu/stub'}") == []
    assert reaches_into_tests("import sys\nsys.path.insert(0, 'vendor')") == []


def test_the_file_walk_leaves_tests_and_virtualenvs_out(tmp_path):
    for rel in ("bench/a.py", "tests/b.py", "tests/c/d.py", ".venv/lib/e.py", "harness/tests/f.py", "x.egg-info/g.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    found = {p.relative_to(tmp_path).as_posix() for p in python_files_outside_tests(tmp_path)}
    assert found == {"bench/a.py", "harness/tests/f.py"}


def test_nothing_outside_tests_reaches_into_tests():
    files = python_files_outside_tests()
    assert ROOT / "harness" / "sglang_cpu.py" in files and ROOT / "bench" / "sglang_cpu_compare.py" in files
    reaching = {str(path.relative_to(ROOT)): found for path in files if (found := reaches_into_tests(path.read_text()))}
    assert reaching == {}


def test_bench_scripts_leave_sys_path_alone():
    edits = {
        str(path.relative_to(ROOT)): [line for line, _ in found]
        for path in sorted((ROOT / "bench").rglob("*.py"))
        if (found := sys_path_edits(path.read_text()))
    }
    assert edits == {}, "run the script as `python -m bench.<name>` and import by package name"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = 1, path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    assert find_cycle(GRAPH) is None


def documented_modules() -> list[str]:
    """`name.py` mentions in each package row of the Layout table, as module paths."""
    modules = []
    for package, row in re.findall(r"^\| `sglang_jetspec/(\w+)/` \|(.*)$", README, flags=re.M):
        modules += [f"sglang_jetspec.{package}.{stem}" for stem in re.findall(r"`(\w+)\.py`", row)]
    return modules


def test_the_table_names_modules_that_exist():
    missing = [m for m in documented_modules() if m not in MODULES]
    assert documented_modules() and missing == []


def _needs_sglang(module: str) -> bool:
    return module.startswith("sglang_jetspec.adapter.") and importlib.util.find_spec("sglang") is None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.endswith("__main__")))  # those run below
def test_every_module_imports(module):
    if _needs_sglang(module):
        pytest.skip("SGLang not installed")
    importlib.import_module(module)


def subcommand_paths(parser, prefix=()) -> list[tuple[str, ...]]:
    import argparse

    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths += subcommand_paths(child, prefix + (name,))
    return paths


def test_every_jetspec_subcommand_answers_help(capsys):
    from sglang_jetspec.cli.main import build_parser

    paths = subcommand_paths(build_parser())
    assert {("generate",), ("bench",), ("serve",), ("train",), ("shadow", "run"), ("policy", "check")} <= set(paths)
    for path in paths:
        from sglang_jetspec.cli import main

        with pytest.raises(SystemExit) as exit_info:
            main([*path, "--help"])
        assert exit_info.value.code == 0, path
        assert "usage: jetspec" in capsys.readouterr().out


DOCUMENTED_ENTRY_POINTS = [
    ["jetspec"],
    ["jetspec-controller"],
    [sys.executable, "-m", "sglang_jetspec.cli"],
    [sys.executable, "-m", "controller"],
    [sys.executable, "-m", "policies"],
    [sys.executable, "-m", "ops.catalogue"],
    [sys.executable, "-m", "sglang_jetspec.train.code_prompts"],
    [sys.executable, "-m", "sglang_jetspec.train.chat_prompts"],
    [sys.executable, "-m", "harness.sglang_cpu"],
    [sys.executable, "-m", "bench.sglang_cpu_compare"],
]


def test_the_documented_python_m_paths_are_these():
    packages = "sglang_jetspec|controller|policies|ops|shadow|harness|bench"
    documented = set(re.findall(rf"python3? -m ((?:{packages})[\w.]*)", README))
    listed = {argv[2] for argv in DOCUMENTED_ENTRY_POINTS if argv[0] == sys.executable}
    assert documented <= listed


@pytest.mark.parametrize(
    "argv", DOCUMENTED_ENTRY_POINTS, ids=lambda argv: " ".join(argv[1:] if argv[0] == sys.executable else argv)
)
def test_console_scripts_and_python_m_paths_answer_help(argv):
    if argv[0] != sys.executable:
        argv = [str(Path(sys.executable).parent / argv[0])]
    done = subprocess.run([*argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


# What `--help` imports: the parsers only. torch and transformers take seconds to import (10 s for
# `jetspec --help` before the training settings left the training code).
HELP_WITHOUT_TORCH = """
import sys
from sglang_jetspec.cli.main import build_parser
import bench.sglang_cpu_compare

parser = build_parser()
for heavy in ("torch", "transformers"):
    assert heavy not in sys.modules, heavy
# --device auto resolves once a command line is parsed, to what torch sees
args = parser.parse_args(["bench", "--json", "out.json"])
import torch
assert args.device == ("cuda" if torch.cuda.is_available() else "cpu"), args.device
assert parser.parse_args(["bench", "--json", "out.json", "--device", "cpu"]).device == "cpu"
"""


def test_help_loads_no_torch_and_device_auto_resolves_at_parse():
    done = subprocess.run([sys.executable, "-c", HELP_WITHOUT_TORCH], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
