"""The CPU harness's launcher refuses a server whose KV pool the host's free memory cut below what its
--max-total-tokens asked: SGLang on CPU only warns, and the requests then fail far from the cause."""

from __future__ import annotations

import os

import pytest

from harness.sglang_cpu import READY_PREFIX, launch, pool_shortfall

POOL = "[2026-12-07 21:13:51{rank}] max_total_num_tokens={n}, chunked_prefill_size=4096, max_prefill_tokens=16384, max_running_requests=4, context_len=8192, available_cpu_mem={gb} GB"  # noqa: E501


def test_a_pool_smaller_than_asked_is_named_with_the_memory_the_host_had():
    args = ["--model-path", "m", "--max-total-tokens", "8192", "--port", "1"]
    assert pool_shortfall(args, POOL.format(rank="", n=8192, gb=6.7)) is None
    said = pool_shortfall(args, "loading\n" + POOL.format(rank="", n=640, gb=0.84) + "\nready")
    assert said.startswith("SGLang sized its KV pool at 640 tokens, below --max-total-tokens 8192")
    assert "the host had 0.84 GB of memory free at start-up" in said
    # with tensor parallelism each rank may log its own pool: the smallest is the server's
    two_ranks = "\n".join(POOL.format(rank=f" TP{r}", n=n, gb=gb) for r, n, gb in ((0, 700, 5.2), (1, 512, 5.0)))
    assert pool_shortfall(["--max-total-tokens", "700"], two_ranks).startswith("SGLang sized its KV pool at 512 ")
    # nothing to compare: no cap asked, or no pool line (a launcher that is not SGLang's)
    assert pool_shortfall(["--port", "1"], POOL.format(rank="", n=640, gb=0.84)) is None
    assert pool_shortfall(args, "no pool line") is None


def test_the_launcher_stops_a_server_with_a_short_pool_and_says_why(tmp_path):
    root = tmp_path / "checkout"
    (root / "harness").mkdir(parents=True)
    (root / "harness" / "__init__.py").write_text("")
    pid_file = tmp_path / "pid"
    (root / "harness" / "sglang_cpu.py").write_text(
        "import os, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        f"print({POOL.format(rank='', n=640, gb=0.84)!r}, flush=True)\n"
        f"print({READY_PREFIX!r} + 'http://127.0.0.1:1', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "server.log"
    short = r"KV pool at 640 tokens, below --max-total-tokens 8192: the host had 0.84 GB"
    with pytest.raises(RuntimeError, match=short):
        launch(["--max-total-tokens", "8192"], log, timeout_s=60, cwd=root)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # stopped, not left holding memory
        os.kill(pid, 0)
