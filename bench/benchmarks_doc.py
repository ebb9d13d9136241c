"""Write docs/benchmarks.md and its plots from the committed benchmark JSON.

    python -m bench.benchmarks_doc [--out DIR]      # DIR defaults to docs/

The inputs are named below, each with why it is the current run of its workload (bench/results/INDEX.md
lists every result file). tests/test_benchmarks_doc.py regenerates the page and fails when the committed
one differs, so the page is never edited by hand.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from matplotlib.figure import Figure  # no pyplot: no global state; PNGs are written by the Agg canvas

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"

# `jetspec bench` runs (paths under bench/results), one per workload and machine: why each is current.
REFERENCE_RUNS = {
    "speed/bf16-humaneval-164-xeon-amx.json": "all 164 HumanEval, greedy: the only run on the Intel Xeon",
    "speed/bf16-humaneval-100-164-batch4-xeon-amx.json": "batch 4: the only run on the Intel Xeon",
    "speed/bf16-chat-24-xeon-amx.json": "chat, greedy: the newest of the two runs on the Intel Xeon",
    "speed/bf16-humaneval-164-t1-xeon-amx.json": "T = 1, top-K and drawn children: the only run on the Intel Xeon",
    "speed/bf16-humaneval-164-h100-head.json": "all 164 HumanEval, greedy: the newest bf16 run on the AMD EPYC",
    "speed/bf16-humaneval-100-164-batch4-packed.json": "batch 4: the newest bf16 run on the AMD EPYC",
    "speed/bf16-chat-24-session-start.json": "chat x 64 tokens: the newest run with the shipped head",
    "speed/bf16-chat-24-256-tokens.json": "chat x 256 tokens: the only run",
    "speed/bf16-humaneval-164-t1-topk.json": "T = 1, top-K children: the newest all-164 run",
    "speed/bf16-humaneval-164-t1-draw-adaptive.json": "T = 1, drawn children: the newest all-164 run",
    "sglang_cpu/reference-humaneval-100-108-fp32.json": "the reference engine on the SGLang sweep's first 8 prompts",
    "sglang_cpu/reference-chat-0-8-fp32.json": "the same for the chat sweep (same machine and session)",
    "sglang_cpu/reference-humaneval-100-108-bf16.json": "the reference engine on the bf16 code sweep's first 8 prompts",
    "sglang_cpu/reference-chat-0-8-bf16.json": "the same for the bf16 chat sweep (same machine and session)",
}

# bench/sglang_cpu_compare.py runs (real SGLang on CPU): the shipped policy, each the newest of its workload.
# "OpenMP slept then": run before 2026-11-28 06:00, when the harness's servers ran with OMP_WAIT_POLICY=PASSIVE
# (bench/results/INDEX.md, sglang_cpu/).
SGLANG_CPU_RUNS = {
    "sglang_cpu/defaults-humaneval-100-164-bf16.json": "the shipped policy's concurrency sweep on code, bf16",
    "sglang_cpu/defaults-chat-bf16.json": "the shipped policy's concurrency sweep on chat, bf16",
    "sglang_cpu/shared-prefix-radix-bf16.json": "shared prefix, radix on/off, bf16 (5fd062e; OpenMP slept then)",
    "structured/json-tools-bf16.json": "JSON-schema constrained tool calls, bf16",
    "sglang_cpu/gated-off-tax-bf16.json": "every cohort gated off against plain SGLang: the fallback's tax, bf16",
    "sglang_cpu/defaults-humaneval-100-164-fp32-xeon.json": "the code sweep in fp32 on the Intel Xeon: exactness",
    "sglang_cpu/defaults-chat-fp32-xeon.json": "the chat sweep in fp32 on the Intel Xeon: exactness",
    "sglang_cpu/defaults-humaneval-100-164-fp32.json": "concurrency sweep on code (bs7-24 at 8; OpenMP slept then)",
    "sglang_cpu/defaults-chat-fp32.json": "concurrency sweep on chat (bs7-24 at 8; OpenMP slept then)",
    "sglang_cpu/shared-prefix-radix-fp32.json": "shared system prompt, radix on and off (OpenMP slept then)",
    "sglang_cpu/tp2-cost-fp32.json": "tensor parallelism (2 ranks over gloo; OpenMP slept then)",
    "structured/json-tools-fp32.json": "JSON-schema constrained tool calls (OpenMP slept then)",
    "structured/chat-fp32.json": "free-text chat in the same setup as the tool calls (OpenMP slept then)",
}
# The runs among them that sweep concurrency, plotted against it (one machine and dtype: the panel's title).
CONCURRENCY_SWEEPS = ("sglang_cpu/defaults-humaneval-100-164-bf16.json", "sglang_cpu/defaults-chat-bf16.json")

# bench/gpu/sglang_compare.py runs (one JSON per device call) and the dtype each is current for.
GPU_RUNS = {
    "gpu-sglang/2026-11-27-h200-run3/call1/sglang_gpu_compare.json": ("float32", "newest, 24 identity prompts"),
    "gpu-sglang/2026-11-27-h200-run2/call1/sglang_gpu_compare.json": ("bfloat16", "newest with throughput"),
    "gpu-sglang/2026-11-27-h200-run2/call2/sglang_gpu_compare.json": ("bfloat16", "SGLang's defaults; phase split"),
}

# Committed JSON of the kinds above that is left out on purpose, and why.
LEFT_OUT = {
    "bench-humaneval-0-4.json": "the widest budget grid (4-64), but an earlier head and no hybrid drafter",
    "sglang_cpu_compare.json": "the head drafter at fixed budgets, not the shipped policy",
    "sglang_cpu/adaptive-humaneval-12.json": "superseded by the shipped policy's sweeps; repeated prompts",
    "gpu-sglang/2026-11-27-h200-run2/call1/sglang_gpu_compare.json, fp32 servers": "superseded by run 3's call 1",
    "gpu-sglang/2026-11-27-h200-run3/call2/sglang_gpu_compare.json": "no throughput recorded",
}

HEADER = """# Benchmarks

