"""The spool and the tee: crash safety, rotation, never blocking, metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from prometheus_client import CollectorRegistry, generate_latest

from sglang_jetspec.spool.record import RecordSampling, ShadowRecord
from sglang_jetspec.spool.tee import ShadowTee
from sglang_jetspec.spool.writer import SpoolWriter, spool_files
from shadow.spool import SpoolReader, read_spool


def record(i: int) -> ShadowRecord:
    return ShadowRecord(
        request_id=str(i),
        model="m",
        prompt_ids=[1, 2, 3],
        output_ids=list(range(i % 7 + 1)),
        sampling=RecordSampling(temperature=0.7, top_p=0.9, top_k=-1, min_p=0.0, seed=i, max_new_tokens=8),
        finish_reason="length",
        started_at=1.0,
        finished_at=2.0,
    )


def test_truncated_mid_line_keeps_earlier_records(tmp_path):
    writer = SpoolWriter(tmp_path)
    for i in range(5):
        writer.write(record(i))
    writer.close()
    (path,) = spool_files(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 17])  # the 5th line loses its end, newline included
    records, reader = read_spool(tmp_path)
    assert [r.request_id for r in records] == ["0", "1", "2", "3"]
    assert records[3] == record(3)
    assert reader.torn_lines == 1


def test_killed_writer_leaves_only_complete_records(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from tests.shadow.test_spool import record
        from sglang_jetspec.spool.writer import SpoolWriter
        writer = SpoolWriter({str(tmp_path)!r}, max_bytes=4096, max_files=1_000_000)  # rotate, never delete
        i = 0
        while True:
            writer.write(record(i)); i += 1
            if i == 20: print("ready", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    records, reader = read_spool(tmp_path)
    assert len(records) >= 20 and reader.torn_lines <= 1 and not reader.bad_lines
    assert [r.request_id for r in records] == [str(i) for i in range(len(records))]  # none lost, in order
    assert all(r == record(int(r.request_id)) for r in records)
    assert len(spool_files(tmp_path)) > 1  # rotated by size


def test_rotation_keeps_newest_files_and_reader_resumes(tmp_path):
    writer = SpoolWriter(tmp_path, max_bytes=1, max_files=3)  # one record per file
    for i in range(5):
        writer.write(record(i))
    writer.close()
    assert len(spool_files(tmp_path)) == 3
    reader = SpoolReader(tmp_path)
    assert [r.request_id for r in reader.poll()] == ["2", "3", "4"]
    writer.write(record(5))
    writer.close()
    resumed = SpoolReader.from_json(tmp_path, reader.to_json())
    assert [r.request_id for r in resumed.poll()] == ["5"]


def test_follow_mode_waits_for_an_unfinished_last_line(tmp_path):
    writer = SpoolWriter(tmp_path)
    writer.write(record(0))
    fd_path = spool_files(tmp_path)[0]
    with open(fd_path, "ab") as f:
        f.write(record(1).model_dump_json().encode()[:20])  # a writer mid-line
    reader = SpoolReader(tmp_path)
    assert [r.request_id for r in reader.poll()] == ["0"] and reader.torn_lines == 0
    with open(fd_path, "ab") as f:
        f.write(record(1).model_dump_json().encode()[20:] + b"\n")
    assert [r.request_id for r in reader.poll()] == ["1"] and reader.torn_lines == 0


class _StuckWriter(SpoolWriter):
    def __init__(self, directory, release: threading.Event):
        super().__init__(directory)
        self.release = release

    def write(self, rec):
        self.release.wait()
        super().write(rec)


def test_tee_never_blocks_and_counts_drops(tmp_path):
    release = threading.Event()
    registry = CollectorRegistry()
    tee = ShadowTee(_StuckWriter(tmp_path, release), sample_rate=1.0, registry=registry, capacity=2).start()
    started = time.perf_counter()
    accepted = [tee.offer(record(i)) for i in range(10)]
    assert time.perf_counter() - started < 0.5
    assert accepted.count(False) >= 7  # 2 queued, at most 1 taken by the stuck writer
    release.set()
    tee.close()
    records, _ = read_spool(tmp_path)
    page = generate_latest(registry).decode()
    assert f"jetspec_shadow_spooled_total {float(len(records))}" in page
    assert f"jetspec_shadow_spool_dropped_total {float(accepted.count(False))}" in page


def test_sample_rate_is_respected(tmp_path):
    import random

    tee = ShadowTee(SpoolWriter(tmp_path), sample_rate=0.1, rng=random.Random(0))
    share = sum(tee.sampled() for _ in range(20000)) / 20000
    assert 0.09 < share < 0.11
    assert not any(ShadowTee(SpoolWriter(tmp_path), 0.0).sampled() for _ in range(1000))
