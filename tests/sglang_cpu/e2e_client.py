"""Helpers of the end-to-end tests against real SGLang servers: the policy they run, requests, and what
the tests read back. The server arguments and the HTTP client are the harness's (harness/sglang_cpu.py,
harness/client.py), shared with the bench scripts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.client import get, metrics, post
from harness.sglang_cpu import HEAD, REPO, jetspec_args, server_args  # noqa: F401  (the tests import them here)

ADMIN_KEY = "cpu-e2e-admin-key"
NUM_PROMPTS = 8
MAX_NEW = 32
# Small trees keep verify cheap on two cores while every step still verifies a real tree (budget 16
# at batch 1 and 2-4; no native blocks of the same-allocation control, which fixed 16-node trees would
# earn on this harness: test_real_sglang_same_allocation.py tests the control); shadow re-checks every
# finished request.
POLICY_YAML = """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16], default: 16}
  - {name: bs2-4, min_batch: 2, max_batch: 4, budgets: [0, 4, 16], default: 16}
gate: {min_gain: 1.03, hysteresis: 0.03, confidence_z: 1.0, dwell_s: 8, probe_share: 0.2,
       reprobe_budget: 4, reprobe_backoff_max_s: 60}
controller: {interval_s: 2, ttl_s: 8, window_s: 300, min_samples: 2}
shadow: {sample_rate: 1.0, alpha: 0.01, gate_on_alarm: false}
head: {max_budget: 16, max_draft_rounds: 0}
same_allocation: {enabled: false}
"""


def generate(url: str, input_ids: list[int], max_new_tokens: int = MAX_NEW, **sampling) -> dict:
    status, reply = post(
        f"{url}/generate",
        {"input_ids": input_ids, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, **sampling}},
    )
    assert status == 200, reply
    return reply


def generate_all(
    url: str, prompts: list[list[int]], concurrency: int = 1, max_new: list[int] | None = None, **sampling
) -> list[dict]:
    """Replies in prompt order; with concurrency > 1, requests join and leave a running batch."""
    lengths = max_new or [MAX_NEW] * len(prompts)
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda a: generate(url, a[0], a[1], **sampling), zip(prompts, lengths)))


def generate_batch(url: str, items: list[tuple[str, list[int], dict]]) -> list[dict]:
    """One /generate call for (name, prompt ids, sampling params) items: a batch with per-item params."""
    status, replies = post(
        f"{url}/generate",
        {"input_ids": [ids for _, ids, _ in items], "sampling_params": [params for _, _, params in items]},
    )
    assert status == 200, replies
    return replies


def output_ids_four_at_a_time(url: str, bodies: list[dict]) -> list[list[int]]:
    """Output ids of `bodies` (whole /generate bodies) sent 4 at a time; asserts every request answered."""
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda body: post(f"{url}/generate", body), bodies))
    assert all(status == 200 for status, _ in replies), replies
    return [reply["output_ids"] for _, reply in replies]


def retracted_under(retracting, bodies: list[dict]) -> list[list[int]]:
    """Output ids of `bodies` sent 4 at a time to `retracting` (a server whose pool is too small for them);
    asserts that it logged a new retraction meanwhile."""

    def count() -> int:
        return retracting.log.read_text().lower().count("retract")  # the logged server arguments name it too

    before = count()
    outputs = output_ids_four_at_a_time(retracting.url, bodies)
    assert count() > before, "the pool was large enough: nothing was retracted"
    return outputs


def until_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


def outputs_until_eos(replies: list[dict], eos: int) -> list[list[int]]:
    """Each /generate reply's output ids up to its first EOS."""
    return [until_eos(r["output_ids"], eos) for r in replies]


def server_info(url: str) -> dict:
    return json.loads(get(f"{url}/server_info"))


def samples(url: str, name: str) -> dict[tuple, float]:
    """{label items: value} of one metric family's samples named `name` on the server's /metrics."""
    return metrics(url).get(name, {})


def steps_at(url: str, cohort: str, budget: int) -> float:
    """Verify steps `cohort` ran at `budget`, from the server's /metrics."""
    return sum(
        v
        for labels, v in samples(url, "jetspec_steps_total").items()
        if dict(labels).get("cohort") == cohort and dict(labels).get("budget") == str(budget)
    )


def jetspec_state(url: str) -> dict:
    """The JETSPEC scheduler's internal state as /server_info serves it."""
    (state,) = [s for s in server_info(url)["internal_states"] if "jetspec_policy" in s]
    return state


DECISION_TIMEOUT_S = 240


def bs1_control(url: str) -> dict:
    """The same-allocation control's state of the bs1 cohort."""
    return jetspec_state(url)["jetspec_same_allocation"]["bs1"]


def load_until_decided(url: str, prompts: list[list[int]]) -> tuple[dict, float]:
    """One request at a time (the bs1 cohort) until bs1's decision is made; (its state, seconds of load)."""
    started = time.monotonic()
    i = 0
    while not bs1_control(url)["decided"]:
        assert time.monotonic() - started < DECISION_TIMEOUT_S, (
            f"no decision after {DECISION_TIMEOUT_S} s: {bs1_control(url)}"
        )
        generate(url, prompts[i % len(prompts)], max_new_tokens=128)
        i += 1
    return bs1_control(url), time.monotonic() - started


def live_draft_states(url: str) -> int:
    return jetspec_state(url)["jetspec_live_draft_states"]


def wait_for_no_draft_state(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (n := live_draft_states(url)) != 0:
        assert time.monotonic() < deadline, f"{n} per-request draft states left behind"
        time.sleep(0.5)


# ---- the shadow spool the jetspec server writes, and the checker run over (a copy of) it ----


def wait_for_spooled(spool: Path, request_ids: set[str], timeout_s: float = 30) -> None:
    """Until the tee has written every one of `request_ids` (it writes from its own thread)."""
    deadline = time.monotonic() + timeout_s
    while True:
        written = {json.loads(line)["request_id"] for p in spool.glob("*.jsonl") for line in p.read_text().splitlines()}
        if request_ids <= written:
            return
        assert time.monotonic() < deadline, f"the shadow tee did not spool {sorted(request_ids - written)}"
        time.sleep(0.5)


def copy_spool(spool: Path, out: Path, keep, change=lambda record: record) -> Path:
    """The spool's records for which `keep(record)` holds, each passed through `change`, in a new spool directory."""
    out.mkdir()
    for path in spool.glob("*.jsonl"):
        kept = [change(record) for record in map(json.loads, path.read_text().splitlines()) if keep(record)]
        (out / path.name).write_text("".join(json.dumps(record) + "\n" for record in kept))
    return out


def shadow_run(spool: Path, reference: str, out: Path, smollm2_dir: Path) -> tuple[int, list[dict], str]:
    """`jetspec shadow run` over `spool` at alpha 0.001 (one window): exit status, window reports, output."""
    # a URL reference is a plain server: the checker needs the vocabulary size it cannot ask it for
    vocab = json.loads((smollm2_dir / "config.json").read_text())["vocab_size"]
    url_args = ["--vocab-size", str(vocab)] if reference.startswith("http") else []
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_jetspec.cli",
            "shadow",
            "run",
            "--spool",
            str(spool),
            "--reference",
            reference,
            "--target",
            str(smollm2_dir),
            "--out",
            str(out),
            "--window",
            "500",
            "--alpha",
            "0.001",
            *url_args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("window-*.json"))]
    return run.returncode, reports, run.stdout + run.stderr
