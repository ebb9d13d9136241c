"""What a decode step costs outside the target's forward, per step, by batch size: plain SGLang and JETSPEC.

    python -m bench.step_overhead --batch-sizes 1,4,16 --dtype bfloat16 \
        --json bench/results/sglang_cpu/step-overhead-bf16.json \
        --markdown bench/results/sglang_cpu/step-overhead-bf16.md

Starts each config's real SGLang server on the CPU harness (harness/sglang_cpu.py) with the scheduler-side
probe of tests/sglang_cpu/stub/step_overhead.py, and at every batch size sends that many requests at once
for each workload: `greedy` (code prompts, temperature 0), `sampled` (temperature 0.8, top_p 0.95, a seed
per request), `grammar` (bench/prompts/json-tools.jsonl, each under its JSON schema, greedy) and
`penalised` (greedy with frequency_penalty 0.5 and repetition_penalty 1.1). Every other decode step runs
under harness.step_probe.StepProbe (the target's forward paused); the others are timed unprobed. Of the
steps whose batch is the full batch size it reports, per step (median, max in brackets):

- `ops_outside_forward`: aten ops on device data outside the target's forward: the proxy for kernel
  launches on a GPU (the draft head's forward is outside the target's: it counts; a function a CUDA build
  runs as one fused kernel, `F.rms_norm`, counts as that one: harness.step_probe.FUSED_ON_CUDA);
- `ops_with_draft_graph`: the same with the head's drafting pass replayed as one CUDA graph, as a GPU with
  decode graphs runs it (core/draft_graphs.py): the pass's ops (counted inside `HeadDrafter.propose`) become
  DRAFT_GRAPH_OPS (the copy of its inputs into the bucket's buffer, the replay, the slice of its output);
- `kernels_outside_forward`, `kernels_with_draft_graph`: the same two less the views (`slice`, `view`,
  `transpose`, ...), which only change a tensor's metadata and launch no kernel on a GPU;
- `host_syncs`: reads of device data by the host (`.item()`, `.tolist()`, `.cpu()`, truthiness,
  `nonzero`, boolean indexing, ...), with the code sites behind them in the JSON;
- `host_calls_outside_forward`: torch calls on host data alone (tensors built from lists, ops on host
  tensors): host work done a tensor op at a time, which a per-request loop multiplies by the batch size;
- `host_ms`: wall milliseconds of the step outside the target's forward (unprobed steps), and for
  JETSPEC its phases as its own clock reads them (draft includes planning; bind: the verify's inputs);
- `host_beyond_ops_ms` and `device_op_ms`: a probed step's milliseconds outside the target's forward
  split into the time inside the counted device ops themselves and the rest (Python, host tensors,
  dispatch, and the probe's own cost);
- `probe_ms` and `host_work_ms`: of `host_beyond_ops_ms`, the probe's own cost (its handlers' timed
  bookkeeping plus torch's mode machinery at harness.step_probe.machinery_seconds a handler call, measured
  in the server once) and the rest: the host's own work (`host_work_phases_ms`, and the ops' time
  `device_op_phases_ms`, by phase of JETSPEC's step clock, `after` its last mark). The probe costs 10-20 us
  a torch call, most of a probed step's host time at batch 1, and more torch calls (a tensor per lane in
  a list) cost it more, so the goal's ratio is read from `host_work_ms`.

On a CPU every op runs where it is dispatched, so host_ms is compute as well as launches; the counts and
`host_work_ms` are what carries to a GPU, where the ops' own time moves to the device and the host's
work beside them is what a step still waits on (with no per-request loop, flat in batch size: the
markdown's last lines give its ratio of the largest batch to batch 1). Configs: `plain` (SGLang's own
decode and sampler), `jetspec` (the shipped head and policy), `jetspec-16` (every cohort at budget 16 with
fixed trees: batch 16 speculates too),
`jetspec-off` (every cohort at budget 0 in the YAML: no draft context kept) and `jetspec-native` (the
shipped cohorts with a pushed table of budget 0: native steps that keep each request's draft context, as
the same-allocation control's native blocks run them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.sglang_cpu_compare import policy_env, positive_ints
from harness.client import post_ok
from harness.policy_push import push_budgets
from harness.sglang_cpu import jetspec_args, launch, server_args

OVERHEAD_ENV = "JETSPEC_TEST_STEP_OVERHEAD"
WORKLOADS = ("greedy", "sampled", "grammar", "penalised")
# JETSPEC under the shipped policy; with every cohort at budget 16, fixed trees and no native blocks of
# the same-allocation control (so every step at every batch size speculates, batch 16 too, where the
# shipped policy gates it off); with every cohort at budget 0
VARIANTS = {
    "jetspec-16": {"default": 16, "tree_sizing": "fixed", "same_allocation": {"enabled": False}},
    "jetspec-off": {"default": 0},
    "jetspec-native": {"same_allocation": {"enabled": False}},
}
PUSHED_OFF = ("jetspec-native",)  # configs whose every cohort gets a pushed budget 0 (ADMIN_KEY) at launch
ADMIN_KEY = "step-overhead-admin-key"
CONFIGS = ("plain", "jetspec", *VARIANTS)
GRAMMAR_PROMPTS = Path(__file__).parent / "prompts" / "json-tools.jsonl"
SAMPLING = {
    "greedy": {"temperature": 0},
    "sampled": {"temperature": 0.8, "top_p": 0.95},
    "grammar": {"temperature": 0},
    "penalised": {"temperature": 0, "frequency_penalty": 0.5, "repetition_penalty": 1.1},
}
COUNT_FIELDS = (
    "ops_outside_forward",
    "ops_with_draft_graph",
    "kernels_outside_forward",
    "kernels_with_draft_graph",
    "host_syncs",
    "host_calls_outside_forward",
)
DRAFT_GRAPH_OPS = 3  # DraftGraphs.propose: inputs.copy_, graph.replay, out[: len(lanes)]
DRAFT_GRAPH_KERNELS = 2  # ... of which the slice is a view
TIME_FIELDS = ("host_ms", "forward_ms", "step_ms")
PROBED_TIME_FIELDS = ("host_beyond_ops_ms", "device_op_ms", "probe_ms", "host_work_ms")  # probed steps


def parse_sizes(text: str) -> list[int]:
    sizes = positive_ints(text)
    if not sizes:
        raise argparse.ArgumentTypeError(f"{text!r}: give batch sizes as positive integers, e.g. 1,4,16")
    return sizes


def with_draft_graph(record: dict) -> dict:
    """A probed step's record with `ops_with_draft_graph` and `kernels_with_draft_graph` (its ops and kernels
    when a drafting pass ran as a graph replay; else the same); a record without kernel counts (an older
    probe's) gets them as None."""
    out = dict(record)
    for counted, drafted, replay in (
        ("ops", "draft_pass_ops", DRAFT_GRAPH_OPS),
        ("kernels", "draft_pass_kernels", DRAFT_GRAPH_KERNELS),
    ):
        total = record.get(f"{counted}_outside_forward")
        draft = record.get(drafted, 0)
        out[f"{counted}_outside_forward"] = total
        out[f"{counted}_with_draft_graph"] = None if total is None else total - draft + (replay if draft else 0)
    return out


def summarise(records: list[dict], batch_size: int) -> dict:
    """Median (and max) of every field over the steps whose batch held `batch_size` requests."""
    full = [r for r in records if r["batch_size"] == batch_size]
    counted = [with_draft_graph(r) for r in full if r["counted"]]
    timed = [r for r in full if not r["counted"]]
    out: dict = {"steps_counted": len(counted), "steps_timed": len(timed)}
    for name in COUNT_FIELDS:
        values = [r[name] for r in counted if r.get(name) is not None]  # older probes lack host calls
        out[name] = statistics.median(values) if values else None
        out[f"{name}_max"] = max(values) if values else None
    for name, steps in [*((n, timed) for n in TIME_FIELDS), *((n, counted) for n in PROBED_TIME_FIELDS)]:
        values = [r[name] for r in steps if r.get(name) is not None]
        out[name] = round(statistics.median(values), 2) if values else None
    out["phases_ms"] = median_fields(timed, "phases_ms")
    out["host_work_phases_ms"] = median_fields(counted, "host_work_phases_ms")
    out["device_op_phases_ms"] = median_fields(counted, "device_op_phases_ms")
    out["sync_sites_per_step"] = per_step(counted, "sync_sites", digits=2)
    out["top_ops_per_step"] = per_step(counted, "top_ops", digits=1, top=15)
    out["op_sites_per_step"] = per_step(counted, "op_sites", digits=1, top=20)
    return out


def median_fields(records: list[dict], field: str) -> dict[str, float]:
    """A {name: ms} field of the records as each name's median over them (0 where a record lacks it)."""
    names = sorted({name for r in records for name in r.get(field, {})})
    return {name: round(statistics.median(r.get(field, {}).get(name, 0.0) for r in records), 2) for name in names}


def per_step(records: list[dict], field: str, digits: int, top: int | None = None) -> dict[str, float]:
    """A counter field of the records ({name: count}) as its mean per record, largest first (`top` of them)."""
    sums: dict[str, float] = {}
    for r in records:
        for name, n in r.get(field, {}).items():
            sums[name] = sums.get(name, 0) + n / len(records)
    ranked = sorted(sums.items(), key=lambda kv: -kv[1])[:top]
    return {name: round(n, digits) for name, n in ranked}


def read_records(path: Path, skip: int) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()[skip:] if line.strip()]


