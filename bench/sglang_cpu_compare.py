"""Plain SGLang vs NGRAM vs JETSPEC, each in the real SGLang server on this CPU, swept over concurrency.

    python -m bench.sglang_cpu_compare --prompts humaneval --prompt-range 100:164 --num-prompts 8 \
        --concurrency 1,2,4,8,16 --max-new-tokens 64 --dtype float32 \
        --json bench/results/sglang_cpu/x.json --markdown bench/results/sglang_cpu/x.md

Starts, in turn, a plain, an NGRAM and JETSPEC servers (the shipped head; `jetspec` under the shipped
policy unless JETSPEC_POLICY is set, `jetspec-hybrid` / `jetspec-hybrid-adaptive` under it with every
cohort's drafter / tree sizing changed) through the CPU harness's launcher (harness/sglang_cpu.py: SGLang's
CPU engine, intel_amx attention, the test-only PyTorch stand-in for sgl-kernel's CPU ops). Each server runs one
pass per concurrency level; pass k sends the k-th consecutive slice of the prompts (max(--num-prompts,
concurrency) prompts), so no server ever sees a prompt twice and the hybrid drafter's store of
finished outputs cannot copy an answer. Every config gets the same slices, greedy. A prompt line
carrying `json_schema` / `regex` / `ebnf` (bench/prompts/json-tools.jsonl: tool-call arguments under a
JSON schema) is sent with it as SGLang's sampling parameter of that name: structured output.

Prefix caching: a config named with `+radix` (`plain+radix`, `jetspec+radix`, ...) runs its server with
SGLang's radix cache on (the others run without it), and `--shared-prefix FILE` puts the file's text
(e.g. bench/prompts/system-prompt.txt, ~300 tokens) before every prompt, as a shared system prompt;
`--baseline` names the config the ratios and exact matches compare with (default plain). A config
named with `+tp2` (after `+radix` if both) runs its server with `--tp-size 2`, one core per rank.

Before and after a change, in one run: `--checkout before=DIR` names another checkout of this repository
(a `git worktree add DIR <commit>`), and a config named `jetspec@before` runs its server from it (its
plugin, shipped policy, head and harness; SGLang and the stand-in's kernels are this venv's and that
checkout's), beside `plain` and `jetspec` from here on the same prompts: `--interleave` then pairs the
two JETSPECs seconds apart, where two runs minutes apart on a 2-core machine drift by more than the
difference asked about.

`--repeats R` runs the whole set of configs R times in turn (plain, NGRAM, JETSPEC, plain, NGRAM, ...),
each time on fresh servers and the same prompt slices: a ratio is taken between runs side by side in one
round, and the reported x plain is the median over rounds (each round's ratio is listed too); tokens/s,
exact matches and phases are over all rounds together. Single runs on a shared 2-core machine vary by
several percent, more than some of the differences a goal asks about. `--interleave` pairs the runs
closer: every config's server stays up (all run with --sleep-on-idle, so idle ones take no CPU) and at
each concurrency level the configs take turns on the same prompts, seconds apart, the order rotating
each round; since the servers live through all rounds, round k sends its own new prompts (the file must
hold R rounds' worth). A machine whose speed drifts over minutes then moves both sides of a ratio alike,
but every round reuses the same server processes, so a server that happens to run slow stays slow in
every round (bench/results/sglang_cpu/c16-chat-fallback-interleaved-bf16.md: plain's decode forward
ran 15% slower than `jetspec-off`'s same forward in all four rounds, where the fresh servers of
c16-chat-fallback-bf16.md put it 7% faster). It tells drift from per-server speed; for a ratio, rounds
on fresh servers sample both.

Reported per config and concurrency: tokens/s (and x plain), mean accept length, exact matches against
plain SGLang (and against HF transformers greedy with --hf), and where the time of a decode iteration
goes, in ms: the scheduler's own work (tests/sglang_cpu/stub/step_profile.py: building the batch, the
rest of run_batch, output processing) and inside the worker the JETSPEC phases from its own
`jetspec_*_seconds_total` counters (draft, tree building and sizing, verify forward, acceptance, KV
move/commit); for plain SGLang and NGRAM the worker's forward + sample is one column. The attention
kernels are the stand-in's PyTorch code, not sgl-kernel's: the ratios say how the plugin's step
structure fares on this CPU, not what a CPU build of sgl-kernel would give.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.client import post_ok
from harness.compare import WARMUP_TEXT, WORKER_PHASES, mean_accept_length, worker_phases, worker_seconds
from harness.sglang_cpu import HEAD, REPO, TP2_ENV, jetspec_args, launch
from harness.sglang_cpu import server_args as harness_server_args
from sglang_jetspec.cli.bench import prompt_range

# JETSPEC under the shipped policy, then with every cohort's drafter and tree sizing changed
# (jetspec-off: every cohort gated off, the fallback whose tax over plain SGLang an operator pays)
POLICY_VARIANTS = {
    "jetspec": {},
    "jetspec-hybrid": {"drafter": "hybrid"},
    "jetspec-hybrid-adaptive": {"drafter": "hybrid", "tree_sizing": "adaptive"},
    "jetspec-off": {"default": 0},
}
CONFIGS = ("plain", "ngram", *POLICY_VARIANTS)
# a variant's keys that replace a whole section of the policy rather than a field of every cohort
POLICY_SECTIONS = ("same_allocation",)
RADIX = "+radix"  # config-name suffix: that server runs with SGLang's radix (prefix) cache on
TP2 = "+tp2"  # config-name suffix: that server runs with --tp-size 2, one core per rank (TP2_ENV)
CHECKOUT = "@"  # config-name suffix (last): `jetspec@LABEL` runs from the checkout `--checkout LABEL=DIR` names
PROFILE_ENV = "JETSPEC_TEST_STEP_PROFILE"
# worker phases of a JETSPEC decode iteration (WORKER_PHASES), from the worker's own counters
PHASE_COLUMNS = ("sched_pre", "sched_run", *WORKER_PHASES, "worker_other", "output", "iteration")


class BenchArgsError(ValueError):
    pass


def positive_ints(text: str) -> list[int]:
    """Comma-separated positive integers ("1,4,16"); [] when `text` is anything else (each flag names its fix)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return []
    return values if values and min(values) >= 1 else []


