"""The operations files cannot drift from the code: every metric name, command and flag that
ops/ (runbook, catalogue, rules, dashboard, collector config, manifests) mentions exists.

Commands are checked against the real argparse parsers: `jetspec ...` (all sub-commands, including
`jetspec shadow run`), `python -m controller` / `jetspec-controller`, `python -m ops.catalogue`, and
SGLang's `python -m sglang.launch_server` (its server arguments; skipped without SGLang)."""

from __future__ import annotations

import argparse
import functools
import re

import pytest
from ops_support import OPS, PROMETHEUS_SERIES, code_series

TEXT_FILES = sorted(
    p
    for p in OPS.rglob("*")
    if p.is_file() and (p.suffix in {".md", ".yml", ".yaml", ".json"} or p.name == "Dockerfile")
)
# jetspec_ identifiers that are not metrics: the /set_internal_state payload key.
NOT_METRICS = {"jetspec_policy"}
# Program prefixes a command may start with -> parser factory name.
PROGRAMS = {
    "python -m controller": "controller",
    "python3 -m controller": "controller",
    "jetspec-controller": "controller",
    "python -m ops.catalogue": "catalogue",
    "python -m sglang.launch_server": "sglang",
    "python3 -m sglang.launch_server": "sglang",
    "jetspec": "jetspec",
}
# Not preceded by a word, path or `-n ` (kubectl's namespace "jetspec" is no command).
COMMAND = re.compile(
    r"(?<![\w./$-])(?<!-n )("
    + "|".join(re.escape(p) for p in sorted(PROGRAMS, key=len, reverse=True))
    + r")(?![\w.-])((?:[ \t]+[^\s`\"'|;)]+)*)"
)


@functools.cache
def parser(program: str) -> argparse.ArgumentParser:
    if program == "jetspec":
        from sglang_jetspec.cli.main import build_parser

        return build_parser()
    if program == "controller":
        from controller.cli import build_parser

        return build_parser()
    if program == "catalogue":
        from ops.catalogue import build_parser

        return build_parser()
    server_args = pytest.importorskip("sglang.srt.server_args", reason="SGLang not installed")
    p = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(p)
    return p


def options(p: argparse.ArgumentParser) -> set[str]:
    return {o for action in p._actions for o in action.option_strings}


def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in p._actions if isinstance(a, argparse._SubParsersAction)), {})


def all_parsers(p: argparse.ArgumentParser):
    yield p
    for sub in subcommands(p).values():
        yield from all_parsers(sub)


def mentions() -> list[tuple[str, str, str]]:
    """(file, program, argument text) of every command line in the ops files."""
    found: list[tuple[str, str, str]] = []
    for path in TEXT_FILES:
        text = path.read_text()
        if path.suffix == ".md":  # an inline code span may wrap: read it as one line
            text = re.sub(r"`[^`]+`", lambda span: " ".join(span.group(0).split()), text)
        # A program name alone ("jetspec" namespace, "jetspec-controller" Service) is a name, not a command.
        found += [(str(path.relative_to(OPS)), m.group(1), m.group(2)) for m in COMMAND.finditer(text) if m.group(2)]
    return found


MENTIONS = mentions()


def test_the_ops_files_mention_commands_of_every_program():
    assert {PROGRAMS[program] for _, program, _ in MENTIONS} == {"jetspec", "controller", "catalogue", "sglang"}


@pytest.mark.parametrize(("where", "program", "rest"), MENTIONS, ids=[f"{w}:{p}{r[:40]}" for w, p, r in MENTIONS])
def test_every_command_and_flag_mentioned_exists(where, program, rest):
    current = parser(PROGRAMS[program])
    words = [w.strip("[],.:") for w in rest.split()]
    path = [program]
    for word in words:
        choices = subcommands(current)
        if not choices or word.startswith("-"):
            break
        assert word in choices, f"{where}: `{' '.join(path)} {word}`: no such command (have {sorted(choices)})"
        current, path = choices[word], path + [word]
    for word in words:
        flag = word.split("=", 1)[0]
        if flag.startswith("--"):
            assert flag in options(current), f"{where}: `{' '.join(path)}` has no option {flag}"


def test_every_backticked_flag_in_the_runbook_exists_somewhere():
    known = set().union(
        *(
            options(p)
            for program in ("jetspec", "controller", "catalogue", "sglang")
            for p in all_parsers(parser(program))
        )
    )
    for path in TEXT_FILES:
        if path.suffix == ".md":
            for flag in re.findall(r"`(--[a-z][a-z0-9-]*)", path.read_text()):
                assert flag in known, f"{path.name}: {flag} is no option of jetspec, the controller or SGLang"


def metric_like_names(text: str) -> set[str]:
    return {t for t in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text) if "jetspec_" in t and t[0].islower()}


@pytest.mark.parametrize("path", TEXT_FILES, ids=[str(p.relative_to(OPS)) for p in TEXT_FILES])
def test_every_metric_name_mentioned_exists(path):
    from ops.catalogue import metric_entries

    known = code_series() | {e.family for e in metric_entries()} | PROMETHEUS_SERIES | NOT_METRICS
    unknown = metric_like_names(path.read_text()) - known
    assert not unknown, f"{path.relative_to(OPS)} mentions {sorted(unknown)}: not in any registry or recording rule"


def test_the_drift_checks_catch_a_typo():
    assert metric_like_names("see `jetspec_comitted_tokens_total`") - code_series() == {"jetspec_comitted_tokens_total"}
    ((_, program, rest),) = [
        (None, m.group(1), m.group(2)) for m in COMMAND.finditer("`jetspec serve --enable-tracing`")
    ]
    with pytest.raises(AssertionError, match="has no option --enable-tracing"):
        test_every_command_and_flag_mentioned_exists("x", program, rest)
