"""Shadow tests: the real reference server (SmolLM2, untrained head) tees requests into a spool."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from policies.loader import parse_policy_text
from shadow.spool import read_spool

# One cohort, speculating with an 8-node tree; every finished request is teed.
# every step speculates at budget 8 (no native blocks of the same-allocation control): the shadow checks trees
SPOOL_POLICY = """\
cohorts:
  - {name: all, min_batch: 1, max_batch: 8, budgets: [0, 8], default: 8}
gate: {reprobe_budget: 8}
shadow: {sample_rate: 1.0, alpha: 0.001}
same_allocation: {enabled: false}
"""


@pytest.fixture(scope="session")
def spool_policy():
    return parse_policy_text(SPOOL_POLICY)


def serve_and_spool(engine, policy, spool: Path, bodies: list[dict]) -> list:
    """Send `bodies` concurrently to a real JetspecServer that spools to `spool`; the spooled records."""
    import json
    import urllib.request

    from sglang_jetspec.serving.server import JetspecServer

    def post(url: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"{url}/generate",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())

    with JetspecServer(engine, policy, shadow_spool=spool, head="untrained") as server:
        with ThreadPoolExecutor(len(bodies)) as pool:
            replies = list(pool.map(lambda b: post(server.url, b), bodies))
    assert all(r["output_ids"] for r in replies)
    records, reader = read_spool(spool)
    assert reader.torn_lines == 0 and not reader.bad_lines
    return sorted(records, key=lambda r: int(r.request_id))


def prompt_bodies(tokenizer, sampling: list[dict], tokens: int = 32) -> list[dict]:
    from sglang_jetspec.reference.prompts import humaneval_prompts

    prompts = humaneval_prompts(range(len(sampling)))
    return [
        {"input_ids": tokenizer(p)["input_ids"], "sampling_params": {**s, "max_new_tokens": tokens, "ignore_eos": True}}
        for p, s in zip(prompts, sampling)
    ]


@pytest.fixture()
def engine(smollm2, untrained_drafter, single_thread):
    from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine

    return ReferenceEngine(smollm2, untrained_drafter, EngineConfig(max_batch_size=4))
