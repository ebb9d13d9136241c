"""The spool's read side: the checker polls the JSONL files that workers write (sglang_jetspec/spool/).

A reader remembers how far it got in every file; a last line without its newline is left for the
next poll while its file may still grow, and counted as torn once a newer file exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from sglang_jetspec.spool.record import ShadowRecord
from sglang_jetspec.spool.writer import spool_files


@dataclass
class SpoolReader:
    """Reads new complete records on each poll, remembering how far it got in every file.

    A last line without its newline is left for the next poll while its file may still grow; once
    a newer file exists (its writer rotated or died), it is torn: skipped and counted.
    """

    directory: Path
    torn_lines: int = 0
    bad_lines: list[str] = field(default_factory=list)  # "file:line: why" for lines that do not parse
    _offsets: dict[Path, int] = field(default_factory=dict)
    _lines: dict[Path, int] = field(default_factory=dict)
    _torn: set[Path] = field(default_factory=set)

    def poll(self, final: bool = False) -> list[ShadowRecord]:
        """New records since the last poll; `final`: no writer is left, so any unfinished line is torn."""
        files = spool_files(self.directory)
        records: list[ShadowRecord] = []
        for i, path in enumerate(files):
            records.extend(self._read_new(path, superseded=final or i < len(files) - 1))
        return records

    def _read_new(self, path: Path, superseded: bool) -> list[ShadowRecord]:
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:  # rotated away between listing and reading
            return []
        complete, newline, tail = data.rpartition(b"\n")
        if tail and superseded and path not in self._torn:
            self._torn.add(path)
            self.torn_lines += 1
        self._offsets[path] = offset + len(complete) + len(newline)
        out = []
        for raw in complete.split(b"\n") if newline else []:
            self._lines[path] = self._lines.get(path, 0) + 1
            if not raw.strip():
                continue
            try:
                out.append(ShadowRecord.model_validate_json(raw))
            except (ValidationError, json.JSONDecodeError, UnicodeDecodeError) as exc:
                self.bad_lines.append(f"{path.name}:{self._lines[path]}: {str(exc).splitlines()[0]}")
        return out

    def to_json(self) -> dict:
        """Progress per file (names; files are never rewritten, so offsets stay valid)."""
        return {
            "offsets": {p.name: o for p, o in self._offsets.items()},
            "lines": {p.name: n for p, n in self._lines.items()},
            "torn": sorted(p.name for p in self._torn),
            "torn_lines": self.torn_lines,
        }

    @classmethod
    def from_json(cls, directory: str | Path, data: dict) -> SpoolReader:
        d = Path(directory)
        return cls(
            d,
            torn_lines=data["torn_lines"],
            _offsets={d / k: v for k, v in data["offsets"].items()},
            _lines={d / k: v for k, v in data["lines"].items()},
            _torn={d / k for k in data["torn"]},
        )


def read_spool(directory: str | Path) -> tuple[list[ShadowRecord], SpoolReader]:
    """Every complete record in a spool directory, plus the reader (torn / bad line counts)."""
    reader = SpoolReader(Path(directory))
    return reader.poll(final=True), reader
