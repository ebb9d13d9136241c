"""The layout the README's Layout table describes is the layout of the code.

- the table names every `sglang_jetspec` package, in an order in which each package imports only the
  packages above it (lazy and TYPE_CHECKING imports count too);
- no modules of the project import each other in a loop;
- nothing in `sglang_jetspec` imports `shadow` or `controller` (they sit above it);
- every module the table names exists and imports, and so does every module of the tree;
- every `jetspec` subcommand, every console script and every documented `python -m` path answers `--help`.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("sglang_jetspec", "shadow", "controller", "policies", "ops")
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
]


def test_the_documented_python_m_paths_are_these():
    documented = set(re.findall(r"python3? -m ((?:sglang_jetspec|controller|policies|ops|shadow)[\w.]*)", README))
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