def parse_concurrency(text: str) -> list[int]:
    levels = positive_ints(text)
    if not levels:
        raise BenchArgsError(f"--concurrency {text!r}: give positive integers separated by commas, e.g. 1,2,4,8,16")
    return levels


def pass_slices(available: int, num_prompts: int, levels: list[int]) -> list[slice]:
    """Consecutive, disjoint slices of the prompt list, one per concurrency level, each of
    max(num_prompts, level) prompts; BenchArgsError when the prompts run out."""
    slices, start = [], 0
    for level in levels:
        n = max(num_prompts, level)
        slices.append(slice(start, start + n))
        start += n
    if start > available:
        raise BenchArgsError(
            f"--prompts: {available} prompts, but {len(levels)} passes of "
            f"max(--num-prompts {num_prompts}, concurrency) "
            f"new prompts need {start}; use a longer prompt file or range, fewer --concurrency levels or a smaller "
            "--num-prompts"
        )
    return slices


@dataclass
class PassResult:
    concurrency: int
    prompts: int
    tokens: int
    seconds: float
    accept_length: float | None
    exact_match_vs_plain: int | None
    first_divergence_vs_plain: dict[int, int]  # prompt index in the pass -> first differing token
    exact_match_vs_hf: int | None
    phases_ms: dict[str, float]  # PHASE_COLUMNS -> ms per decode iteration
    decode_iterations: int
    mean_batch: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


@dataclass
class ConfigResult:
    config: str
    passes: list[PassResult]
    server_start_s: float
    tokens_per_s_by_concurrency: dict[str, float] = field(default_factory=dict)
    speedup_vs_plain_by_concurrency: dict[str, float] = field(default_factory=dict)
    tokens_per_s: float = 0.0  # concurrency 1 (or the first level)
    tokens_per_s_concurrent: float = 0.0  # the highest level
    speedup_by_round: dict[str, list[float]] = field(default_factory=dict)  # level -> each round's x baseline


def checkout_label(config: str) -> str | None:
    """The checkout label of a `NAME@LABEL` config (None: it runs from this checkout)."""
    return config.partition(CHECKOUT)[2] or None


def _suffixed(config: str) -> str:
    """The config without its checkout label: its policy variant and `+radix` / `+tp2` suffixes."""
    return config.partition(CHECKOUT)[0]


def base_config(config: str) -> str:
    return _suffixed(config).removesuffix(TP2).removesuffix(RADIX)


