"""JETSPEC vs plain SGLang vs SGLang's NGRAM on one GPU: greedy identity and tokens/s (issue 4, "On a GPU").

    jetspec model fetch smollm2
    python -m bench.gpu.sglang_compare --model ~/.cache/sglang-jetspec/models/smollm2-135m-instruct \
        --head sglang_jetspec/heads/smollm2-135m-instruct --out bench/results

Starts each server in turn (`python -m sglang.launch_server`, FlashInfer or Triton attention, the
pytorch sampler), sends the first 50 HumanEval prompts greedily, and writes `sglang_gpu_compare.{json,md}`
(rewritten after each server, so a run cut short keeps what it measured):
- identity: per prompt, JETSPEC's tokens vs the plain server's; exact-match rate, and at the first
  divergence the target's logprob margin there (plain token's logprob minus JETSPEC token's, from
  the plain server's top logprobs at that position, whose prefix both share);
- throughput: generated tokens per second at concurrency 1, 4 and 16, each pass on prompts no earlier
  request of that server saw (the hybrid drafter and NGRAM look up finished outputs), for plain,
  JETSPEC and NGRAM, with the accept length; a `jetspec+phases` server (metrics on: the worker then
  waits for the device at each phase boundary, which costs speed on a GPU) adds the ms per verify step
  of each worker phase (its `jetspec_<phase>_seconds_total` counters).
`--deadline-s` skips servers that would start after it (each is expected to take `--server-budget-s`).
Every server runs with the radix cache off (each prompt is sent once, so no server gains from a cached
prefix; bench.sglang_cpu_compare --shared-prefix measures that workload) and without the overlap
scheduler or decode CUDA graphs (JETSPEC refuses both; plain and NGRAM are also measured with their
defaults, labelled "+defaults").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.client import post_ok
from harness.compare import WARMUP_TEXT, WORKER_PHASES, mean_accept_length, worker_phases, worker_seconds
from sglang_jetspec.reference.divergence import first_difference as first_divergence

TOP_LOGPROBS = 5
COMMON = ["--disable-radix-cache", "--sampling-backend", "pytorch"]
# JETSPEC switches SGLang's prefill CUDA graphs off itself (its prefill keeps every hidden state); the
# plain and NGRAM servers it is compared with run the same way
SYNC = ["--disable-overlap-schedule", "--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"]
# jetspec+graphs: decode CUDA graphs on, each step's trees padded to a width with its own verify graph
GRAPH_WIDTHS = "4,8,16,32,64"
SERVER_ENV = {"jetspec+graphs": {"JETSPEC_VERIFY_WIDTHS": GRAPH_WIDTHS}}


def server_env(label: str) -> dict[str, str]:
    """Environment variables a server label's process starts with (beside the bench's own)."""
    return SERVER_ENV.get(label.partition("@")[0], {})


# ---- pure parts (unit-tested on CPU) ----


def divergence_margin(
    top_logprobs: list[dict[int, float]], position: int, reference_token: int, candidate_token: int
) -> float | None:
    """Target logprob margin at `position`: logprob(reference token) - logprob(candidate token).

    `top_logprobs[position]` maps token -> logprob for the target's top tokens there. A candidate
    outside that list gets a lower bound (the smallest listed logprob). None without data."""
    if position >= len(top_logprobs) or reference_token not in top_logprobs[position]:
        return None
    top = top_logprobs[position]
    candidate = top.get(candidate_token, min(top.values()))
    return top[reference_token] - candidate


@dataclass
class IdentityRow:
    prompt: int
    exact: bool
    first_divergence: int | None
    margin: float | None
    tokens: int


def identity_rows(
    plain: list[list[int]], jetspec: list[list[int]], plain_top: list[list[dict[int, float]]]
) -> list[IdentityRow]:
    rows = []
    for i, (ref, cand, top) in enumerate(zip(plain, jetspec, plain_top)):
        at = first_divergence(ref, cand)
        margin = None
        if at is not None and at < min(len(ref), len(cand)):
            margin = divergence_margin(top, at, ref[at], cand[at])
        rows.append(IdentityRow(i, at is None, at, margin, len(ref)))
    return rows


@dataclass
class Speed:
    tok_s: float
    accept_length: float | None = None  # committed tokens per verify step (None: the server does not speculate)
    phases_ms: dict[str, float] = field(default_factory=dict)  # JETSPEC worker phase -> ms per verify step


def server_label(name: str, dtype: str) -> str:
    return f"{name}@{dtype}"


def parse_servers(text: str, default_dtype: str) -> list[tuple[str, str]]:
    """`plain,jetspec@float32,...` -> [(name, dtype)]: a server without @dtype runs --dtype."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, dtype = item.partition("@")
        out.append((name, dtype or default_dtype))
    return out


