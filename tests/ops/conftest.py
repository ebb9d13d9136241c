"""Fixtures for the operations tests: the policy and a SmolLM2 reference engine with an untrained head."""

from __future__ import annotations

import pytest
from ops_support import POLICY_YAML

from policies import parse_policy_text


@pytest.fixture(scope="session")
def policy():
    return parse_policy_text(POLICY_YAML, "ops-test.yaml")


@pytest.fixture(scope="session")
def engine(smollm2, untrained_drafter):
    from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine

    return ReferenceEngine(smollm2, untrained_drafter, EngineConfig(max_batch_size=4))
