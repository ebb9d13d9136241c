"""The spool: JSONL files of shadow records, written by workers and read by the checker.

Crash safety: a writer opens a fresh file per process (never appends to an old one) and writes each
record as one line with a single write() followed by fsync, so a crash can only leave a torn *last*
line in its own file. Readers skip such a line and count it; every earlier line stays intact.
Rotation: a file is closed once it passes `max_bytes`; only the newest `max_files` are kept, so a
checker that stops reading cannot fill the disk.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from shadow.record import ShadowRecord

SUFFIX = ".jsonl"


class SpoolWriter:
    """Appends records to the current spool file; not thread-safe (the tee's writer thread owns it)."""

    def __init__(self, directory: str | Path, max_bytes: int = 64 << 20, max_files: int = 16):
        if max_bytes < 1 or max_files < 1:
            raise ValueError(f"max_bytes={max_bytes}, max_files={max_files}: both must be >= 1")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._max_bytes, self._max_files = max_bytes, max_files
        self._fd: int | None = None
        self._size = 0
        self._sequence = 0

    def write(self, record: ShadowRecord) -> None:
        self.write_line(record.model_dump_json())

    def write_line(self, line: str) -> None:
        data = (line + "\n").encode()
        if self._fd is None:
            self._open()
        os.write(self._fd, data)  # one write per record: a crash tears at most this line
        os.fsync(self._fd)
        self._size += len(data)
        if self._size >= self._max_bytes:
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> None:
        # Names sort by creation time; the pid keeps concurrent writers (SGLang ranks) apart.
        name = f"shadow-{time.time_ns():020d}-{os.getpid()}-{self._sequence:04d}{SUFFIX}"
        self._sequence += 1
        self._fd = os.open(self.directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._size = 0
        for old in spool_files(self.directory)[:-self._max_files]:
            old.unlink(missing_ok=True)


def spool_files(directory: str | Path) -> list[Path]:
    return sorted(Path(directory).glob(f"shadow-*{SUFFIX}"))


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
        return {"offsets": {p.name: o for p, o in self._offsets.items()}, "lines": {p.name: n for p, n in self._lines.items()},
                "torn": sorted(p.name for p in self._torn), "torn_lines": self.torn_lines}

    @classmethod
    def from_json(cls, directory: str | Path, data: dict) -> SpoolReader:
        d = Path(directory)
        return cls(d, torn_lines=data["torn_lines"], _offsets={d / k: v for k, v in data["offsets"].items()},
                   _lines={d / k: v for k, v in data["lines"].items()}, _torn={d / k for k in data["torn"]})


def read_spool(directory: str | Path) -> tuple[list[ShadowRecord], SpoolReader]:
    """Every complete record in a spool directory, plus the reader (torn / bad line counts)."""
    reader = SpoolReader(Path(directory))
    return reader.poll(final=True), reader