Generated by `python -m bench.benchmarks_doc` from the committed JSON under `bench/results/`: do not edit
this file by hand (`tests/test_benchmarks_doc.py` fails when it differs from the script's output). Every
result file, current or not, is listed in [bench/results/INDEX.md](../bench/results/INDEX.md).

Target SmolLM2-135M-Instruct, with the head in `sglang_jetspec/heads/` when the run was made. Machines and
dtypes are as each run's JSON records them. Ratios compare cells of one run only: these machines' speed
drifts over minutes.

## How to measure

- The reference engine, no server: `jetspec bench --help` (tokens/s, accept length and speedup against
  autoregressive decoding per method x budget x batch size x temperature) and `jetspec replay --help`
  (greedy accept length only, every budget from one autoregressive run).
- Real SGLang on a CPU, through the test stand-in for sgl-kernel (`tests/sglang_cpu/stub`):
  `python -m bench.sglang_cpu_compare --help` (plain, NGRAM and JETSPEC servers in turn, fresh prompts per
  concurrency level, exact matches against plain SGLang). Before and after a change in one run:
  `--checkout before=DIR` (a `git worktree add DIR <commit>`) and a config `jetspec@before`, whose server
  runs that checkout's plugin, policy and head beside `jetspec` from here, pass by pass with `--interleave`.
- What a decode step costs outside the target's forward, by batch size (1 / 4 / 16) and workload (greedy,
  sampled, grammar, penalised): `python -m bench.step_overhead --help` (device ops per step, and kernel ops:
  the same less the views, the proxy for GPU kernel launches, with `F.rms_norm` one kernel as on CUDA; host
  syncs per step with their code sites; host calls, the torch calls on host data alone;
  host milliseconds per phase, and a probed step's milliseconds outside the forward split into the device ops'
  own, the probe's own cost and the host's work beside them, that work also by phase, with its growth from
  batch 1 to the largest batch), plain SGLang and JETSPEC in real servers on the CPU harness.
- The hybrid drafter's lookups per request against one batched pass, and its draft phase without the head
  (top-K, lookups, trees), by batch size: `python -m bench.lookup_cost --help`; a step's marginal trees,
  the host heap against the batched builder a drafting graph holds: `python -m bench.tree_build --help`.
- The store of finished outputs refreshed at the step after a request finished, incremental against the whole
  store re-indexed, by tokens held: `python -m bench.suffix_store_refresh --help`.