def server_args(
    config: str, model: str, dtype: str, max_running: int, ngram_tokens: int, port: int, head: Path = HEAD
) -> list[str]:
    """The harness's server arguments for `config` (JETSPEC with its worker's metrics on, for the phases)."""
    kw = dict(
        dtype=dtype,
        max_total_tokens=32768,
        max_running=max(4, max_running),
        radix_cache=_suffixed(config).removesuffix(TP2).endswith(RADIX),
        port=port,
    )
    tp = ["--tp-size", "2"] if _suffixed(config).endswith(TP2) else []
    config = base_config(config)
    if config in POLICY_VARIANTS:
        return jetspec_args(model, *tp, "--enable-metrics", head=head, **kw)
    ngram = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(ngram_tokens)]
    return harness_server_args(model, "--disable-overlap-schedule", *tp, *(ngram if config == "ngram" else []), **kw)


def policy_env(config: str, log_dir: Path, variants: dict | None = None) -> dict[str, str]:
    """JETSPEC_POLICY for a policy variant (of `variants`, default POLICY_VARIANTS): the shipped policy with
    every cohort's fields overridden, and whole sections (POLICY_SECTIONS) replaced."""
    changes = (POLICY_VARIANTS if variants is None else variants).get(base_config(config))
    if not changes:
        return {}
    import yaml

    from sglang_jetspec.adapter.policy import policy_path

    data = yaml.safe_load(policy_path().read_text())
    sections = {key: value for key, value in changes.items() if key in POLICY_SECTIONS}
    data.update(sections)
    for cohort in data["cohorts"]:
        cohort.update({key: value for key, value in changes.items() if key not in sections})
    path = log_dir / f"{config}-policy.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return {"JETSPEC_POLICY": str(path)}


def hf_greedy(model: str, prompts: list[list[int]], max_new_tokens: int, dtype: str) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    eos = AutoTokenizer.from_pretrained(model).eos_token_id
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            y = lm.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=eos
            )[0, len(ids) :].tolist()
            out.append(y[: y.index(eos) + 1] if eos in y else y)  # SGLang's output_ids end with the EOS too
    return out


# ---- where a decode iteration's time goes ----


def read_profile(path: Path) -> dict[str, float]:
    """The scheduler-side sums for decode iterations (step_profile.py), zeros before the first."""
    try:
        return json.loads(path.read_text()).get("decode", {})
    except (OSError, ValueError):
        return {}


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def phase_ms(sched: dict[str, float], worker: dict[str, float]) -> dict[str, float]:
    """ms per decode iteration by phase. `sched`: step_profile sums over the pass's decode iterations;
    `worker`: the JETSPEC counters over the same pass (empty for plain / NGRAM, whose worker time is
    one column, `verify`). accept excludes commit (the counter includes it)."""
    n = sched.get("iterations", 0)
    if not n:
        return {}
    per = lambda seconds: 1000.0 * seconds / n  # noqa: E731
    row = {
        "sched_pre": per(sched["pre_s"]),
        "sched_run": per(sched["run_s"] - sched["worker_s"]),
        "output": per(sched["post_s"]),
        "iteration": per(sched["pre_s"] + sched["run_s"] + sched["post_s"]),
    }
    if worker:
        phases = worker_phases(worker)
        row.update({p: per(s) for p, s in phases.items()})
        row["worker_other"] = per(sched["worker_s"] - sum(phases.values()))
    else:
        row.update({p: 0.0 for p in WORKER_PHASES})
        row["verify"], row["worker_other"] = per(sched["worker_s"]), 0.0
    return row


# ---- running one server ----

Prompt = tuple[list[int], dict]  # token ids and the constraint's sampling parameters ({} for free text)


def generate(url: str, prompt: Prompt, max_new_tokens: int) -> dict:
    ids, constraint = prompt
    return post_ok(
        f"{url}/generate",
        {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, **constraint}},
    )


def quiet(profile: Path, timeout_s: float = 10.0) -> dict[str, float]:
    """The profile once the scheduler has gone idle and flushed it (its sums stop changing)."""
    last, deadline = read_profile(profile), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = read_profile(profile)
        if now == last:
            return now
        last = now
    return last


@dataclass
class Running:
    """One config's server, up, warmed, with its step-profile file."""

    config: str
    server: object  # harness.sglang_cpu.LaunchedServer
    profile: Path