def results_markdown(
    identity: dict[str, list[IdentityRow]], throughput: dict[str, dict[int, Speed]], meta: dict
) -> str:
    """`identity`: per JETSPEC server label, its rows against plain's of its dtype; `throughput`: per server
    label (name@dtype)."""
    lines = [
        f"# SGLang GPU comparison ({meta.get('device', '?')}, SGLang {meta.get('sglang', '?')})",
        "",
        f"Model {meta.get('model', '?')}, head {meta.get('head', '?')}; the first {meta.get('prompts', '?')} HumanEval "
        f"prompts greedy for identity, then {meta.get('throughput_prompts', '?')} new ones per timed pass; "
        f"max_new_tokens {meta.get('max_new_tokens', '?')}, attention {meta.get('attention_backend', '?')}, "
        f"torch {meta.get('torch', '?')}.",
        "",
    ]
    for label, rows in identity.items():
        exact = sum(r.exact for r in rows)
        plain = server_label("plain", label.partition("@")[2])
        lines += [
            f"Greedy identity {label} vs {plain}: {exact}/{len(rows)} exact ({exact / max(1, len(rows)):.0%}).",
            "",
        ]
        diverged = [r for r in rows if not r.exact]
        if diverged:
            lines += ["| prompt | first divergence | target logprob margin |", "|---|---|---|"]
            lines += [
                f"| {r.prompt} | {r.first_divergence} | {'n/a' if r.margin is None else f'{r.margin:.4f}'} |"
                for r in diverged
            ]
            lines.append("")
    batch_sizes = sorted({bs for by_bs in throughput.values() for bs in by_bs})
    lines += [
        "| server | " + " | ".join(f"bs {bs} tok/s (x plain), accept" for bs in batch_sizes) + " |",
        "|---|" + "---|" * len(batch_sizes),
    ]
    for label, by_bs in throughput.items():
        plain = throughput.get(server_label("plain", label.partition("@")[2]), {})
        cells = []
        for bs in batch_sizes:
            speed = by_bs.get(bs)
            if speed is None:
                cells.append("n/a")
                continue
            ratio = f" ({speed.tok_s / plain[bs].tok_s:.2f}x)" if plain.get(bs) else ""
            accept = "" if speed.accept_length is None else f", {speed.accept_length:.2f}"
            cells.append(f"{speed.tok_s:.1f}{ratio}{accept}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    phased = [
        (label, bs, speed)
        for label, by_bs in throughput.items()
        for bs, speed in sorted(by_bs.items())
        if speed.phases_ms
    ]
    if phased:
        lines += [
            "",
            "ms per verify step, by worker phase (the worker waits for the device at each boundary):",
            "",
            "| server | bs | " + " | ".join(WORKER_PHASES) + " |",
            "|---|---|" + "---|" * len(WORKER_PHASES),
        ]
        lines += [
            f"| {label} | {bs} | " + " | ".join(f"{speed.phases_ms.get(p, 0.0):.2f}" for p in WORKER_PHASES) + " |"
            for label, bs, speed in phased
        ]
    return "\n".join(lines) + "\n"


def write_results(
    out_dir: Path, identity: dict[str, list[IdentityRow]], throughput: dict[str, dict[int, Speed]], meta: dict
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sglang_gpu_compare.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "identity": {label: [asdict(r) for r in rows] for label, rows in identity.items()},
                "throughput": {k: {str(bs): asdict(v) for bs, v in by.items()} for k, by in throughput.items()},
            },
            indent=2,
        )
        + "\n"
    )
    path = out_dir / "sglang_gpu_compare.md"
    path.write_text(results_markdown(identity, throughput, meta))
    return path


# ---- servers and requests (GPU only) ----


class Server:
    def __init__(self, name: str, args: list[str], port: int, log_dir: Path, env: dict | None = None):
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(port), *args]
        self.log = open(log_dir / f"server-{name}.log", "w")
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )

    def log_tail(self, lines: int = 60) -> str:
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout_s: float = 420.0) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} server exited ({self.proc.returncode}); {self.log.name} ends:\n" + self.log_tail()
                )
            try:
                urllib.request.urlopen(self.url + "/health_generate", timeout=30).read()
                return
            except OSError:
                time.sleep(2)
        raise TimeoutError(
            f"{self.name} server not ready after {timeout_s}s; {self.log.name} ends:\n" + self.log_tail()
        )

    def generate(self, prompt: str, max_new_tokens: int, logprobs: bool = False) -> dict:
        payload = {"text": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens}}
        if logprobs:
            payload.update(return_logprob=True, top_logprobs_num=TOP_LOGPROBS)
        return post_ok(self.url + "/generate", payload)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server's own process group (start_new_session)
            self.proc.wait(60)
        except ProcessLookupError:
            pass  # already gone (it failed at start)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def output_ids(response: dict) -> list[int]:
    return list(response["output_ids"])


