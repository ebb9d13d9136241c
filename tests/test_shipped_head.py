"""The committed default head: intact (checksums as recorded), loadable, and fit for SmolLM2."""

import hashlib
import json

import pytest

from sglang_jetspec.core.head_config import TargetInfo
from sglang_jetspec.core.head_io import load_head
from sglang_jetspec.reference.loading import SHIPPED_HEADS

HEAD = SHIPPED_HEADS / "smollm2-135m-instruct"
SMOLLM2 = TargetInfo(hidden_size=576, vocab_size=49152, num_hidden_layers=30, rope_theta=100000.0)

pytestmark = pytest.mark.skipif(not (HEAD / "config.json").is_file(), reason="no head committed yet")


def test_files_match_the_recorded_checksums():
    record = json.loads((HEAD / "training_record.json").read_text())
    for name, digest in record["files_sha256"].items():
        assert hashlib.sha256((HEAD / name).read_bytes()).hexdigest() == digest, name
    sums = dict(line.split()[::-1] for line in (HEAD / "SHA256SUMS").read_text().splitlines())
    assert sums == record["files_sha256"]


def test_loads_for_smollm2_with_the_recorded_shape():
    record = json.loads((HEAD / "training_record.json").read_text())
    head = load_head(HEAD, SMOLLM2)
    assert head.config.causal_head is True
    assert head.config.to_json_dict()["dflash_config"] == record["head_config"]["dflash_config"]
    assert record["command"].startswith("jetspec train ")


def test_config_names_the_targets_depth_not_the_last_tap():
    config = json.loads((HEAD / "config.json").read_text())
    assert config["num_target_layers"] == SMOLLM2.num_hidden_layers
    assert max(config["dflash_config"]["target_layer_ids"]) + 1 < SMOLLM2.num_hidden_layers