def parse_checkouts(specs: list[str]) -> dict[str, Path]:
    """`--checkout LABEL=DIR` values: label -> the checkout's root (one holding this repository's plugin)."""
    checkouts = {}
    for spec in specs:
        label, _, where = spec.partition("=")
        if not label.isidentifier() or not where:
            raise BenchArgsError(f"--checkout {spec!r}: give LABEL=DIR, e.g. before=/tmp/before")
        root = Path(where).resolve()
        if not (root / "sglang_jetspec" / "sglang_plugin.py").is_file() or not (root / "harness").is_dir():
            raise BenchArgsError(
                f"--checkout {spec}: {root} is not a checkout of this repository "
                "(make one with `git worktree add DIR <commit>`)"
            )
        checkouts[label] = root
    return checkouts


def checkout_launch(root: Path | None) -> tuple[dict[str, str], Path | None, Path]:
    """What a server from checkout `root` (None: this one) launches with: the environment it adds, its
    working directory (first on every one of its processes' paths, so its modules win over this install's)
    and its head."""
    if root is None:
        return {}, None, HEAD
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path}, root, root / HEAD.relative_to(REPO)


def checkout_commit(root: Path) -> str:
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def start_server(config: str, args, model: str, levels: list[int], warmup_ids: list[int], port: int) -> Running:
    profile = (args.log_dir / f"{config}-profile.json").resolve()
    profile.unlink(missing_ok=True)
    label = checkout_label(config)
    where_env, cwd, head = checkout_launch(args.checkouts[label] if label else None)
    env = {
        "OMP_NUM_THREADS": str(args.threads),
        PROFILE_ENV: str(profile),
        **policy_env(config, args.log_dir),
        **(TP2_ENV if _suffixed(config).endswith(TP2) else {}),
        **where_env,
    }
    server = launch(
        server_args(config, model, args.dtype, max(levels), args.ngram_draft_tokens, port, head=head),
        args.log_dir / f"{config}.log",
        env,
        cwd=cwd,
    )
    try:
        generate(server.url, (warmup_ids, {}), 8)  # first-call allocations stay out of the timings
    except BaseException:
        server.stop()
        raise
    return Running(config, server, profile)


RawPass = tuple  # (replies, seconds, scheduler sums, worker seconds) of one pass


def run_pass(running: Running, prompts: list[Prompt], level: int, max_new_tokens: int) -> RawPass:
    """`prompts` sent `level` at a time to one server; its replies, seconds and phase sums."""
    url = running.server.url
    sched0, worker0 = quiet(running.profile), worker_seconds(url)
    start = time.perf_counter()
    with ThreadPoolExecutor(level) as pool:
        replies = list(pool.map(lambda prompt: generate(url, prompt, max_new_tokens), prompts))
    seconds = time.perf_counter() - start
    return replies, seconds, diff(quiet(running.profile), sched0), diff(worker_seconds(url), worker0)


def config_result(config: str, levels: list[int], raw: list[RawPass], start_s: float):
    """One config's passes (one per level) as a ConfigResult, and each pass's output token ids."""
    passes, outputs = [], []
    for level, (replies, seconds, sched, worker) in zip(levels, raw):
        outputs.append([list(r["output_ids"]) for r in replies])
        n = sched.get("iterations", 0)
        passes.append(
            PassResult(
                concurrency=level,
                prompts=len(replies),
                tokens=sum(r["meta_info"]["completion_tokens"] for r in replies),
                seconds=seconds,
                accept_length=mean_accept_length(replies),
                exact_match_vs_plain=None,
                first_divergence_vs_plain={},
                exact_match_vs_hf=None,
                phases_ms=phase_ms(sched, worker),
                decode_iterations=int(n),
                mean_batch=sched.get("requests", 0) / n if n else 0.0,
            )
        )
    return ConfigResult(config, passes, start_s), outputs


def sequential_rounds(configs, repeats, levels, slices, start, run):
    """Every round starts each config's server in turn, runs all its passes on `slices`, stops it.
    `start(config)` -> Running; `run(running, slice, level)` -> RawPass. Per round: {config: raws}, start s."""
    rounds = []
    for _ in range(repeats):
        raws, starts = {}, {}
        for config in configs:
            running = start(config)
            try:
                raws[config] = [run(running, part, level) for level, part in zip(levels, slices)]
            finally:
                running.server.stop()
            starts[config] = running.server.start_s
        rounds.append((raws, starts))
    return rounds