def top_logprob_maps(response: dict) -> list[dict[int, float]]:
    # meta_info.output_top_logprobs: per position a list of (logprob, token_id, text) triples
    return [{int(t[1]): float(t[0]) for t in position} for position in response["meta_info"]["output_top_logprobs"]]


def phases_per_step(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """ms per verify step by worker phase (harness.compare.worker_phases: accept without commit) between two
    readings of worker_seconds."""
    steps = after.get("steps", 0.0) - before.get("steps", 0.0)
    if steps <= 0:
        return {}
    spent = worker_phases({p: after.get(p, 0.0) - before.get(p, 0.0) for p in WORKER_PHASES})
    return {p: 1000.0 * seconds / steps for p, seconds in spent.items()}


def pass_slices(available: int, identity: int, per_pass: int, batch_sizes: list[int]) -> tuple[slice, dict[int, slice]]:
    """Disjoint prompt slices: the identity pass first, then one per batch size. JETSPEC's hybrid
    drafter (and SGLang's NGRAM) look up outputs of requests they already finished, so a prompt sent
    twice would be answered by copying the first answer."""
    need = identity + per_pass * len(batch_sizes)
    if need > available:
        raise SystemExit(
            f"--prompts {identity} + --throughput-prompts {per_pass} x {len(batch_sizes)} batch sizes "
            f"= {need} prompts; HumanEval has {available}"
        )
    return slice(0, identity), {
        bs: slice(identity + i * per_pass, identity + (i + 1) * per_pass) for i, bs in enumerate(batch_sizes)
    }


def throughput(server: Server, prompts: list[str], concurrency: int, max_new_tokens: int) -> Speed:
    with ThreadPoolExecutor(concurrency) as pool:
        # warm-up at this batch size (Triton compiles a kernel variant the first time a shape class
        # appears; that second must not land in the timed pass), on a text no timed request repeats
        list(pool.map(lambda _: server.generate(WARMUP_TEXT, 8), range(concurrency)))
        before = worker_seconds(server.url)
        start = time.perf_counter()
        responses = list(pool.map(lambda p: server.generate(p, max_new_tokens), prompts))
    wall = time.perf_counter() - start
    return Speed(
        sum(r["meta_info"]["completion_tokens"] for r in responses) / wall,
        mean_accept_length(responses),
        phases_per_step(before, worker_seconds(server.url)),
    )


# KV tokens of a server started beside others: 16 requests of a few hundred tokens each, with JETSPEC's
# reserve, fit many times over (fp32 SmolLM2: 46 KB a token, 3 GB a server)
TOGETHER_MAX_TOTAL_TOKENS = 65536


def server_configs(servers: list[tuple[str, str]], args) -> dict[str, list[str]]:
    """Launch arguments per server label. Servers started together keep SGLang's memory fraction (its
    check that weights leave room for the KV cache compares free memory before and after loading, and
    the neighbours' allocations in between must not fail it: a fraction of 0.2 did on the CPU harness
    with three servers) and share the device through a KV cap instead."""
    configs = {}
    for name, dtype in servers:
        base = [
            "--model-path",
            args.model,
            "--device",
            args.device,
            "--attention-backend",
            args.attention_backend,
            "--dtype",
            dtype,
            *COMMON,
            "--mem-fraction-static",
            "0.6",
            "--sleep-on-idle",
        ]
        if args.together:
            base += ["--max-total-tokens", str(TOGETHER_MAX_TOTAL_TOKENS)]
        jetspec = SYNC + ["--speculative-algorithm", "JETSPEC", "--speculative-draft-model-path", args.head]
        # the phase split needs the worker's metrics, and with them it waits for the device at every
        # phase boundary: on a GPU that costs the host/device overlap, so speed comes from `jetspec`
        # and the split from a separate `jetspec+phases` server
        extra = {
            "jetspec": jetspec,
            "jetspec+phases": jetspec + ["--enable-metrics"],
            "jetspec+profile": jetspec,
            "jetspec+graphs": ["--disable-overlap-schedule", "--disable-prefill-cuda-graph"] + jetspec[len(SYNC) :],
            "plain": SYNC,
            "plain+defaults": [],
            "ngram": SYNC
            + ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(args.ngram_draft_tokens)],
        }
        if name not in extra:
            raise SystemExit(f"--servers: unknown server {name!r} (one of {', '.join(extra)})")
        configs[server_label(name, dtype)] = base + extra[name] + list(args.server_arg)
    return configs


