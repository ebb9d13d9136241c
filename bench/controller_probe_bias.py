"""Does a probe run on a share of steps estimate the goodput that budget would have as the incumbent?

    OMP_NUM_THREADS=1 python bench/controller_probe_bias.py [--reps 2] [--out bench/results/controller-probe-bias.md]

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
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import test_controller_e2e as e2e  # noqa: E402  (its server launcher, load driver and scraper)

from controller.http import urllib_transport  # noqa: E402

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
    return {
        (s.name, int(s.labels["budget"])): s.value
        for s in e2e.scrape(url)
        if s.name in COUNTERS and s.labels.get("cohort") == COHORT
    }


def push(url: str, budget: int, probe: int | None, share: float) -> None:
    flat = {"jetspec_policy.ttl_s": 3600.0, "jetspec_policy.bs1.budget": 4, f"jetspec_policy.{COHORT}.budget": budget}
    if probe is not None:
        flat |= {f"jetspec_policy.{COHORT}.probe_budget": probe, f"jetspec_policy.{COHORT}.probe_share": share}
    status, answer = urllib_transport(
        "POST",
        f"{url}/set_internal_state",
        {"Content-Type": "application/json", "Authorization": f"Bearer {e2e.ADMIN_SECRET}"},
        json.dumps({"server_args": flat}).encode(),
        e2e.HTTP_TIMEOUT_S,
    )
    assert status == 200, answer


def phase(
    url: str, payloads: list[dict], seconds: float, budget: int, probe: int | None = None, share: float = 0.0
) -> dict[int, dict[str, float]]:
    """Per budget that ran: goodput, tokens per step and steps over `seconds` of load."""
    push(url, budget, probe, share)
    before = counters(url)
    end = time.monotonic() + seconds
    e2e.drive_load(url, payloads, CLIENTS, lambda: time.monotonic() > end)
    after = counters(url)
    out = {}
    for b in {b for _, b in after}:
        tokens, seconds_, steps = (after.get((n, b), 0.0) - before.get((n, b), 0.0) for n in COUNTERS)
        if steps > 0:
            out[b] = {"goodput": tokens / seconds_, "tokens_per_step": tokens / steps, "steps": steps}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="load per probe phase (incumbent phases: 2/3 of it)"
    )
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "controller-probe-bias.md"))
    args = parser.parse_args()
    target = Path.home() / ".cache/sglang-jetspec/models/smollm2-135m-instruct"
    e2e.PHASE_S = 10 * args.seconds  # drive_load's own cap; phases end on their own clock
    rows = []
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        (work / "policy.yaml").write_text(POLICY)
        server = e2e.launch(
            stack,
            "serve",
            [
                "-m",
                "sglang_jetspec.cli",
                "serve",
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
                e2e.ADMIN_KEY_ENV,
            ],
            work,
        )
        url = e2e.wait_for_url(server)
        payloads = e2e.copy_requests(target)
        phase(url, payloads, 10, 4)  # warm-up
        for rep in range(args.reps):
            only4 = phase(url, payloads, 2 * args.seconds / 3, 4)
            only16 = phase(url, payloads, 2 * args.seconds / 3, 16)
            low = phase(url, payloads, args.seconds, 4, 16, 0.1)
            high = phase(url, payloads, args.seconds, 16, 4, 0.1)
            alternating = phase(url, payloads, args.seconds, 4, 16, 0.5)
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
    text = (
        f"""# Controller probes vs incumbents: goodput(16) / goodput(4)

Command: `OMP_NUM_THREADS=1 python bench/controller_probe_bias.py --reps {args.reps} --seconds {args.seconds:g}`
(this 2-core CPU; `jetspec serve --drafter lookup`, SmolLM2-135M fp32, the copy prompts of
`tests/test_controller_e2e.py`, {CLIENTS} closed-loop clients, cohort {COHORT}). Goodput: committed tokens per
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