def interleaved_rounds(configs, repeats, levels, round_slices, start, run):
    """Every config's server up at once (idle ones sleep: --sleep-on-idle); at each level of each round the
    configs run the same fresh prompts one after another, the order rotating by one per round, so each
    ratio pairs passes seconds apart. Round k sends `round_slices[k]`."""
    running = []
    try:
        for config in configs:
            running.append(start(config))
        rounds = []
        for k in range(repeats):
            raws = {config: [] for config in configs}
            order = running[k % len(running) :] + running[: k % len(running)]
            for level, part in zip(levels, round_slices[k]):
                for r in order:
                    raws[r.config].append(run(r, part, level))
            rounds.append((raws, {r.config: r.server.start_s for r in running}))
        return rounds
    finally:
        for r in running:
            r.server.stop()


def compare_outputs(result: ConfigResult, outputs, reference, attr: str, divergences: bool) -> None:
    from sglang_jetspec.reference.divergence import first_difference  # loads torch: not for --help

    for p, got, ref in zip(result.passes, outputs, reference):
        at = {i: first_difference(r, g) for i, (r, g) in enumerate(zip(ref, got))}
        setattr(p, attr, sum(v is None for v in at.values()))
        if divergences:
            p.first_divergence_vs_plain = {i: v for i, v in at.items() if v is not None}


def set_rates(r: ConfigResult) -> None:
    """r's tokens/s by concurrency, at concurrency 1 (or the first level) and at the highest level."""
    r.tokens_per_s_by_concurrency = {str(p.concurrency): p.tokens_per_s for p in r.passes}
    r.tokens_per_s = next((p for p in r.passes if p.concurrency == 1), r.passes[0]).tokens_per_s
    r.tokens_per_s_concurrent = max(r.passes, key=lambda p: p.concurrency).tokens_per_s


def summarise(results: list[ConfigResult], baseline: str) -> None:
    plain = next((r for r in results if r.config == baseline), None)
    for r in results:
        set_rates(r)
        if plain is not None:
            base = {p.concurrency: p.tokens_per_s for p in plain.passes}
            r.speedup_vs_plain_by_concurrency = {
                str(p.concurrency): p.tokens_per_s / base[p.concurrency] for p in r.passes
            }


def combine_rounds(rounds: list[ConfigResult]) -> ConfigResult:
    """One config's rounds (each already summarised against its own round's baseline) as one result: its
    passes hold every round's prompts (round k's prompt i is prompt k * n + i of the pass), tokens and
    seconds; accept length, phases and mean batch are weighted by prompts or decode iterations; x
    baseline is the median of the rounds' ratios, each listed in `speedup_by_round`."""
    first = rounds[0]
    passes = []
    for level_passes in zip(*(r.passes for r in rounds)):
        iters = sum(q.decode_iterations for q in level_passes)
        prompts = sum(q.prompts for q in level_passes)
        accepts = [(q.accept_length, q.prompts) for q in level_passes if q.accept_length is not None]
        exact = [q.exact_match_vs_plain for q in level_passes]
        hf = [q.exact_match_vs_hf for q in level_passes]
        offset, divergence = 0, {}
        for q in level_passes:
            divergence.update({offset + i: at for i, at in q.first_divergence_vs_plain.items()})
            offset += q.prompts
        columns = [c for c in PHASE_COLUMNS if any(c in q.phases_ms for q in level_passes)] if iters else []
        passes.append(
            PassResult(
                concurrency=level_passes[0].concurrency,
                prompts=prompts,
                tokens=sum(q.tokens for q in level_passes),
                seconds=sum(q.seconds for q in level_passes),
                accept_length=sum(a * n for a, n in accepts) / sum(n for _, n in accepts) if accepts else None,
                exact_match_vs_plain=None if None in exact else sum(exact),
                first_divergence_vs_plain=divergence,
                exact_match_vs_hf=None if None in hf else sum(hf),
                phases_ms={
                    c: sum(q.phases_ms.get(c, 0.0) * q.decode_iterations for q in level_passes) / iters for c in columns
                },
                decode_iterations=iters,
                mean_batch=sum(q.mean_batch * q.decode_iterations for q in level_passes) / iters if iters else 0.0,
            )
        )
    by_round = {
        c: [r.speedup_vs_plain_by_concurrency[c] for r in rounds] for c in first.speedup_vs_plain_by_concurrency
    }
    combined = ConfigResult(first.config, passes, statistics.median(r.server_start_s for r in rounds))
    set_rates(combined)
    combined.speedup_vs_plain_by_concurrency = {c: statistics.median(x) for c, x in by_round.items()}
    combined.speedup_by_round = by_round if len(rounds) > 1 else {}
    return combined


