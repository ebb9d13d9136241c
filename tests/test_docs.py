"""The README and docs/ hold together: every relative link resolves (to a file, and to a heading where it
names one), the README stays short, and every command the README shows answers `--help`."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "bench/results/INDEX.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a document's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for heading in re.findall(r"^#+\s+(.*)$", markdown, flags=re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document):
    broken = []
    for target in relative_links(document):
        file_part, _, anchor = target.partition("#")
        resolved = (document.parent / file_part).resolve() if file_part else document
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert broken == [], broken


def test_the_link_checker_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](page.md#title) [gone](missing.md) [web](https://example.com)\n")
    assert relative_links(page) == ["page.md#title", "missing.md"]
    assert "title" in heading_anchors(page.read_text())


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= 200


def readme_commands() -> list[list[str]]:
    """The program (and subcommands) of every command the README shows: indented code lines and inline
    spans that start with `jetspec`, `python -m` or `python <script>`, up to the first argument."""
    text = re.sub(r"```.*?```", "", README.read_text(), flags=re.S).replace("\\\n", " ")
    candidates = re.findall(r"^ {4}(.+)$", text, flags=re.M) + re.findall(r"`([^`\n]+)`", text)
    commands = set()
    for line in candidates:
        words = shlex.split(line.split("#")[0]) if line.strip() else []
        if words[:1] == ["jetspec"]:
            program = ["jetspec", *_leading_words(words[1:])]
        elif words[:2] in (["python", "-m"], ["python3", "-m"]) and len(words) > 2:
            program = ["-m", words[2]]
        elif words[:1] in (["python"], ["python3"]) and len(words) > 1 and words[1].endswith(".py"):
            program = [words[1]]
        else:
            continue
        commands.add(tuple(program))
    return sorted(list(c) for c in commands)


def _leading_words(words: list[str]) -> list[str]:
    out = []
    for word in words:
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        out.append(word)
    return out


def test_the_readme_shows_its_main_commands():
    shown = readme_commands()
    assert ["jetspec", "generate"] in shown and ["-m", "pytest"] in shown and ["-m", "controller"] in shown


@pytest.mark.parametrize("program", readme_commands(), ids=" ".join)
def test_every_readme_command_answers_help(program, capsys):
    if program[0] == "jetspec":  # in this process: the jetspec parser is already imported
        from sglang_jetspec.cli import main

        with pytest.raises(SystemExit) as exit_info:
            main([*program[1:], "--help"])
        assert exit_info.value.code == 0, program
        assert "usage: jetspec" in capsys.readouterr().out
        return
    if "sglang" in " ".join(program):
        pytest.importorskip("sglang")
    done = subprocess.run([sys.executable, *program, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()
