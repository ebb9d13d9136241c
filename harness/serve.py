"""`jetspec serve` (and the controller) as subprocesses on loopback, and closed-loop clients driving the
server with /generate requests (bench/controller_probe_bias.py and tests/controller/test_controller_e2e.py:
the controller end-to-end workload)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .client import post


@dataclass
class ServeProcess:
    popen: subprocess.Popen
    stdout: Path
    stderr: Path

    def lines(self) -> list[str]:
        return self.stdout.read_text().splitlines()

    def log_tail(self) -> str:
        return self.stderr.read_text()[-3000:]

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


def start_module(module: str, args: list[str], log_dir: Path, env: dict | None = None, name: str = "") -> ServeProcess:
    """`python -m module args`, its stdout and stderr in `log_dir` (`name`.out / .err, by default the
    module's name); `env` adds variables."""
    name = name or module
    stdout, stderr = log_dir / f"{name}.out", log_dir / f"{name}.err"
    with open(stdout, "w") as out, open(stderr, "w") as err:
        popen = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=out,
            stderr=err,
        )
    return ServeProcess(popen, stdout, stderr)


def start_serve(args: list[str], log_dir: Path, env: dict | None = None, name: str = "serve") -> ServeProcess:
    """`python -m sglang_jetspec.cli serve args`, its stdout and stderr in `log_dir`; `env` adds variables."""
    return start_module("sglang_jetspec.cli", ["serve", *args], log_dir, env, name)


def start_controller(
    policy: Path, urls: list[str], admin_key_env: str, log_dir: Path, *flags: str, env: dict | None = None
) -> ServeProcess:
    """`python -m controller` driving the servers at `urls` with the policy file `policy`, their admin key
    in $admin_key_env, no /metrics of its own, then `flags`: its decisions (JSON lines) in controller.out."""
    servers = [arg for url in urls for arg in ("--server", url)]
    args = ["--policy", str(policy), *servers, "--admin-key-env", admin_key_env, "--metrics-port", "0", *flags]
    return start_module("controller", args, log_dir, env)


def wait_for_url(server: ServeProcess, timeout_s: float = 150.0) -> str:
    """The URL `jetspec serve` prints once it listens; RuntimeError if it exits or stays silent."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        urls = [line for line in server.lines() if line.startswith("http://")]
        if urls:
            return urls[0]
        if server.popen.poll() is not None:
            raise RuntimeError(f"jetspec serve exited:\n{server.log_tail()}")
        time.sleep(0.5)
    raise RuntimeError(f"jetspec serve printed no URL within {timeout_s:.0f} s:\n{server.log_tail()}")


def drive_load(
    url: str,
    payloads: list[dict],
    clients: int,
    done: Callable[[], bool],
    max_s: float,
    timeout_s: float = 120.0,
) -> None:
    """`clients` closed-loop clients (each sends its next /generate body when the last one returns),
    cycling through `payloads`, until `done()` or `max_s`; RuntimeError if any request fails."""
    stop = threading.Event()
    failures: list[str] = []

    def client(i: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                status, reply = post(f"{url}/generate", payloads[(i + n) % len(payloads)], timeout=timeout_s)
            except OSError as exc:
                status, reply = 0, str(exc)
            if status != 200:
                failures.append(f"client {i}: {status} {str(reply)[:300]}")
                return
            n += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline and not done() and not failures:
        time.sleep(1.0)
    stop.set()
    for thread in threads:
        thread.join(timeout_s)
    if failures:
        raise RuntimeError(f"load failed: {failures}")