- JETSPEC as operators run it (shipped policy, the server's same-allocation control, `--controller` for the
  controller too) against plain SGLang: `python -m bench.control_plane --help` (chat and code at concurrency
  1 / 4 / 16 after a stated warm-up, interleaved rounds; the steady-state ratio, the seconds to the control's
  first decision that lasts, and how often a decision changed; `--fixed-budgets` against fixed trees,
  `--self-baseline` against JETSPEC itself at budget 0 in the same process).
- Real SGLang on a GPU: [bench/GPU.md](../bench/GPU.md) (`bench/gpu/run.sh`, `bench/gpu/sglang_compare.py`).
- Each run's exact command is at the top of its result file, linked from every row below.
"""


def load(rel: str) -> dict:
    return json.loads((RESULTS / rel).read_text())


def result_link(rel: str) -> str:
    """A row's link: the run's markdown when it has one (it starts with the command), else its JSON."""
    path = RESULTS / rel
    target = path.with_suffix(".md") if path.with_suffix(".md").exists() else path
    name = target.relative_to(RESULTS).as_posix()
    return f"[{name}](../bench/results/{name})"


def table(columns: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def rate_cell(tokens_per_s: float, ratio: float | None) -> str:
    return f"{tokens_per_s:.1f}" if ratio is None else f"{tokens_per_s:.1f} ({times(ratio)})"


def style_axes(ax, xs: set[int], xlabel: str, ylabel: str) -> None:
    """Log2 x axis ticked at the measured values only, a line at 1x: every plot here reads alike."""
    ax.axhline(1.0, color="grey", linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(xs), labels=[str(x) for x in sorted(xs)])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")


def prompt_span(source: str, start: int, count: int) -> str:
    return f"{source} [{start}:{start + count}]"


# --- the reference engine ---------------------------------------------------------------------------


def reference_machine(header: dict) -> str:
    machine = header["machine"]
    choice = f" ({header['dtype_choice']})" if header.get("dtype_choice") else ""
    return f"{machine['cpu']}, {header['dtype']}{choice}, {machine['threads']} threads"


def method_label(record: dict, header: dict) -> str:
    # A run with --acceptance draw alone does not mark its cells (match,draw runs do): mark them here.
    if header.get("acceptance") in ("draw", ["draw"]) and "draw" not in record["method"]:
        return record["method"] + "+draw"
    return record["method"]


def reference_rows(rel: str, report: dict) -> list[list[str]]:
    header = report["header"]
    start = int(header["prompt_range"].split(":")[0] or 0)
    stop = int(header["prompt_range"].split(":")[1])
    workload = f"{prompt_span(header['prompts'], start, stop - start)} x {header['max_new_tokens']}"
    autoregressive = {
        (r["batch_size"], r["temperature"]): r["tokens_per_s"]
        for r in report["records"]
        if r["method"] == "autoregressive"
    }
    return [
        [
            result_link(rel),
            workload,
            str(r["batch_size"]),
            f"{r['temperature']:g}",
            method_label(r, header),
            str(r["budget"]),
            f"{r['tokens_per_s']:.1f}",
            f"{autoregressive[r['batch_size'], r['temperature']]:.1f}",
            f"{r['mean_accept_length']:.2f}",
            times(r["speedup_vs_ar"]),
        ]
        for r in report["records"]
        if r["method"] != "autoregressive"
    ]


def reference_section(reports: dict[str, dict]) -> list[str]:
    by_machine = defaultdict(list)
    for rel, report in reports.items():
        by_machine[reference_machine(report["header"])].extend(reference_rows(rel, report))
    columns = ["run", "prompts x tokens", "batch", "T", "method", "budget", "tokens/s", "AR tokens/s", "accept", "x AR"]
    lines = ["## The reference engine (`jetspec bench`)", ""]
    for machine, rows in by_machine.items():
        lines += [f"### {machine}", "", *table(columns, rows), ""]
    return lines + ["![speedup against budget](img/speedup-vs-budget.png)", ""]


def plot_budget(reports: dict[str, dict], path: Path) -> None:
    """Speedup against budget, one panel per machine, one line per run x batch x temperature x method."""
    panels = defaultdict(list)
    for report in reports.values():
        panels[reference_machine(report["header"])].append(report)
    fig = Figure(figsize=(6 * len(panels), 4.5), layout="constrained")
    for ax, (machine, group) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels.items()):
        budgets = set()
        for report in group:
            header = report["header"]
            lines = defaultdict(list)
            for r in report["records"]:
                if r["method"] != "autoregressive":
                    key = (r["batch_size"], r["temperature"], method_label(r, header))
                    lines[key].append((r["budget"], r["speedup_vs_ar"]))
                    budgets.add(r["budget"])
            for (batch, temperature, method), points in lines.items():
                prompts = f"{header['prompts'].split('/')[-1]} {header['prompt_range']} x{header['max_new_tokens']}"
                ax.plot(*zip(*sorted(points)), marker="o", label=f"{prompts}, b{batch} T{temperature:g}, {method}")
        ax.set_title(machine, fontsize="medium")
        style_axes(ax, budgets, "tree budget (nodes)", "speedup vs autoregressive")
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: the bytes depend on data only


# --- real SGLang on CPU -----------------------------------------------------------------------------


def harness_machine(meta: dict) -> str:
    return f"{meta['cpu']}, {meta['dtype']}, {meta['threads']} threads (SGLang {meta['sglang']}, CPU stand-in)"


def harness_workload(meta: dict) -> str:
    start = int(meta["prompt_range"].split(":")[0] or 0)
    text = f"{prompt_span(meta['source'], start, sum(meta['prompts_per_pass']))} x {meta['max_new_tokens']}"
    if meta.get("shared_prefix"):
        text += f", {meta['shared_prefix_tokens']}-token shared prefix"
    if meta.get("constrained_prompts"):
        text += ", JSON-schema constrained"
    if meta.get("repeats", 1) > 1:
        text += f", {meta['repeats']} rounds (x: the median round's ratio)"
    return text


def harness_rows(rel: str, run: dict, levels: list[int]) -> list[list[str]]:
    meta = run["meta"]
    rows = []
    for result in run["results"]:
        rates, ratios = result["tokens_per_s_by_concurrency"], result["speedup_vs_plain_by_concurrency"]
        cells = [rate_cell(rates[str(c)], ratios[str(c)]) if str(c) in rates else "-" for c in levels]
        accepts = [p["accept_length"] for p in result["passes"]]
        exact = sum(p["exact_match_vs_plain"] for p in result["passes"])
        prompts = sum(p["prompts"] for p in result["passes"])
        accept = " / ".join(f"{a:.2f}" for a in accepts) if None not in accepts else "-"
        baseline = result["config"] == meta.get("baseline", "plain")
        config = result["config"] + (" (baseline)" if baseline else "")
        rows.append([result_link(rel), harness_workload(meta), config, *cells, accept, f"{exact}/{prompts}"])
    return rows


def harness_section(runs: dict[str, dict]) -> list[str]:
    levels = sorted({c for run in runs.values() for c in run["meta"]["concurrency"]})
    by_machine = defaultdict(list)
    for rel, run in runs.items():
        by_machine[harness_machine(run["meta"])].extend(harness_rows(rel, run, levels))
    columns = ["run", "prompts x tokens", "config", *[f"c = {c}" for c in levels], "accept (by c)", "exact"]
    lines = [
        "## Real SGLang on CPU (`bench/sglang_cpu_compare.py`)",
        "",
        "`jetspec` is the shipped policy (hybrid drafter, adaptive sizing). Cells: tokens/s at c concurrent",
        "requests (x the baseline: `plain` SGLang, or `plain+radix` where the run compares the radix cache);",
        "exact: outputs token-identical to the baseline's.",
        "",
    ]
    for machine, rows in by_machine.items():
        lines += [f"### {machine}", "", *table(columns, rows), ""]
    return lines + ["![speedup against concurrency](img/speedup-vs-concurrency.png)", ""]


# --- the control plane as operators run it (bench/control_plane.py) ----------------------------------

# one run per machine and dtype: the newest
CONTROL_PLANE_RUNS = (
    "sglang_cpu/control-plane-fp32-xeon.json",
    "sglang_cpu/control-plane-bf16-xeon.json",
    "sglang_cpu/control-plane-fixed-bf16-xeon.json",
    "sglang_cpu/control-plane-c16-bf16-xeon.json",
    "sglang_cpu/control-plane-useless-bf16-xeon.json",
)


def best_fixed_columns(cell: dict) -> list[str]:
    best = cell["best_fixed_ratio"]
    return [f"{cell['best_fixed']} ({best:.2f}x)", times(cell["steady_ratio"] / best)]


def control_plane_section(runs: dict[str, dict]) -> list[str]:
    columns = ["run", "workload", "c", "cohort", "x plain (rounds)", "steady x plain", "mode", "decided (s)", "changes"]
    lines = [
        "## JETSPEC as operators run it (`bench/control_plane.py`)",
        "",
        "The shipped policy with the server's same-allocation control, after a warm-up of load; plain and JETSPEC",
        "alternate on the same new prompts. Mode: what the control runs the cohort at the end (not run: the",
        "table's budget is 0 there); decided: seconds from the cell's first request to the lasting decision;",
        "changes: mode changes in the cell (after the warm-up). Where fixed budgets ran in turn with them (fixed",
        "trees, no control): the best of them per cell and JETSPEC's steady ratio to it.",
        "",
    ]
    for rel, run in runs.items():
        meta = run["meta"]
        fixed = bool(meta.get("fixed_budgets"))
        rows = [
            [
                result_link(rel),
                c["workload"],
                str(c["concurrency"]),
                c["cohort"],
                " / ".join(f"{r:.2f}" for r in c["ratios"]),
                times(c["steady_ratio"]),
                c["final_mode"] or "not run",
                "-" if c["decided_after_s"] is None else f"{c['decided_after_s']:.0f}",
                f"{c['mode_changes']} ({c['mode_changes_after_warmup']})",
                *(best_fixed_columns(c) if fixed else []),
            ]
            for c in run["cells"]
        ]
        head = meta.get("head", "")
        what = f", head: {head}" if "noise" in head else ""
        what += f", policy: {meta['policy']}" if meta.get("policy", "").startswith("shipped with") else ""
        header = columns + (["best fixed budget", "x best fixed"] if fixed else [])
        lines += [f"### {meta['cpu']}, {meta['dtype']}{what}", "", *table(header, rows), ""]
    return lines


# --- real SGLang on GPU -----------------------------------------------------------------------------


def gpu_servers(run: dict, dtype: str) -> dict[str, dict]:
    """The call's throughput by server, for one dtype (server names read `config@dtype`)."""
    return {server: cells for server, cells in run["throughput"].items() if server.endswith(f"@{dtype}")}


