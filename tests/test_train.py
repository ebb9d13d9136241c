"""Training: the exact block-causal mask, the loss against a hand-computed KL, and a short real run."""

import json
import math

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from sglang_jetspec.cli import main
from sglang_jetspec.core.head_io import load_head, read_head_config
from sglang_jetspec.reference.target import TargetModel
from sglang_jetspec.train.objective import block_inputs, distillation_loss, target_rows, training_mask


def brute_force_mask(anchors, block_size, context_len, causal):
    n = len(anchors) * block_size
    mask = torch.zeros(n, context_len + n, dtype=torch.bool)
    for qb, a in enumerate(anchors):
        for qi in range(block_size):
            q = qb * block_size + qi
            for k in range(context_len):
                mask[q, k] = k < a  # the committed tokens before the block's root
            for kb in range(len(anchors)):
                for ki in range(block_size):
                    mask[q, context_len + kb * block_size + ki] = kb == qb and (ki <= qi or not causal)
    return mask


@pytest.mark.parametrize("causal", [True, False])
def test_training_mask_is_exactly_block_causal(causal):
    anchors = [3, 7, 8, 15]
    mask = training_mask(torch.tensor(anchors), 4, 20, causal)
    assert mask.shape == (1, 1, 16, 36)
    assert torch.equal(mask[0, 0], brute_force_mask(anchors, 4, 20, causal))


def test_block_inputs_and_target_rows():
    ids = torch.arange(100, 120)
    block_ids, positions = block_inputs(ids, torch.tensor([2, 17]), 4, mask_token_id=9)
    assert block_ids.tolist() == [102, 9, 9, 9, 117, 9, 9, 9]
    assert positions.tolist() == [2, 3, 4, 5, 17, 18, 19, 20]
    query, teacher, depths = target_rows(torch.tensor([2, 17]), 4, 20)
    # block at 17 only has token 18 and 19 left to predict (depths 1, 2)
    assert query.tolist() == [1, 2, 3, 5, 6]
    assert teacher.tolist() == [2, 3, 4, 17, 18]
    assert depths.tolist() == [1, 2, 3, 1, 2]


def test_forward_kl_equals_hand_computation():
    teacher = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.25)], [0.0, 0.0, 0.0]])
    draft = torch.tensor([[math.log(0.25), math.log(0.5), math.log(0.25)], [0.0, 0.0, 0.0]])
    weights = torch.tensor([1.0, 1.0])
    row0 = 0.5 * math.log(0.5 / 0.25) + 0.25 * math.log(0.25 / 0.5) + 0.25 * math.log(1.0)
    got = distillation_loss(draft, teacher, torch.tensor([0, 0]), weights, "forward_kl")
    assert math.isclose(got.item(), row0 / 2, rel_tol=1e-5)  # second row: identical distributions, KL 0
    # temperature: T^2 * KL(softmax(t/T) || softmax(d/T))
    t_p = torch.softmax(teacher[0] / 2, -1)
    d_p = torch.softmax(draft[0] / 2, -1)
    expected = 4 * float((t_p * (t_p / d_p).log()).sum()) / 2
    assert math.isclose(distillation_loss(draft, teacher, torch.tensor([0, 0]), weights, "forward_kl", 2.0).item(), expected, rel_tol=1e-5)
    reverse = 0.25 * math.log(0.25 / 0.5) + 0.5 * math.log(0.5 / 0.25)
    assert math.isclose(distillation_loss(draft, teacher, torch.tensor([0, 0]), weights, "reverse_kl").item(), reverse / 2, rel_tol=1e-5)
    sft = distillation_loss(draft, teacher, torch.tensor([1, 2]), weights, "sft").item()
    assert math.isclose(sft, (-math.log(0.5) + math.log(3)) / 2, rel_tol=1e-5)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, smollm2_dir):
    torch.manual_seed(0)
    # a large init makes the tiny target's next-token distributions peaked, so there is something to learn
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, vocab_size=49152, max_position_embeddings=512, initializer_range=0.5))
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(smollm2_dir)).save_pretrained(str(out))
    return out


@pytest.mark.parametrize("bidirectional", [False, True])
def test_short_training_run_lowers_loss_and_yields_a_loadable_head(tmp_path, tiny_target, bidirectional):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"def function_{i}(x):\n    return"}) for i in range(8)) + "\n")
    out = tmp_path / "head"
    args = ["train", "--target", str(tiny_target), "--out", str(out), "--prompts", str(prompts), "--data-dir", str(tmp_path / "data"),
            "--max-new-tokens", "16", "--regen-batch-size", "4", "--block-size", "6", "--taps", "2", "--steps", "40", "--eval-every", "20",
            "--warmup-steps", "5", "--lr", "3e-3", "--save-dtype", "fp32"]
    assert main(args + (["--bidirectional"] if bidirectional else [])) == 0
    record = json.loads((out / "training_record.json").read_text())
    evals = [h for h in record["history"] if "heldout_loss" in h]
    losses = [h["loss"] for h in record["history"]]
    assert losses[-1] < 0.7 * losses[0], losses
    assert record["data_manifest"]["responses"] == 8 + 2  # greedy for all, sampled for every 4th
    assert record["command"].startswith("jetspec train --target")
    assert evals and evals[-1]["step"] == 40
    cfg = read_head_config(out)
    assert cfg.causal_head is (not bidirectional) and cfg.block_size == 6 and len(cfg.target_layer_ids) == 2
    target = TargetModel(tiny_target)
    load_head(out, target.info)
    assert record["files_sha256"]["model.safetensors"]
    # resuming a finished run does not train further
    assert main(args + (["--bidirectional"] if bidirectional else []) + ["--resume"]) == 0
    assert json.loads((out / "training_record.json").read_text())["steps"] == 40
