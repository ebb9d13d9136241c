"""The CPU harness: the real SGLang 0.5.23 server on this CPU with the test-only sgl-kernel stand-in.

    python -m harness.sglang_cpu <any sglang.launch_server arguments>

runs `python -m sglang.launch_server` with the same arguments in its own process group, with SGLang's
CPU engine (SGLANG_USE_CPU_ENGINE=1) and the stand-in (`tests/sglang_cpu/stub` first on the server's
PYTHONPATH, switched on by JETSPEC_SGLANG_CPU_STANDIN=1; the scheduler and detokenizer processes inherit
both). It prints the server's URL once `/health` answers, and on SIGTERM / SIGINT stops the whole server
process group (SIGTERM, then SIGKILL after a grace period). Its exit status is the server's. `--help`
alone prints this text (SGLang's own arguments: `python -m sglang.launch_server --help`).

Nothing here is active in a normal install: the stand-in lives under tests/ (never imported from here,
only named on the PYTHONPATH of the child server a harness run starts), needs these variables, and
exists only in a checkout. `launch()` is the same for Python callers (tests/sglang_cpu,
bench/sglang_cpu_compare.py): it starts this module as a process and returns once the URL is printed.
`server_args()` / `jetspec_args()` are the harness's server arguments.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .client import free_port

REPO = Path(__file__).resolve().parent.parent
STUB = REPO / "tests" / "sglang_cpu" / "stub"
HEAD = REPO / "sglang_jetspec" / "heads" / "smollm2-135m-instruct"
STANDIN_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "JETSPEC_SGLANG_CPU_STANDIN": "1"}
GRACE_S = 20.0
# A --tp-size 2 server on this harness, as on a CPU-only install: one core per rank (SGLang asks for an
# explicit binding when ranks outnumber NUMA nodes) and no NCCL library (this venv's torch is a CUDA
# build: SGLang would build a NCCL communicator on the CPU device). SGLang's CPU path then reduces over
# torch.distributed (gloo), its own fallback when sgl-kernel's shared-memory collectives are off.
# SGLang's TP memory-balance check (it refuses to start when the ranks' free "GPU" memory differs by
# over 10%) reads the one host's free memory on CPU, which any other process loading a model at that
# moment moves between the ranks' readings (a CI run lost every TP=2 test to it, 12.9 against 15.9 GB):
# it guards GPUs held by other processes, which a shared host does not have, so it only warns here.
TP2_ENV = {
    "SGLANG_CPU_OMP_THREADS_BIND": "0|1",
    "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2",
    "OMP_NUM_THREADS": "1",
    "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "false",
}
READY_PREFIX = "sglang-cpu ready: "
# SGLang on CPU sizes its KV pool from the host's free memory at start-up and only caps it at
# --max-total-tokens, with a warning in the log: on a host short of memory (another server holding
# gigabytes) a server asked for 8192 tokens may get a few hundred, and its requests fail much later as
# "Out of memory even after retracting all other requests". The launcher refuses such a server instead.
POOL_LINE = re.compile(r"max_total_num_tokens=(\d+)\b.*?available_cpu_mem=([\d.]+) GB")


def standin_env(base: dict | None = None) -> dict:
    """`base` (default os.environ) plus what SGLang's CPU path needs to run on the stand-in."""
    if not (STUB / "sitecustomize.py").is_file():
        raise FileNotFoundError(f"no sgl-kernel stand-in at {STUB}: the CPU harness runs from a checkout")
    env = dict(os.environ if base is None else base)
    env.update(STANDIN_ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(STUB), *filter(None, [env.get("PYTHONPATH")])])
    return env


# ---- the harness's server arguments ----


def server_args(
    model_dir: Path | str,
    *extra: str,
    dtype: str = "float32",
    max_total_tokens: int = 8192,
    max_running: int = 4,
    radix_cache: bool = False,
    port: int | None = None,
) -> list[str]:
    """A plain SGLang server on the harness (intel_amx attention, no CUDA graphs, asleep when idle),
    then `extra`; a free port unless `port` is given."""
    return [
        "--model-path",
        str(model_dir),
        "--device",
        "cpu",
        "--dtype",
        dtype,
        "--attention-backend",
        "intel_amx",
        "--disable-cuda-graph",
        "--max-total-tokens",
        str(max_total_tokens),
        "--max-running-requests",
        str(max_running),
        "--skip-server-warmup",
        "--sleep-on-idle",
        *([] if radix_cache else ["--disable-radix-cache"]),
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port() if port is None else port),
        *extra,
    ]