def run_batch(url: str, prompts: list[tuple[list[int], dict]], workload: str, max_new_tokens: int) -> None:
    def one(i: int, prompt) -> dict:
        ids, constraint = prompt
        params = {**SAMPLING[workload], "max_new_tokens": max_new_tokens, "ignore_eos": workload != "grammar"}
        if workload == "sampled":
            params["sampling_seed"] = 1000 + i
        return post_ok(f"{url}/generate", {"input_ids": ids, "sampling_params": {**params, **constraint}})

    with ThreadPoolExecutor(len(prompts)) as pool:
        list(pool.map(one, range(len(prompts)), prompts))


def push_off(url: str, policy: str | None) -> None:
    """Every cohort of the server's policy at budget 0 for an hour, by push: its steps keep the draft context."""
    from policies import load_policy
    from sglang_jetspec.adapter.policy import policy_path

    cohorts = load_policy(Path(policy) if policy else policy_path()).cohorts
    push_budgets(url, ADMIN_KEY, {c.name: 0 for c in cohorts})


def measure(config: str, args, model: str, prompts: dict, log_dir: Path) -> dict:
    records_path = (log_dir / f"{config}-steps.jsonl").resolve()
    records_path.unlink(missing_ok=True)
    size = max(args.batch_sizes)
    make = server_args if config == "plain" else jetspec_args
    extra = dict(dtype=args.dtype, max_running=size, max_total_tokens=args.max_total_tokens, port=args.port)
    env = {OVERHEAD_ENV: str(records_path), "OMP_NUM_THREADS": str(args.threads)}
    env.update(policy_env(config, log_dir, VARIANTS))
    flags = ("--admin-api-key", ADMIN_KEY) if config in PUSHED_OFF else ()
    server = launch(make(model, *flags, **extra), log_dir / f"{config}.log", env)
    results: dict = {}
    try:
        if config in PUSHED_OFF:
            push_off(server.url, env.get("JETSPEC_POLICY"))
        run_batch(server.url, prompts["greedy"][:1], "greedy", 8)  # first-call allocations stay out
        for workload in args.workloads:
            for batch_size in args.batch_sizes:
                skip = len(read_records(records_path, 0))
                t0 = time.perf_counter()
                run_batch(server.url, prompts[workload][:batch_size], workload, args.max_new_tokens)
                time.sleep(0.5)  # the last step's line is written after its reply went out
                summary = summarise(read_records(records_path, skip), batch_size)
                summary["wall_s"] = round(time.perf_counter() - t0, 2)
                results.setdefault(workload, {})[str(batch_size)] = summary
                print(
                    f"[{config}] {workload} bs={batch_size}: ops {summary['ops_outside_forward']} "
                    f"kernels {summary['kernels_outside_forward']} "
                    f"syncs {summary['host_syncs']} outside-forward {summary['host_ms']} ms "
                    f"(forward {summary['forward_ms']} ms) "
                    f"over {summary['steps_counted']}+{summary['steps_timed']} steps",
                    flush=True,
                )
    finally:
        server.stop()
    return results