def profile(server: Server, label: str, args, prompts: list[str], bs: int) -> Path:
    """`--profile-steps` scheduler iterations of `bs` concurrent requests under SGLang's torch profiler
    (`/start_profile`; it stops itself after that many forwards and writes a chrome trace), summarised by
    bench/gpu/profile_summary.py into `profile-<label>-bs<bs>.md` beside the results. The trace itself
    stays in --profile-dir (tens of MB: not part of the results)."""
    from bench.gpu.profile_summary import load_trace, summarize, summary_markdown

    trace_dir = args.profile_dir / f"{label}-bs{bs}"
    activities = ["CPU", "GPU"] if args.device == "cuda" else ["CPU"]
    with ThreadPoolExecutor(bs) as pool:
        list(pool.map(lambda _: server.generate(WARMUP_TEXT, 8), range(bs)))
        post_ok(
            server.url + "/start_profile",
            {
                "output_dir": str(trace_dir),
                "num_steps": args.profile_steps,
                "activities": activities,
                "profile_id": "jetspec",
            },
        )
        list(pool.map(lambda p: server.generate(p, args.max_new_tokens), prompts[:bs]))

    def wait_trace(seconds: float) -> Path | None:
        deadline = time.time() + seconds
        while time.time() < deadline:
            if found := sorted(trace_dir.glob("*.trace.json*")):
                time.sleep(2)  # the export may still be writing
                return found[0]
            time.sleep(1)
        return None

    # the scheduler exports the trace after the last profiled forward; requests that finished in fewer
    # forwards than --profile-steps leave the profiler running until told to stop
    trace = wait_trace(10)
    if trace is None:
        post_ok(server.url + "/stop_profile", {})
        trace = wait_trace(120)
    if trace is None:
        raise TimeoutError(f"[{label}] no profiler trace in {trace_dir} after 130 s")
    profiled = summarize(load_trace(trace))
    out = args.out / f"profile-{label.replace('@', '-')}-bs{bs}.md"
    out.write_text(
        f"# {label}, batch {bs}: at most {args.profile_steps} profiled forwards ({trace.name})\n\n"
        + summary_markdown(profiled)
    )
    return out


