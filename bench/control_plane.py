"""JETSPEC as operators run it against plain SGLang on the CPU harness: steady state, time to decision, flips.

    python -m bench.control_plane --concurrency 1,4,16 --warmup-s 60 --rounds 2 \
        --json bench/results/sglang_cpu/control-plane.json --markdown bench/results/sglang_cpu/control-plane.md

Two servers stay up for the whole run (both asleep when idle): plain SGLang and JETSPEC under the shipped
policy (or JETSPEC_POLICY), its same-allocation control on as shipped; `--controller` adds `python -m
controller` pushing tables to it, as docs/operators.md runs it. For each workload (chat: bench/prompts/
chat.jsonl; code: HumanEval 100-163, the prompts no tuning saw) and concurrency level, in that order on the
same JETSPEC server (so a cell starts from the decision the previous one left):
- warm-up: `--warmup-s` seconds of closed-loop load on JETSPEC at that concurrency, from prompts the timed
  rounds never send (bench/prompts/chat-tune.jsonl; HumanEval 0-99), so its control and the controller
  see the load before anything is timed;
- `--rounds` rounds: plain and JETSPEC take turns on the same new prompts (the order alternating), and each
  round's JETSPEC / plain tokens per second is one ratio; the steady-state ratio is their median. The rate
  is timed while every client has a request in flight (`busy_rate`: to the pass's last send), not over the
  drain after it, which a pass of one wave at 16 concurrent requests is largely made of; so give
  `--num-prompts` above the concurrency (at 16: 32, two waves). A cell whose passes have no busy stretch
  (no more prompts than clients) falls back to whole passes; the table says which, and gives the ratios
  over whole passes beside. `--length-spread S` gives the requests max_new_tokens spread over
  `--max-new-tokens` +- S (token_limits): with one limit for all, native requests that start together
  finish together and the next wave's prefills batch, which speculation's uneven pace does not get.
A thread reads JETSPEC's `/server_info` every half second; for the cohort the level falls in it reports the
seconds from the cell's first request to the first decision of the control that matches its mode at the
cell's end, and how many times the mode changed (in all, and after the warm-up).

`--self-baseline` also times, in every round, the JETSPEC server itself with the cell's cohort pushed to
budget 0 (its steps native, the draft context kept; every other cohort, which the round's tail reaches as
requests finish, as before), then pushes the YAML's defaults back (for an hour: a cohort whose YAML
default is 0 then keeps its context too): the ratio of JETSPEC to itself with that cohort native, one
process, no bias between processes, prefills and the scheduler included: what the control's decision
for that cohort stands for.

`--fixed-budgets 4,8,16` also starts one JETSPEC server per budget, every cohort at that budget (any
budget: every cohort lists only it, off and the gate's re-probe budget) with fixed trees and no
same-allocation control (the static configurations an operator could pick by hand); they take their turns
in every round, and each cell reports the best of them and JETSPEC's steady ratio to it.

A cell where speculation cannot pay (issue 59's test of the control): `--useless-head` drafts with
harness/useless_head.py's noise head, and `--fixed-budget 16` holds every cohort at 16-node fixed trees
(the sizer would otherwise shrink them itself), so only the same-allocation control can turn it off:

    python -m bench.control_plane --useless-head --fixed-budget 16 --workloads code --concurrency 1 \
        --warmup-s 60 --rounds 4 --json ... --markdown ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.sglang_cpu_compare import generate as compare_generate
from bench.sglang_cpu_compare import policy_env, positive_ints
from harness.client import get
from harness.compare import WARMUP_TEXT
from harness.policy_push import push_budgets
from harness.serve import start_controller
from harness.sglang_cpu import HEAD, jetspec_args, launch, server_args
from harness.useless_head import make_useless_head
from policies.cohorts import cohort_index_for_batch

ADMIN_KEY_ENV = "JETSPEC_BENCH_ADMIN_KEY"
ADMIN_KEY = "control-plane-bench"
# workload -> (timed prompts, warm-up prompts): warm-up prompts are never timed
WORKLOADS = {
    "chat": (("bench/prompts/chat.jsonl", slice(None)), ("bench/prompts/chat-tune.jsonl", slice(None))),
    "code": (("humaneval", slice(100, 164)), ("humaneval", slice(0, 100))),
}
POLL_S = 0.5


@dataclass
class Cell:
    workload: str
    concurrency: int
    cohort: str
    plain_tokens_per_s: list[float]
    jetspec_tokens_per_s: list[float]
    ratios: list[float]
    steady_ratio: float
    final_mode: str | None  # speculative / native; None: the control never ran (the table does not speculate)
    decided_after_s: float | None  # from the cell's first request; None: no decision matching the final mode
    mode_changes: int
    mode_changes_after_warmup: int
    gain: float | None
    fixed_tokens_per_s: dict[str, list[float]] = field(default_factory=dict)  # budget -> its rounds
    best_fixed: str | None = None  # the budget whose median ratio to plain is highest
    best_fixed_ratio: float | None = None  # its median ratio to plain
    self_native_tokens_per_s: list[float] = field(default_factory=list)  # JETSPEC, the cell's cohort pushed to 0
    # what the rates above are: "busy" (busy_rate: while every client had a request in flight) where every
    # pass had more prompts than clients, else "whole" (each pass's tokens over its wall time)
    measure: str = "whole"
    whole_ratios: list[float] = field(default_factory=list)  # JETSPEC / plain over whole passes, drain included


def cohort_of(cohorts, batch: int) -> str:
    """The name of the policy cohort a batch of `batch` requests runs in."""
    return cohorts[cohort_index_for_batch(cohorts, batch)].name


def jetspec_state(url: str) -> dict:
    return json.loads(get(f"{url}/server_info", timeout=30))["internal_states"][0]


class StatePoller:
    """(seconds since start, same-allocation state) every POLL_S, in a thread."""

    def __init__(self, url: str) -> None:
        self.url, self.series, self._stop = url, [], threading.Event()
        self.start = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                state = jetspec_state(self.url)["jetspec_same_allocation"]
                self.series.append((time.monotonic() - self.start, state))
            except OSError:
                pass
            self._stop.wait(POLL_S)

    def stop(self) -> list:
        self._stop.set()
        self._thread.join()
        return self.series


def decision_summary(
    series: list, cohort: str, warmup_s: float
) -> tuple[str | None, float | None, int, int, float | None]:
    """(final mode, seconds to the first decided reading in it, mode changes, changes after warm-up, gain)."""
    readings = [(t, state[cohort]) for t, state in series if state and (state.get(cohort) or {}).get("mode")]
    if not readings:
        return None, None, 0, 0, None
    modes = [(t, entry["mode"]) for t, entry in readings]
    changes = [t for (_, a), (t, b) in zip(modes, modes[1:]) if a != b]
    final = readings[-1][1]
    decided = next((t for t, entry in readings if entry["decided"] and entry["mode"] == final["mode"]), None)
    return final["mode"], decided, len(changes), sum(t > warmup_s for t in changes), final["gain"]


def best_fixed(plain: list[float], fixed: dict[str, list[float]]) -> tuple[str | None, float | None]:
    """The fixed budget with the highest median per-round ratio to plain, and that ratio."""
    medians = {budget: statistics.median(r / q for r, q in zip(rates, plain)) for budget, rates in fixed.items()}
    if not medians:
        return None, None
    budget = max(medians, key=medians.get)
    return budget, medians[budget]


def fixed_budget_policy(budget: int, control: bool) -> dict:
    """bench.sglang_cpu_compare.policy_env's changes for every cohort at `budget` with fixed trees. Without
    `control`, every cohort lists only that budget, off and the gate's re-probe budget (the shipped policy's;
    so any budget fits every cohort, and SGLang reserves KV for what is served), and the same-allocation
    control's section is off; with it, the cohorts keep their budgets (`budget` must be among each one's)."""
    changes = {"default": budget, "tree_sizing": "fixed"}
    if control:
        return changes
    from policies.loader import load_policy
    from sglang_jetspec.adapter.policy import policy_path

    budgets = sorted({0, load_policy(policy_path()).gate.reprobe_budget, budget})
    return {**changes, "budgets": budgets, "same_allocation": {"enabled": False}}


def generate(url: str, prompt: list[int], max_new_tokens: int) -> dict:
    return compare_generate(url, (prompt, {}), max_new_tokens)  # greedy, unconstrained


@dataclass(frozen=True)
class Served:
    """One request of a timed pass: when a client sent it and got its reply (one clock), and its tokens."""

    sent: float
    replied: float
    tokens: int


@dataclass(frozen=True)
class PassRates:
    whole: float  # tokens over the pass's wall time, the drain at its end included
    busy: float | None  # tokens per second while every client had a request in flight (busy_rate)


def busy_rate(served: list[Served], start: float, clients: int) -> float | None:
    """Tokens per second from the pass's `start` to its last send: until then each client sends its next
    prompt as its reply comes, so every one has a request in flight (the load the cell names); after it
    the clients drain one by one, and speculation's uneven speed per request leaves a few slow requests
    running at a small batch there, a load the cell does not name. A request still running at the last
    send counts the share of its tokens its elapsed share of its time stands for (its tokens taken as
    evenly spread over it, its prefill included: a slight credit to the system with shorter requests).
    None when every prompt was sent at once (no more prompts than `clients`): no busy stretch to time."""
    if len(served) <= clients:
        return None
    end = max(s.sent for s in served)
    tokens = sum(s.tokens * min(1.0, (end - s.sent) / max(s.replied - s.sent, 1e-9)) for s in served)
    return tokens / (end - start)


def token_limits(count: int, mean: int, spread: int) -> list[int]:
    """`count` requests' max_new_tokens, evenly over mean +- spread in a fixed shuffled order (the same for
    every server). With one limit for all, requests that start together finish together at native speed,
    and the next wave's prefills run as one batch; speculation's uneven speed per request admits them one
    at a time, each a forward of its own: at 16 concurrent chat requests on a CPU that, not the decode
    steps, made JETSPEC lose to itself with the cohort native (issue 59). Traffic with lengths of its own
    has no such lockstep."""
    if spread == 0 or count == 1:
        return [mean] * count
    limits = [mean - spread + round(2 * spread * k / (count - 1)) for k in range(count)]
    random.Random(0).shuffle(limits)
    return limits


def timed_pass(url: str, prompts: list[list[int]], level: int, limits: list[int]) -> PassRates:
    """`prompts` sent by `level` clients, each sending the next as its reply comes; prompt i with at most
    `limits[i]` new tokens."""
    start = time.perf_counter()

    def one(job: tuple[list[int], int]) -> Served:
        sent = time.perf_counter()
        reply = generate(url, *job)
        return Served(sent, time.perf_counter(), reply["meta_info"]["completion_tokens"])

    with ThreadPoolExecutor(level) as pool:
        served = list(pool.map(one, zip(prompts, limits)))
    return PassRates(sum(s.tokens for s in served) / (time.perf_counter() - start), busy_rate(served, start, level))


def closed_loop(url: str, prompts: list[list[int]], level: int, seconds: float, limits: list[int]) -> None:
    """`level` clients sending prompts back to back (cycling through `prompts`, prompt i with at most
    `limits[i]` new tokens) for `seconds`."""
    deadline = time.monotonic() + seconds
    counter = iter(range(1 << 30))
    lock = threading.Lock()

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                i = next(counter)
            generate(url, prompts[i % len(prompts)], limits[i % len(prompts)])

    with ThreadPoolExecutor(level) as pool:
        list(pool.map(lambda _: client(), range(level)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.control_plane", description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="chat,code", help=f"comma-separated, of {','.join(WORKLOADS)}")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--warmup-s", type=float, default=60.0, help="seconds of untimed load before each cell's rounds")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds per cell, each on new prompts")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts per round (at least the concurrency)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--length-spread",
        type=int,
        default=0,
        help="requests' max_new_tokens spread evenly over max-new-tokens +- this (0: all the same; see token_limits)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--controller", action="store_true", help="also run python -m controller against JETSPEC")
    heads = p.add_mutually_exclusive_group()
    heads.add_argument("--head", type=Path, default=HEAD, help="JETSPEC's draft head (default: the shipped one)")
    heads.add_argument(
        "--useless-head", action="store_true", help="draft with noise weights, the head alone: speculation cannot pay"
    )
    p.add_argument(
        "--fixed-budget",
        type=int,
        help="every cohort's default budget, with fixed trees (one of each cohort's budgets; the control stays on)",
    )
    p.add_argument(
        "--fixed-budgets",
        default="",
        help="also time a JETSPEC server per budget (fixed trees, no control), e.g. 4,8,16: the best fixed choice",
    )
    p.add_argument(
        "--self-baseline",
        action="store_true",
        help="also time JETSPEC itself with the cell's cohort pushed to budget 0 in every round (one process)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--port", type=int, default=31200)
    p.add_argument("--model", help="target checkpoint directory (default: jetspec model fetch smollm2)")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--markdown", type=Path, required=True)
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/control-plane-logs"))
    args = p.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    if not workloads or set(workloads) - set(WORKLOADS):
        p.error(f"--workloads {args.workloads}: choose from {','.join(WORKLOADS)}")
    levels = positive_ints(args.concurrency)
    if not levels:
        p.error(f"--concurrency {args.concurrency}: give positive integers separated by commas, e.g. 1,4,16")
    if args.rounds < 1 or args.warmup_s < 0:
        p.error("--rounds must be >= 1 and --warmup-s >= 0")
    if not 0 <= args.length_spread < args.max_new_tokens:
        p.error(f"--length-spread {args.length_spread}: give 0 up to --max-new-tokens - 1 ({args.max_new_tokens - 1})")
    fixed_budgets = positive_ints(args.fixed_budgets) if args.fixed_budgets else []
    if args.fixed_budgets and not fixed_budgets:
        p.error(f"--fixed-budgets {args.fixed_budgets}: give budgets >= 1 separated by commas, e.g. 4,8,16")

    import sglang
    import torch
    from transformers import AutoTokenizer

    from sglang_jetspec.adapter.policy import policy_path
    from sglang_jetspec.models.fetch import fetch
    from sglang_jetspec.reference.precision import cpu_model
    from sglang_jetspec.reference.prompts import encode, load_prompt_records

    model = args.model or str(fetch("smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(model)

    def prompts(source: tuple[str, slice]) -> list[list[int]]:
        return [encode(r, tokenizer) for r in load_prompt_records(source[0])[source[1]]]

    timed = {w: prompts(WORKLOADS[w][0]) for w in workloads}
    warm = {w: prompts(WORKLOADS[w][1]) for w in workloads}
    per_cell = [max(args.num_prompts, level) * args.rounds for level in levels]
    for w in workloads:
        if sum(per_cell) > len(timed[w]):
            p.error(
                f"{w}: {len(timed[w])} timed prompts, but {args.rounds} rounds at concurrency {args.concurrency} "
                f"need {sum(per_cell)} new ones; lower --rounds or --num-prompts"
            )
    from policies import load_policy

    args.log_dir.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": str(args.threads), ADMIN_KEY_ENV: ADMIN_KEY}
    policy_changes = {} if args.fixed_budget is None else fixed_budget_policy(args.fixed_budget, control=True)
    if args.useless_head:
        policy_changes["drafter"] = "head"  # the noise head alone: looked-up continuations would still pay
    if policy_changes:
        env.update(policy_env("jetspec", args.log_dir, {"jetspec": policy_changes}))
    policy_file = Path(env.get("JETSPEC_POLICY") or policy_path())
    policy = load_policy(policy_file)
    head = make_useless_head(HEAD, args.log_dir / "useless-head") if args.useless_head else args.head
    common = dict(dtype=args.dtype, max_total_tokens=32768, max_running=max(4, max(levels)))
    cells = []
    # every server started is stopped, whatever fails after it (a later launch included): none outlives the run
    with contextlib.ExitStack() as running:
        plain = running.enter_context(
            launch(
                server_args(model, "--disable-overlap-schedule", port=args.port, **common),
                args.log_dir / "plain.log",
                env,
            )
        )
        jetspec_argv = jetspec_args(
            model, "--enable-metrics", "--admin-api-key", ADMIN_KEY, port=args.port + 1, **common, head=head
        )
        jetspec = running.enter_context(launch(jetspec_argv, args.log_dir / "jetspec.log", env))
        fixed_servers = {}
        for k, budget in enumerate(fixed_budgets):
            name = f"fixed-{budget}"
            variant = {name: fixed_budget_policy(budget, control=False)}
            fixed_env = {**env, **policy_env(name, args.log_dir, variant)}
            fixed_args = jetspec_args(model, port=args.port + 2 + k, **common, head=head)
            fixed_servers[str(budget)] = running.enter_context(
                launch(fixed_args, args.log_dir / f"{name}.log", fixed_env)
            )
        warmup_ids = tokenizer(WARMUP_TEXT)["input_ids"]
        for server in (plain, jetspec, *fixed_servers.values()):
            generate(server.url, warmup_ids, 8)
        if args.controller:
            running.callback(start_controller(policy_file, [jetspec.url], ADMIN_KEY_ENV, args.log_dir, env=env).stop)
        for w in workloads:
            start = 0
            for level in levels:
                n = max(args.num_prompts, level)
                cohort = cohort_of(policy.cohorts, level)
                poller = StatePoller(jetspec.url)
                warm_limits = token_limits(len(warm[w]), args.max_new_tokens, args.length_spread)
                closed_loop(jetspec.url, warm[w], level, args.warmup_s, warm_limits)
                limits = token_limits(n, args.max_new_tokens, args.length_spread)
                plain_passes, jetspec_passes, self_passes = [], [], []
                fixed_passes = {budget: [] for budget in fixed_servers}
                for k in range(args.rounds):
                    batch = timed[w][start : start + n]
                    start += n
                    order = [(plain, plain_passes), (jetspec, jetspec_passes)]
                    order += [(server, fixed_passes[budget]) for budget, server in fixed_servers.items()]
                    for server, passes in order if k % 2 == 0 else order[::-1]:
                        passes.append(timed_pass(server.url, batch, level, limits))
                    if args.self_baseline:
                        defaults = {c.name: c.default for c in policy.cohorts}
                        push_budgets(jetspec.url, ADMIN_KEY, {**defaults, cohort: 0})
                        self_passes.append(timed_pass(jetspec.url, batch, level, limits))
                        push_budgets(jetspec.url, ADMIN_KEY, defaults)
                every = [*plain_passes, *jetspec_passes, *self_passes, *(r for v in fixed_passes.values() for r in v)]
                measure = "busy" if all(r.busy is not None for r in every) else "whole"

                def rates(passes: list[PassRates]) -> list[float]:
                    return [r.busy if measure == "busy" else r.whole for r in passes]

                plain_rates, jetspec_rates = rates(plain_passes), rates(jetspec_passes)
                fixed_rates = {budget: rates(passes) for budget, passes in fixed_passes.items()}
                mode, decided, changes, late, gain = decision_summary(poller.stop(), cohort, args.warmup_s)
                ratios = [j / q for j, q in zip(jetspec_rates, plain_rates)]
                cell = Cell(
                    w,
                    level,
                    cohort,
                    plain_rates,
                    jetspec_rates,
                    ratios,
                    statistics.median(ratios),
                    mode,
                    decided,
                    changes,
                    late,
                    gain,
                    fixed_rates,
                    *best_fixed(plain_rates, fixed_rates),
                    rates(self_passes),
                    measure,
                    [j.whole / q.whole for j, q in zip(jetspec_passes, plain_passes)],
                )
                print(json.dumps(asdict(cell)), flush=True)
                cells.append(cell)
    meta = {
        "command": "python -m bench.control_plane " + " ".join(sys.argv[1:] if argv is None else argv),
        "cpu": cpu_model(),
        "dtype": args.dtype,
        "policy": f"shipped with every cohort's {policy_changes}" if policy_changes else str(policy_file),
        "head": "noise weights (harness/useless_head.py)" if args.useless_head else str(head),
        "controller": args.controller,
        "warmup_s": args.warmup_s,
        "rounds": args.rounds,
        "fixed_budgets": fixed_budgets,
        "self_baseline": args.self_baseline,
        "max_new_tokens": args.max_new_tokens,
        "length_spread": args.length_spread,
        "sglang": sglang.__version__,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "cells": [asdict(c) for c in cells]}, indent=2) + "\n")
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(markdown(cells, meta))
    print(args.markdown.read_text())
    return 0


def markdown(cells: list[Cell], meta: dict) -> str:
    fixed = bool(meta.get("fixed_budgets"))
    itself = bool(meta.get("self_baseline"))
    lines = [
        "# JETSPEC as operators run it vs plain SGLang (CPU harness)",
        "",
        f"`{meta['command']}`",
        "",
        f"{meta['cpu']}, {meta['dtype']}, SGLang {meta['sglang']}, torch {meta['torch']}, {meta['date']}; policy "
        f"{meta['policy']}; head {meta['head']}; controller {'on' if meta['controller'] else 'off'}; "
        f"warm-up {meta['warmup_s']:g} s of load per cell before {meta['rounds']} timed rounds of requests of "
        f"{meta['max_new_tokens']} +- {meta.get('length_spread', 0)} new tokens (plain and "
        "JETSPEC alternating on the same new prompts"
        + (f"; fixed budgets {', '.join(map(str, meta['fixed_budgets']))} in turn with them)." if fixed else ").")
        + " Rate `busy`: tokens per second while every client had a request in flight (to a pass's last send,"
        " bench.control_plane.busy_rate); `whole`: over each whole pass, its drain included (a pass with no"
        " more prompts than clients has no busy stretch).",
        "",
        "| workload | concurrency | cohort | rate | plain tok/s | JETSPEC tok/s | x plain by round | steady x plain | "
        "x plain by round, whole passes | mode at end | decided after (s) | mode changes (after warm-up) | "
        "control's gain |"
        + (" best fixed budget (x plain) | x best fixed |" if fixed else "")
        + (" itself, cohort native tok/s | x itself by round | x itself, cohort native |" if itself else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        + ("---|---|" if fixed else "")
        + ("---|---|---|" if itself else ""),
    ]
    for c in cells:
        mode = c.final_mode or "not run (the table's budget 0)"
        decided = "-" if c.decided_after_s is None else f"{c.decided_after_s:.0f}"
        gain = "-" if c.gain is None else f"{c.gain:.2f}"
        whole = " / ".join(f"{r:.2f}" for r in c.whole_ratios) or "-"
        row = (
            f"| {c.workload} | {c.concurrency} | {c.cohort} | {c.measure} | "
            f"{statistics.fmean(c.plain_tokens_per_s):.1f} | {statistics.fmean(c.jetspec_tokens_per_s):.1f} | "
            f"{' / '.join(f'{r:.2f}' for r in c.ratios)} | "
            f"**{c.steady_ratio:.2f}** | {whole} | {mode} | {decided} | "
            f"{c.mode_changes} ({c.mode_changes_after_warmup}) | {gain} |"
        )
        if fixed:
            row += f" {c.best_fixed} ({c.best_fixed_ratio:.2f}) | **{c.steady_ratio / c.best_fixed_ratio:.2f}** |"
        if itself:
            own = [j / n for j, n in zip(c.jetspec_tokens_per_s, c.self_native_tokens_per_s)]
            row += (
                f" {statistics.fmean(c.self_native_tokens_per_s):.1f} | {' / '.join(f'{r:.2f}' for r in own)} | "
                f"**{statistics.median(own):.2f}** |"
            )
        lines.append(row)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