def markdown(results: dict, meta: dict) -> str:
    lines = [
        f"# Per-step overhead outside the target's forward ({meta['cpu']}, {meta['dtype']})",
        "",
        f"`{meta['command']}`",
        "",
        f"Commit {meta['commit']}. Median per decode step over the steps with the full batch (max in brackets);",
        "ops: aten ops on device data outside the target's forward; kernels: those of them that are not views",
        "(a view launches no kernel on a GPU: the proxy for GPU kernel launches); with draft graph: the same when",
        "the head's drafting pass replays as one CUDA graph (GPU decode graphs);",
        "syncs: host reads of device data; host calls: torch calls on host data alone;",
        "ms: unprobed wall time outside the target's forward",
        "(JETSPEC's phases after); host beyond ops: a probed step's ms outside the forward less the ms inside",
        "its device ops (in brackets); host work: that less the probe's own cost (in brackets): the host's own",
        "work, which a GPU step still waits on.",
        "",
        "| config | workload | batch | ops outside forward | ops with draft graph | kernels outside forward "
        "| kernels with draft graph | host syncs | host calls | outside-forward ms | host beyond ops ms (in ops) "
        "| host work ms (probe) | forward ms | phases ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for config, by_workload in results.items():
        for workload, by_size in by_workload.items():
            for size, s in by_size.items():
                phases = " ".join(f"{k.removesuffix('_ms')} {v}" for k, v in s["phases_ms"].items())
                lines.append(
                    f"| {config} | {workload} | {size} | {s['ops_outside_forward']} ({s['ops_outside_forward_max']}) "
                    f"| {s.get('ops_with_draft_graph', '-')} ({s.get('ops_with_draft_graph_max', '-')}) "
                    f"| {s.get('kernels_outside_forward', '-')} ({s.get('kernels_outside_forward_max', '-')}) "
                    f"| {s.get('kernels_with_draft_graph', '-')} ({s.get('kernels_with_draft_graph_max', '-')}) "
                    f"| {s['host_syncs']} ({s['host_syncs_max']}) "
                    f"| {s.get('host_calls_outside_forward', '-')} ({s.get('host_calls_outside_forward_max', '-')}) "
                    f"| {s['host_ms']} "
                    f"| {s.get('host_beyond_ops_ms', '-')} ({s.get('device_op_ms', '-')}) "
                    f"| {s.get('host_work_ms', '-')} ({s.get('probe_ms', '-')}) | {s['forward_ms']} "
                    f"| {phases} |"
                )
    lines += ["", "Sync sites per step (JETSPEC, largest batch, greedy and sampled):", ""]
    for config, by_workload in results.items():
        if config == "plain":
            continue
        for workload in ("greedy", "sampled"):
            by_size = by_workload.get(workload, {})
            if by_size:
                last = by_size[max(by_size, key=int)]
                sites = ", ".join(f"{site} x{n}" for site, n in last["sync_sites_per_step"].items())
                lines.append(f"- {config} {workload}: {sites or 'none'}")
    lines += [
        "",
        "By phase, ms: host work + device ops of the probed steps = their sum, against the unprobed steps' phase",
        "(the check on the probe's cost taken out; `verified`: outside the target's forward, which the unprobed",
        "phase includes; `after`: the reporter and SGLang's bookkeeping):",
        "",
    ]
    for config, by_workload in results.items():
        for workload, by_size in by_workload.items():
            for size, s in by_size.items():
                host, ops = s.get("host_work_phases_ms") or {}, s.get("device_op_phases_ms") or {}
                unprobed = s.get("phases_ms", {})
                parts = [
                    f"{k} {v} + {ops.get(k, 0.0)} = {round(v + ops.get(k, 0.0), 2)}"
                    + (f" ({unprobed[k + '_ms']})" if k + "_ms" in unprobed and k != "verified" else "")
                    for k, v in host.items()
                ]
                if parts:
                    lines.append(f"- {config} {workload} {size}: " + "; ".join(parts))
    for field, title in (
        ("host_work_ms", "Host work ms, largest batch over batch 1 (issue 56's goal: at most 1.5)"),
        ("host_beyond_ops_ms", "Host ms beyond ops (the probe's cost included), largest batch over batch 1"),
        ("host_calls_outside_forward", "Host calls, largest batch over batch 1"),
    ):
        growth = host_growth(results, field)
        if growth:
            lines += ["", f"{title}:", ""]
            lines += [f"- {config} {workload}: {ratio}" for (config, workload), ratio in growth.items()]
    return "\n".join(lines) + "\n"


def host_growth(results: dict, field: str = "host_work_ms") -> dict[tuple[str, str], float]:
    """(config, workload) -> `field` at the largest batch size over that at the smallest, where both were
    measured at two or more sizes."""
    out = {}
    for config, by_workload in results.items():
        for workload, by_size in by_workload.items():
            sizes = sorted(by_size, key=int)
            first, last = by_size[sizes[0]].get(field), by_size[sizes[-1]].get(field)
            if len(sizes) > 1 and first and last is not None:
                out[(config, workload)] = round(last / first, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=parse_sizes, default=[1, 4, 16])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"subset of {','.join(WORKLOADS)}")
    p.add_argument("--configs", default="plain,jetspec,jetspec-16", help=f"subset of {','.join(CONFIGS)}")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--model", help="target checkpoint directory (default: jetspec model fetch smollm2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--port", type=int, default=31223)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/step-overhead-logs"))
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    configs = [c for c in args.configs.split(",") if c]
    bad = sorted(set(args.workloads) - set(WORKLOADS)) + sorted(set(configs) - set(CONFIGS))
    if bad:
        p.error(f"unknown {bad}: --workloads from {','.join(WORKLOADS)}, --configs from {','.join(CONFIGS)}")

    import subprocess

    from transformers import AutoTokenizer

    from sglang_jetspec.models.fetch import fetch
    from sglang_jetspec.reference.precision import cpu_model
    from sglang_jetspec.reference.prompts import constraint_params, encode, humaneval_prompts, read_prompt_file

    model = args.model or str(fetch("smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    size = max(args.batch_sizes)
    code = [(encode(text, tokenizer), {}) for text in humaneval_prompts(range(100, 100 + size))]
    tools = read_prompt_file(GRAMMAR_PROMPTS)
    grammar = [(encode(r, tokenizer), constraint_params(r)) for r in (tools * size)[:size]]
    prompts = {"greedy": code, "sampled": code, "penalised": code, "grammar": grammar}
    args.log_dir.mkdir(parents=True, exist_ok=True)
    results = {config: measure(config, args, model, prompts, args.log_dir) for config in configs}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {
        "cpu": cpu_model(),
        "dtype": args.dtype,
        "commit": commit,
        "command": "python -m bench.step_overhead " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(results, meta))
        print(markdown(results, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