def checkouts_sentence(checkouts: dict[str, dict]) -> str:
    """What the `NAME@LABEL` configs ran, for the markdown's setup paragraph ('' without checkouts)."""
    named = "; ".join(f"`{CHECKOUT}{label}` from {c['dir']} at commit {c['commit']}" for label, c in checkouts.items())
    return f" Configs named NAME{CHECKOUT}LABEL ran from another checkout: {named}." if named else ""


def markdown(results: list[ConfigResult], meta: dict) -> str:
    levels = [p.concurrency for p in results[0].passes]
    baseline = meta["baseline"]
    lines = [
        f"# Real SGLang on CPU: plain vs NGRAM vs JETSPEC ({meta['cpu']}, {meta['dtype']})",
        "",
        f"`{meta['command']}`",
        "",
        f"{meta['source']} {meta['prompt_range']}: {meta['prompts_per_pass']} new prompts per pass "
        f"({meta.get('constrained_prompts', 0)} of them under a json_schema / regex / ebnf constraint), greedy, "
        f"max_new_tokens {meta['max_new_tokens']}, SGLang {meta['sglang']}, torch {meta['torch']}, "
        f"{meta['threads']} threads, {meta['date']}. Attention and KV kernels are the test stand-in's PyTorch "
        "code (tests/sglang_cpu/stub), not sgl-kernel's."
        + (
            f" Every prompt starts with the {meta['shared_prefix_tokens']}-token shared prefix "
            f"{meta['shared_prefix']}; "
            f"`{RADIX}` configs run with SGLang's radix cache on, the others without."
            if meta["shared_prefix"]
            else ""
        )
        + checkouts_sentence(meta.get("checkouts", {})),
        "",
        f"## Tokens/s by concurrency (x {baseline})",
        "",
        *(
            [
                f"{meta['repeats']} rounds: tokens/s over all rounds; x {baseline} the median of the rounds' "
                "side-by-side ratios (each round below).",
                "",
            ]
            if meta.get("repeats", 1) > 1
            else []
        ),
        *(
            [
                "Interleaved: every config's server up at once (idle ones asleep), the configs taking turns pass "
                "by pass on the same prompts (the order rotating each round), each round on new prompts "
                f"({', '.join(' '.join(parts) for parts in meta['prompt_slices_by_round'])}).",
                "",
            ]
            if meta.get("interleave")
            else []
        ),
        "| config | " + " | ".join(f"c={c}" for c in levels) + f" | accept length by c | exact vs {baseline} by c |",
        "|---|" + "---|" * (len(levels) + 2),
    ]
    for r in results:
        cells = [
            f"{p.tokens_per_s:.1f} ({r.speedup_vs_plain_by_concurrency.get(str(p.concurrency), 0):.2f}x)"
            for p in r.passes
        ]
        accept = " / ".join("-" if p.accept_length is None else f"{p.accept_length:.2f}" for p in r.passes)
        exact = " / ".join(
            "-" if p.exact_match_vs_plain is None else f"{p.exact_match_vs_plain}/{p.prompts}" for p in r.passes
        )
        lines.append(f"| {r.config} | " + " | ".join(cells) + f" | {accept} | {exact} |")
    if any(r.speedup_by_round for r in results):
        lines += [
            "",
            f"## x {baseline} in each round",
            "",
            "| config | " + " | ".join(f"c={c}" for c in levels) + " |",
            "|---|" + "---|" * len(levels),
        ]
        for r in results:
            rounds = [" / ".join(f"{x:.2f}" for x in r.speedup_by_round[str(c)]) for c in levels]
            lines.append(f"| {r.config} | " + " | ".join(rounds) + " |")
    lines += [
        "",
        "## Where a decode iteration's time goes (ms per iteration, mean batch)",
        "",
        "sched_pre: receiving requests and building the batch (incl. KV allocation); sched_run: the rest of "
        "run_batch outside the worker; draft / tree (building, sizing, verify tensors) / verify (the target "
        "forward; for plain and NGRAM the worker's whole forward + sample) / accept / commit (KV move, "
        "draft-context rows): the JETSPEC worker's own counters; worker_other: the worker's remaining time; "
        "output: process_batch_result.",
        "",
        "| config | c | batch | " + " | ".join(PHASE_COLUMNS) + " |",
        "|---|---|---|" + "---|" * len(PHASE_COLUMNS),
    ]
    for r in results:
        for p in r.passes:
            if p.phases_ms:
                lines.append(
                    f"| {r.config} | {p.concurrency} | {p.mean_batch:.1f} | "
                    + " | ".join(f"{p.phases_ms[c]:.1f}" for c in PHASE_COLUMNS)
                    + " |"
                )
    diverged = [
        (r.config, p.concurrency, i, at)
        for r in results
        for p in r.passes
        for i, at in p.first_divergence_vs_plain.items()
    ]
    if diverged:
        lines += [
            "",
            f"First divergence from {baseline} (config, concurrency, prompt in pass, token position): "
            + ", ".join(f"{c} c={lvl} #{i} @{at}" for c, lvl, i, at in diverged),
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", default="humaneval", help="humaneval, or a JSONL file of `prompt` / `messages` lines")
    p.add_argument(
        "--prompt-range",
        type=prompt_range,
        default=slice(None),
        help="start:stop of the prompts to draw passes from (default: all)",
    )
    p.add_argument("--num-prompts", type=int, default=8, help="new prompts per pass (at least the pass's concurrency)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,4", help="comma-separated levels, one pass each, e.g. 1,2,4,8,16")
    p.add_argument("--model", help="target checkpoint directory (default: jetspec model fetch smollm2)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"subset of {','.join(CONFIGS)}, in this order; a name ending in {RADIX} runs with the radix cache on",
    )
    p.add_argument(
        "--baseline", default="plain", help="the config ratios and exact matches compare with (one of --configs)"
    )
    p.add_argument("--shared-prefix", type=Path, help="a text file put before every prompt (a shared system prompt)")
    p.add_argument(
        "--repeats", type=int, default=1, help="rounds of every config in turn; x plain is the median round's ratio"
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="keep every config's server up and alternate them pass by pass (each round on new prompts)",
    )
    p.add_argument("--ngram-draft-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="OMP threads of each server")
    p.add_argument("--hf", action="store_true", help="also compare with HF transformers greedy (slow)")
    p.add_argument(
        "--checkout",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help=f"another checkout of this repository; a config named NAME{CHECKOUT}LABEL runs its server from it",
    )
    p.add_argument("--port", type=int, default=31123)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--markdown", type=Path, required=True)
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/sglang-cpu-logs"))
    args = p.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = sorted({c for c in configs if base_config(c) not in CONFIGS})
    if unknown:
        p.error(
            f"--configs: unknown {unknown}; choose from {','.join(CONFIGS)}, "
            f"each optionally with {RADIX}, then {TP2}, then {CHECKOUT}LABEL"
        )
    try:
        args.checkouts = parse_checkouts(args.checkout)
    except BenchArgsError as exc:
        p.error(str(exc))
    for config in configs:
        label = checkout_label(config)
        if label is None:
            continue
        if label not in args.checkouts:
            p.error(f"--configs {config}: no --checkout {label}=DIR names the checkout it runs from")
        if base_config(config) not in POLICY_VARIANTS:
            p.error(f"--configs {config}: only JETSPEC configs run from another checkout")
        if POLICY_VARIANTS[base_config(config)]:
            p.error(
                f"--configs {config}: a variant's policy is built from this checkout's shipped policy; "
                f"run `jetspec{CHECKOUT}{label}` (that checkout's own shipped policy)"
            )
    if args.baseline not in configs:
        p.error(f"--baseline {args.baseline}: not among --configs {args.configs}; add it or pick one of them")
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: give at least 1 (rounds of every config, each on fresh servers)")
    if args.shared_prefix is not None and not args.shared_prefix.is_file():
        p.error(
            f"--shared-prefix {args.shared_prefix}: no such file; "
            "pass a text file (e.g. bench/prompts/system-prompt.txt)"
        )
    try:
        levels = parse_concurrency(args.concurrency)
    except BenchArgsError as exc:
        p.error(str(exc))

    import sglang
    import torch
    from transformers import AutoTokenizer

    from sglang_jetspec.models.fetch import fetch
    from sglang_jetspec.reference.precision import cpu_model
    from sglang_jetspec.reference.prompts import constraint_params, encode, load_prompt_records

    model = args.model or str(fetch("smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    records = load_prompt_records(args.prompts)[args.prompt_range]
    shared = (
        tokenizer(args.shared_prefix.read_text(), add_special_tokens=False)["input_ids"] if args.shared_prefix else []
    )
    prompts = [(shared + encode(r, tokenizer), constraint_params(r)) for r in records]
    constrained = sum(1 for _, constraint in prompts if constraint)
    if args.hf and constrained:
        p.error(
            f"--hf: {constrained} prompts carry a constraint, which HF greedy decoding would ignore; compare "
            "them with plain SGLang (the default) instead"
        )
    try:
        # interleaved rounds run on servers that stay up, so each round needs prompts of its own
        all_slices = pass_slices(len(prompts), args.num_prompts, levels * (args.repeats if args.interleave else 1))
    except BenchArgsError as exc:
        why = f" (--interleave: each of the {args.repeats} rounds sends new prompts)" if args.interleave else ""
        p.error(f"{exc}{why}")
    round_slices = [all_slices[k * len(levels) : (k + 1) * len(levels)] for k in range(len(all_slices) // len(levels))]
    slices = round_slices[0]
    warmup_ids = tokenizer(WARMUP_TEXT)["input_ids"]
    torch.set_num_threads(args.threads)

    hf_by_slice = (
        {
            (part.start, part.stop): hf_greedy(
                model, [ids for ids, _ in prompts[part]], args.max_new_tokens, args.dtype
            )
            for parts in round_slices
            for part in parts
        }
        if args.hf
        else {}
    )
    ports = {config: args.port + i for i, config in enumerate(configs)}
    start = lambda config: start_server(config, args, model, levels, warmup_ids, ports[config])  # noqa: E731

    def run(running: Running, part: slice, level: int) -> RawPass:
        raw = run_pass(running, prompts[part], level, args.max_new_tokens)
        replies, seconds = raw[0], raw[1]
        tokens = sum(r["meta_info"]["completion_tokens"] for r in replies)
        print(
            f"[{running.config}] prompts {part.start}:{part.stop} c={level}: {tokens / seconds:.1f} tok/s "
            f"accept {mean_accept_length(replies)}",
            flush=True,
        )
        return raw

    if args.interleave:
        raw_rounds = interleaved_rounds(configs, args.repeats, levels, round_slices, start, run)
    else:
        raw_rounds = sequential_rounds(configs, args.repeats, levels, slices, start, run)
    rounds = []  # per round, every config's result
    for k, (raws, starts) in enumerate(raw_rounds):
        parts = round_slices[k] if args.interleave else slices
        hf = [hf_by_slice[(part.start, part.stop)] for part in parts] if args.hf else None
        results, outputs = [], {}
        for config in configs:
            result, outputs[config] = config_result(config, levels, raws[config], starts[config])
            results.append(result)
        for r in results:
            compare_outputs(r, outputs[r.config], outputs[args.baseline], "exact_match_vs_plain", divergences=True)
            if hf is not None:
                compare_outputs(r, outputs[r.config], hf, "exact_match_vs_hf", divergences=False)
        summarise(results, args.baseline)
        rounds.append(results)
    results = [combine_rounds(list(config_rounds)) for config_rounds in zip(*rounds)]
    meta = {
        "command": "python -m bench.sglang_cpu_compare " + " ".join(sys.argv[1:] if argv is None else argv),
        "cpu": cpu_model(),
        "dtype": args.dtype,
        "source": args.prompts,
        "baseline": args.baseline,
        "shared_prefix": str(args.shared_prefix or ""),
        "shared_prefix_tokens": len(shared),
        "prompt_range": f"{args.prompt_range.start or 0}:"
        f"{'' if args.prompt_range.stop is None else args.prompt_range.stop}",
        "prompts_per_pass": [s.stop - s.start for s in slices],
        "prompt_slices_by_round": [[f"{s.start}:{s.stop}" for s in parts] for parts in round_slices],
        "constrained_prompts": constrained,
        "concurrency": levels,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "interleave": args.interleave,
        "threads": args.threads,
        "checkouts": {
            label: {"dir": str(root), "commit": checkout_commit(root)} for label, root in args.checkouts.items()
        },
        "sglang": sglang.__version__,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "meta": meta,
                "results": [
                    {**asdict(r), "passes": [{**asdict(q), "tokens_per_s": q.tokens_per_s} for q in r.passes]}
                    for r in results
                ],
            },
            indent=2,
        )
        + "\n"
    )
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(markdown(results, meta))
    print(args.markdown.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