def speedup_over_plain(run: dict, server: str, batch: str) -> float | None:
    """x plain only against the eager plain server of the same call and dtype."""
    plain = run["throughput"].get("plain@" + server.split("@")[1], {})
    return run["throughput"][server][batch]["tok_s"] / plain[batch]["tok_s"] if batch in plain else None


def gpu_rows(rel: str, run: dict, dtype: str) -> list[list[str]]:
    rows = []
    for server, by_batch in gpu_servers(run, dtype).items():
        cells = [rate_cell(c["tok_s"], speedup_over_plain(run, server, b)) for b, c in by_batch.items()]
        accepts = [cell["accept_length"] for cell in by_batch.values()]
        accept = " / ".join(f"{a:.2f}" for a in accepts) if None not in accepts else "-"
        # keyed by the JETSPEC server's label since 2026-11-29 (one entry per JETSPEC server); by dtype before
        by = run.get("identity", {})
        identity = by.get(server) or (by.get(dtype) if server.startswith("jetspec@") else None)
        exact = f"{sum(p['exact'] for p in identity)}/{len(identity)}" if identity else "-"
        rows.append([result_link(rel), server, *cells, accept, exact])
    return rows


def gpu_section(runs: dict[str, dict]) -> list[str]:
    by_machine = defaultdict(list)
    for rel, run in runs.items():
        dtype = GPU_RUNS[rel][0]
        by_machine[f"{run['meta']['device']}, {dtype}"].extend(gpu_rows(rel, run, dtype))
    columns = ["run", "server", "bs 1", "bs 4", "bs 16", "accept (by bs)", "greedy identical"]
    lines = [
        "## Real SGLang on GPU (`bench/gpu/sglang_compare.py`)",
        "",
        "Cells: tokens/s at batch size bs (x `plain`, SGLang eager as JETSPEC runs it: no CUDA graphs, no overlap",
        "scheduler; only against the same call and dtype). `plain+defaults`: SGLang's defaults; `+phases`: with",
        "`--enable-metrics` (a device sync per phase). Greedy identical: HumanEval prompts x 64 tokens equal to",
        "plain SGLang's. Triton attention, the test-only stand-in for sgl-kernel ([bench/GPU.md](../bench/GPU.md)).",
        "",
    ]
    for machine, rows in sorted(by_machine.items()):
        lines += [f"### {machine}", "", *table(columns, rows), ""]
    return lines


