"""The spool's write side: JSONL files of shadow records, one fresh file per writing process.

Crash safety: a writer never appends to an old file and writes each record as one line with a single
write() followed by fsync, so a crash can only leave a torn *last* line in its own file; the checker's
reader (shadow/spool.py) skips such a line and counts it. Rotation: a file is closed once it passes
`max_bytes`; only the newest `max_files` are kept, so a checker that stops reading cannot fill the disk.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .record import ShadowRecord

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
        for old in spool_files(self.directory)[: -self._max_files]:
            old.unlink(missing_ok=True)


def spool_files(directory: str | Path) -> list[Path]:
    return sorted(Path(directory).glob(f"shadow-*{SUFFIX}"))