def measure(
    server: Server,
    label: str,
    args,
    prompts: list[str],
    slices: tuple[slice, dict[int, slice]],
    greedy: dict,
    speeds: dict,
) -> None:
    identity, passes = slices
    if label.startswith("jetspec+profile@"):  # profiled steps only: the profiler's own cost spoils speed
        for bs in args.batch_sizes:
            print(profile(server, label, args, prompts[passes[bs]], bs).read_text(), flush=True)
        return
    if label.partition("@")[0] in ("plain", "jetspec"):
        greedy[label] = [
            server.generate(q, args.max_new_tokens, logprobs=label.startswith("plain@")) for q in prompts[identity]
        ]
        print(f"[{label}] greedy done; mean accept length {mean_accept_length(greedy[label])}", flush=True)
    speeds[label] = {}
    for bs in args.batch_sizes:
        speeds[label][bs] = throughput(server, prompts[passes[bs]], bs, args.max_new_tokens)
        print(f"[{label}] batch {bs}: {speeds[label][bs]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="SmolLM2 checkpoint directory (jetspec model fetch smollm2)")
    p.add_argument("--head", required=True, help="JetSpec head directory")
    p.add_argument("--prompts", type=int, default=50, help="HumanEval prompts of the greedy identity pass")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument(
        "--throughput-prompts",
        type=int,
        default=32,
        help="prompts per timed pass; each batch size gets its own, after the identity pass's",
    )
    p.add_argument("--ngram-draft-tokens", type=int, default=8)
    p.add_argument(
        "--attention-backend",
        default="flashinfer",
        choices=["flashinfer", "triton", "intel_amx"],
        help="attention backend of every server (JETSPEC's tree verify runs through it)",
    )
    p.add_argument(
        "--device",
        default="cuda",
        help="SGLang --device; `cpu` with intel_amx smoke-tests this script on the CPU harness "
        "(bench/GPU.md: the CPU smoke run)",
    )
    p.add_argument("--dtype", default="bfloat16", help="SGLang --dtype of a server named without @dtype")
    p.add_argument(
        "--servers",
        default="jetspec,plain,plain+defaults,ngram",
        help="servers to run, in order, each name[@dtype] (identity needs jetspec and plain of one dtype)",
    )
    p.add_argument(
        "--together",
        action="store_true",
        help="start every server at once (their start-ups overlap; each KV cache capped at "
        f"{TOGETHER_MAX_TOTAL_TOKENS} tokens), then measure them one at a time, stopping each when done",
    )
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for every server (repeat it; e.g. --server-arg=--disable-cuda-graph)",
    )
    p.add_argument("--port", type=int, default=31000)
    p.add_argument("--deadline-s", type=float, default=None, help="measure no server after this many seconds")
    p.add_argument("--server-budget-s", type=float, default=90.0, help="expected seconds per server (for --deadline-s)")
    p.add_argument(
        "--profile-steps",
        type=int,
        default=12,
        help="forwards a jetspec+profile server runs under the torch profiler, per batch size",
    )
    p.add_argument("--profile-dir", type=Path, default=Path("/tmp/jetspec-profile"), help="where its traces go")
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)

    from sglang_jetspec.reference.prompts import humaneval_prompts

    prompts = humaneval_prompts(range(164))  # sliced per pass: pass_slices
    slices = pass_slices(
        len(prompts), args.prompts, args.throughput_prompts, args.batch_sizes
    )  # before any server starts
    configs = server_configs(parse_servers(args.servers, args.dtype), args)
    args.out.mkdir(parents=True, exist_ok=True)
    greedy: dict[str, list[dict]] = {}
    speeds: dict[str, dict[int, Speed]] = {}
    run_start = time.perf_counter()

    def save() -> Path:
        return write_results(args.out, identity_of(greedy), speeds, run_meta(args, prompts, configs, greedy))

    path = save()
    ports = {label: args.port + i for i, label in enumerate(configs)}
    launched = (
        {label: Server(label, cmd, ports[label], args.out, server_env(label)) for label, cmd in configs.items()}
        if args.together
        else {}
    )
    try:
        # every start-up finishes before the first measurement: a neighbour capturing its CUDA graphs
        # beside a timed pass slowed it (bench/results/gpu-sglang/2026-11-27-h200-run3, call 2)
        failed = set()
        for label in list(launched):
            try:
                launched[label].wait_ready()
            except (RuntimeError, TimeoutError) as exc:
                print(f"[{label}] failed: {exc}", flush=True)
                launched.pop(label).stop()
                failed.add(label)
        for label, cmd in configs.items():
            if label in failed:
                continue
            if args.deadline_s is not None and time.perf_counter() - run_start + args.server_budget_s > args.deadline_s:
                print(f"[{label}] skipped: would run past --deadline-s {args.deadline_s:.0f}", flush=True)
                continue
            server = launched.pop(label, None) or Server(label, cmd, ports[label], args.out, server_env(label))
            try:
                server.wait_ready()
                print(f"[{label}] ready {time.perf_counter() - run_start:.0f}s into the run", flush=True)
                measure(server, label, args, prompts, slices, greedy, speeds)
            except (RuntimeError, TimeoutError, OSError) as exc:  # one server failing leaves the others' results
                print(f"[{label}] failed: {exc}", flush=True)
            finally:
                server.stop()
            path = save()
    finally:
        for server in launched.values():
            server.stop()
    print(path.read_text())
    return 0


def identity_of(greedy: dict[str, list[dict]]) -> dict[str, list[IdentityRow]]:
    """Per JETSPEC server (jetspec, jetspec+graphs, ... @dtype) that has a plain server of its dtype: its
    greedy outputs against plain's, keyed by its label."""
    out = {}
    for label, outputs in greedy.items():
        name, _, dtype = label.partition("@")
        plain = greedy.get(server_label("plain", dtype))
        if name.startswith("jetspec") and plain is not None:
            out[label] = identity_rows(
                [output_ids(r) for r in plain], [output_ids(r) for r in outputs], [top_logprob_maps(r) for r in plain]
            )
    return out


def run_meta(args, prompts: list[str], configs: dict, greedy: dict[str, list[dict]]) -> dict:
    import sglang
    import torch

    return {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "sglang": sglang.__version__,
        "torch": torch.__version__,
        "model": args.model,
        "head": args.head,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "throughput_prompts": args.throughput_prompts,
        "jetspec_mean_accept_length": {
            label: mean_accept_length(rs) for label, rs in greedy.items() if label.startswith("jetspec@")
        },
        "attention_backend": args.attention_backend,
        "servers": configs,
    }


if __name__ == "__main__":
    raise SystemExit(main())