def plot_concurrency(sweeps: dict[str, dict], gpu: dict[str, dict], path: Path) -> None:
    """Speedup over the baseline against concurrent requests: the CPU sweeps, and the GPU's batch sizes."""
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    cpu_ax, gpu_ax = fig.subplots(1, 2)
    for run in sweeps.values():
        for result in run["results"]:
            if result["config"] != run["meta"].get("baseline", "plain"):
                points = sorted((int(c), x) for c, x in result["speedup_vs_plain_by_concurrency"].items())
                label = f"{run['meta']['source'].split('/')[-1]}: {result['config']}"
                cpu_ax.plot(*zip(*points), marker="o", label=label)
    cpu_ax.set_title(harness_machine(next(iter(sweeps.values()))["meta"]), fontsize="medium")
    batches = set()
    for rel, run in gpu.items():
        for server, by_batch in gpu_servers(run, GPU_RUNS[rel][0]).items():
            points = [(int(b), speedup_over_plain(run, server, b)) for b in by_batch]
            if not server.startswith("plain") and None not in dict(points).values():
                gpu_ax.plot(*zip(*points), marker="o", label=f"{rel.split('/')[1]} {server}")
                batches.update(int(b) for b in by_batch)
    gpu_ax.set_title(f"{next(iter(gpu.values()))['meta']['device']}, against eager plain SGLang", fontsize="medium")
    levels = {c for run in sweeps.values() for c in run["meta"]["concurrency"]}
    style_axes(cpu_ax, levels, "concurrent requests", "speedup vs baseline")
    style_axes(gpu_ax, batches, "batch size (concurrent requests)", "speedup vs eager plain SGLang")
    fig.savefig(path, dpi=100, metadata={"Software": None})


