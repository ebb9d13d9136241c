"""Does a probe run on a share of steps estimate the goodput that budget would have as the incumbent?

    OMP_NUM_THREADS=1 python -m bench.controller_probe_bias [--reps 2] [--out bench/results/controller-probe-bias.md]

Serves the controller e2e workload (`jetspec serve --drafter lookup`, copy prompts, four closed-loop
clients: cohort bs2-8) and, per repetition, pushes in turn:
- budget 4 alone, then budget 16 alone: each budget's goodput as the incumbent (the truth);
- budget 4 with probe 16, and budget 16 with probe 4, at probe share 0.1, and the two alternating
  step by step (share 0.5): the per-step evidence the controller compares.
Goodput = committed tokens / request-seconds per budget from the server's counters, as the controller
computes it. The question is whether goodput(16) / goodput(4) from the probe phases matches the ratio
from the incumbent phases.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from harness.client import metrics, post
from harness.serve import drive_load, start_serve, wait_for_url

REPO = Path(__file__).resolve().parents[1]
# the controller end-to-end test's workload: copy prompts, 64 new tokens each
COPY_PROMPTS = REPO / "tests" / "data" / "copy_prompts.jsonl"
MAX_NEW_TOKENS = 64
ADMIN_KEY_ENV, ADMIN_SECRET = "JETSPEC_PROBE_BIAS_ADMIN_KEY", "probe-bias-admin-key"
POLICY = """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16], default: 4}
  - {name: bs2-8, min_batch: 2, max_batch: 8, budgets: [0, 4, 16], default: 4}
gate: {probe_share: 0.5}
"""
COHORT = "bs2-8"
COUNTERS = ("jetspec_committed_tokens_total", "jetspec_request_seconds_total", "jetspec_steps_total")
CLIENTS = 4


def counters(url: str) -> dict[tuple[str, int], float]:
    found = metrics(url)
    return {
        (name, int(labels["budget"])): value
        for name in COUNTERS
        for labels, value in ((dict(items), value) for items, value in found.get(name, {}).items())
        if labels.get("cohort") == COHORT
    }


def push(url: str, budget: int, probe: int | None, share: float) -> None:
    flat = {"jetspec_policy.ttl_s": 3600.0, "jetspec_policy.bs1.budget": 4, f"jetspec_policy.{COHORT}.budget": budget}
    if probe is not None:
        flat |= {f"jetspec_policy.{COHORT}.probe_budget": probe, f"jetspec_policy.{COHORT}.probe_share": share}
    status, answer = post(
        f"{url}/set_internal_state", {"server_args": flat}, {"Authorization": f"Bearer {ADMIN_SECRET}"}, 120
    )
    if status != 200:
        raise RuntimeError(f"push refused: {status} {answer}")


def copy_requests(target_dir: Path) -> list[dict]:
    """The /generate bodies: each copy prompt in the model's chat template, greedy."""
    from transformers import AutoTokenizer

    from sglang_jetspec.reference.prompts import load_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    return [
        {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}}
        for ids in load_prompt_ids(str(COPY_PROMPTS), tokenizer)
    ]


def phase(
    url: str, payloads: list[dict], seconds: float, budget: int, probe: int | None = None, share: float = 0.0
) -> dict[int, dict[str, float]]:
    """Per budget that ran: goodput, tokens per step and steps over `seconds` of load."""
    push(url, budget, probe, share)
    before = counters(url)
    end = time.monotonic() + seconds
    drive_load(url, payloads, CLIENTS, lambda: time.monotonic() > end, max_s=10 * seconds)
    after = counters(url)
    out = {}
    for b in {b for _, b in after}:
        tokens, seconds_, steps = (after.get((n, b), 0.0) - before.get((n, b), 0.0) for n in COUNTERS)
        if steps > 0:
            out[b] = {"goodput": tokens / seconds_, "tokens_per_step": tokens / steps, "steps": steps}
    return out


def measure(url: str, payloads: list[dict], reps: int, seconds: float) -> list[str]:
    """The table's rows: per repetition, goodput(16) / goodput(4) as each phase sees it."""
    rows = []
    phase(url, payloads, 10, 4)  # warm-up
    for rep in range(reps):
        only4 = phase(url, payloads, 2 * seconds / 3, 4)
        only16 = phase(url, payloads, 2 * seconds / 3, 16)
        low = phase(url, payloads, seconds, 4, 16, 0.1)
        high = phase(url, payloads, seconds, 16, 4, 0.1)
        alternating = phase(url, payloads, seconds, 4, 16, 0.5)
        views = {
            "incumbents alone (truth)": (only16[16], only4[4]),
            "budget 4, probe 16 at share 0.1": (low[16], low[4]),
            "budget 16, probe 4 at share 0.1": (high[16], high[4]),
            "alternating 4 / 16 (share 0.5)": (alternating[16], alternating[4]),
        }
        for name, (b16, b4) in views.items():
            rows.append(
                f"| {rep} | {name} | {b4['goodput']:.2f} | {b16['goodput']:.2f} | "
                f"**{b16['goodput'] / b4['goodput']:.2f}** | {b4['tokens_per_step']:.2f} | "
                f"{b16['tokens_per_step']:.2f} | {b4['steps']:.0f} / {b16['steps']:.0f} |"
            )
            print(rows[-1], flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="load per probe phase (incumbent phases: 2/3 of it)"
    )
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "controller-probe-bias.md"))
    args = parser.parse_args()
    target = Path.home() / ".cache/sglang-jetspec/models/smollm2-135m-instruct"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "policy.yaml").write_text(POLICY)
        server = start_serve(
            [
                "--target",
                str(target),
                "--drafter",
                "lookup",
                "--policy",
                str(work / "policy.yaml"),
                "--port",
                "0",
                "--max-batch-size",
                "8",
                "--admin-api-key-env",
                ADMIN_KEY_ENV,
            ],
            work,
            {ADMIN_KEY_ENV: ADMIN_SECRET},
        )
        try:
            url = wait_for_url(server)
            rows = measure(url, copy_requests(target), args.reps, args.seconds)
        finally:
            server.stop()
    text = (
        f"""# Controller probes vs incumbents: goodput(16) / goodput(4)

Command: `OMP_NUM_THREADS=1 python -m bench.controller_probe_bias --reps {args.reps} --seconds {args.seconds:g}`
(this 2-core CPU; `jetspec serve --drafter lookup`, SmolLM2-135M fp32, the controller end-to-end test's copy
prompts, {CLIENTS} closed-loop clients, cohort {COHORT}). Goodput: committed tokens per
request-second of that budget's steps, from the server's counters, as the controller computes it.

| rep | phase | goodput 4 | goodput 16 | ratio 16 / 4 | tokens/step 4 | tokens/step 16 | steps 4 / 16 |
|---|---|---|---|---|---|---|---|
"""
        + "\n".join(rows)
        + "\n"
    )
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