def jetspec_args(model_dir: Path | str, *extra: str, head: Path | str = HEAD, **kw) -> list[str]:
    """`server_args` for JETSPEC with `head` (default: the shipped one) and what JETSPEC requires on a CPU
    (no overlap scheduler, no decode CUDA graphs), then `extra`."""
    return server_args(
        model_dir,
        "--speculative-algorithm",
        "JETSPEC",
        "--speculative-draft-model-path",
        str(head),
        "--disable-overlap-schedule",
        "--disable-decode-cuda-graph",
        *extra,
        **kw,
    )


# ---- the launcher ----


def flag_value(args: list[str], name: str, default: str | None = None) -> str | None:
    """The value `args` give flag `name` (`--name value` or `--name=value`), else `default`."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def server_url(args: list[str]) -> str:
    return f"http://{flag_value(args, '--host', '127.0.0.1')}:{flag_value(args, '--port', '30000')}"


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> int:
    """SIGTERM the process group, SIGKILL what is left after `grace_s`; the leader's exit status."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:  # children (scheduler, detokenizer) may outlive the leader
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.wait()


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(f"usage: python -m {__spec__.name} <sglang.launch_server arguments>\n\n{__doc__}")
        return 0
    url = server_url(argv)
    server = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", *argv], env=standin_env(), start_new_session=True
    )
    stopping = threading.Event()

    def on_signal(signum, frame):
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    announced = False
    while not stopping.is_set() and server.poll() is None:
        if not announced and healthy(url):
            print(READY_PREFIX + url, flush=True)
            announced = True
        stopping.wait(0.5 if not announced else 1.0)
    return stop_group(server)


@dataclass
class LaunchedServer:
    """A server started through this launcher, with its log file; `stop()` is SIGTERM to the launcher."""

    url: str
    process: subprocess.Popen
    log: Path
    start_s: float
    args: list[str] = field(default_factory=list)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(GRACE_S + 10)
            except subprocess.TimeoutExpired:
                return stop_group(self.process, 0)
        return self.process.returncode

    def __enter__(self) -> "LaunchedServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def pool_shortfall(args: list[str], log_text: str) -> str | None:
    """Why a started server's KV pool is smaller than its --max-total-tokens asked (None when it is not,
    or when either figure is missing)."""
    asked = flag_value(args, "--max-total-tokens")
    pools = [(int(n), float(gb)) for n, gb in POOL_LINE.findall(log_text)]
    if asked is None or not pools:
        return None
    got, free_gb = min(pools)
    if got >= int(asked):
        return None
    return (
        f"SGLang sized its KV pool at {got} tokens, below --max-total-tokens {asked}: the host had "
        f"{free_gb} GB of memory free at start-up. Free memory (a stray `sglang.launch_server`?) and start again."
    )


def launch(
    args: list[str], log: Path, env: dict | None = None, timeout_s: float = 300.0, cwd: Path | None = None
) -> LaunchedServer:
    """Start `python -m harness.sglang_cpu args` with its output in `log`; return once the server answers
    /health. `env` adds variables (JETSPEC_POLICY, JETSPEC_SHADOW_SPOOL, ...) to this process's environment;
    `cwd` (default this one's) is first on the server's module path: another checkout's root runs its code."""
    t0 = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "w")
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", __name__, *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        ready = [line for line in text.splitlines() if line.startswith(READY_PREFIX)]
        if ready:
            server = LaunchedServer(ready[0][len(READY_PREFIX) :], process, log, time.perf_counter() - t0, list(args))
            shortfall = pool_shortfall(args, text)
            if shortfall:
                server.stop()
                raise RuntimeError(f"{shortfall} Log: {log}")
            return server
        if process.poll() is not None:
            raise RuntimeError(
                f"SGLang exited with status {process.returncode} before /health answered; "
                f"last lines of {log}:\n" + "\n".join(text.splitlines()[-30:])
            )
        time.sleep(0.5)
    stop_group(process, 5)
    raise TimeoutError(
        f"SGLang did not answer /health within {timeout_s:.0f} s; last lines of {log}:\n"
        + "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