# --- the page ---------------------------------------------------------------------------------------


def inputs_section() -> list[str]:
    """Why each input is the one shown: the constants above, so the page says what the script reads."""
    lines = ["## Inputs", "", "Shown (why each is current):", ""]
    for inputs in (REFERENCE_RUNS, SGLANG_CPU_RUNS):
        lines += [f"- {result_link(rel)}: {why}" for rel, why in inputs.items()]
    lines += [f"- {result_link(rel)}, {dtype}: {why}" for rel, (dtype, why) in GPU_RUNS.items()]
    lines += ["", "Left out:", ""]
    return lines + [f"- `bench/results/{rel}`: {why}" for rel, why in LEFT_OUT.items()] + [""]


def main(out: Path = DOCS) -> Path:
    """Write OUT/benchmarks.md and OUT/img/*.png; return the markdown's path."""
    reference = {rel: load(rel) for rel in REFERENCE_RUNS}
    harness = {rel: load(rel) for rel in SGLANG_CPU_RUNS}
    gpu = {rel: load(rel) for rel in GPU_RUNS}
    control = {rel: load(rel) for rel in CONTROL_PLANE_RUNS}
    (out / "img").mkdir(parents=True, exist_ok=True)
    plot_budget(reference, out / "img" / "speedup-vs-budget.png")
    plot_concurrency({rel: harness[rel] for rel in CONCURRENCY_SWEEPS}, gpu, out / "img" / "speedup-vs-concurrency.png")
    sections = [
        HEADER,
        *reference_section(reference),
        *harness_section(harness),
        *control_plane_section(control),
        *gpu_section(gpu),
    ]
    page = "\n".join([*sections, *inputs_section()]).rstrip("\n") + "\n"
    path = out / "benchmarks.md"
    path.write_text(page)
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS, help="folder for benchmarks.md and img/ (default docs/)")
    print(main(parser.parse_args().out))
