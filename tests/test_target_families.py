"""Any local Llama- or Qwen3-family checkpoint works as a target; other families are refused clearly."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request
from sglang_jetspec.reference.loading import load_drafter
from sglang_jetspec.reference.target import TargetError, TargetModel
from tests.builders import TINY_TARGET_MODEL, save_tiny_target


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny_target_dir(request, tmp_path_factory, smollm2_dir):
    torch.manual_seed(0)
    if request.param == "llama":
        model = LlamaForCausalLM(LlamaConfig(**TINY_TARGET_MODEL))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **TINY_TARGET_MODEL))
    return save_tiny_target(model, tmp_path_factory.mktemp(request.param), smollm2_dir)


def test_tiny_checkpoint_of_each_family_decodes_losslessly(tiny_target_dir):
    target = TargetModel(tiny_target_dir)
    drafter, _ = load_drafter(target, "untrained")
    engine = ReferenceEngine(target, drafter, EngineConfig(tree_width=4, max_batch_size=2, check_invariants=True))
    requests = [
        Request(list(range(5 + i, 25 + 3 * i)), SamplingParams(max_new_tokens=24, ignore_eos=True)) for i in range(3)
    ]
    plain = engine.generate(requests, budget=0)
    speculative = engine.generate(requests, budget=16)
    assert [o.output_ids for o in speculative] == [o.output_ids for o in plain]


def test_unsupported_family_is_refused_naming_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(TargetError, match="model_type='gpt2'"):
        TargetModel(tmp_path)


def test_directory_without_config_says_how_to_get_a_target(tmp_path):
    with pytest.raises(TargetError, match="jetspec model fetch smollm2"):
        TargetModel(tmp_path)
