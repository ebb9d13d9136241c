"""Training: the exact block-causal mask, the loss against a hand-computed KL, and a short real run."""

import json
import math
import random

import pytest
import torch

from sglang_jetspec.cli import main
from sglang_jetspec.core.head_io import load_head, read_head_config
from sglang_jetspec.reference.target import TargetModel
from sglang_jetspec.train.objective import (
    block_inputs,
    distillation_loss,
    position_weights,
    sample_reveals,
    target_rows,
    training_mask,
)
from tests.builders import tiny_head_config, train_args


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


def test_prefix_reveal_shows_true_tokens_and_trains_only_masked_rows():
    ids = torch.arange(100, 120)
    anchors, revealed = torch.tensor([2, 10, 17]), torch.tensor([2, 0, 1])
    block_ids, positions = block_inputs(ids, anchors, 4, mask_token_id=9, revealed=revealed)
    assert block_ids.tolist() == [102, 103, 104, 9, 110, 9, 9, 9, 117, 118, 9, 9]
    assert positions.tolist() == [2, 3, 4, 5, 10, 11, 12, 13, 17, 18, 19, 20]
    query, teacher, distance = target_rows(anchors, 4, 20, revealed)
    # block 0: rows 1, 2 revealed -> only row 3; block 1: all three; block 2: row 1 revealed, row 2 (token 19) left
    assert query.tolist() == [3, 5, 6, 7, 10]
    assert teacher.tolist() == [4, 10, 11, 12, 18]
    assert distance.tolist() == [1, 1, 2, 3, 1]
    assert position_weights(distance, 2.0).tolist() == pytest.approx([1.0, 1.0, math.exp(-0.5), math.exp(-1.0), 1.0])


def test_sampled_reveals_keep_the_all_mask_share_and_a_token_to_predict():
    anchors = torch.tensor([0, 5, 17] * 2000)
    k = sample_reveals(random.Random(0), anchors, 6, 20, 0.5)
    assert k.min() == 0 and k.max() == 4  # uniform in 1..B-2 otherwise
    # anchor 17 of 20 tokens: token 18 may be shown, token 19 must stay masked to be predicted
    assert set(k[anchors == 17].tolist()) == {0, 1}
    assert abs(float((k[anchors == 0] == 0).float().mean()) - 0.5) < 0.03
    assert set(k[anchors == 0].tolist()) == {0, 1, 2, 3, 4}


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
    assert math.isclose(
        distillation_loss(draft, teacher, torch.tensor([0, 0]), weights, "forward_kl", 2.0).item(),
        expected,
        rel_tol=1e-5,
    )
    reverse = 0.25 * math.log(0.25 / 0.5) + 0.5 * math.log(0.5 / 0.25)
    assert math.isclose(
        distillation_loss(draft, teacher, torch.tensor([0, 0]), weights, "reverse_kl").item(), reverse / 2, rel_tol=1e-5
    )
    sft = distillation_loss(draft, teacher, torch.tensor([1, 2]), weights, "sft").item()
    assert math.isclose(sft, (-math.log(0.5) + math.log(3)) / 2, rel_tol=1e-5)


@pytest.mark.parametrize(
    "bidirectional, reveal", [(False, False), (True, False), (False, True)], ids=["causal", "bidirectional", "reveal"]
)
def test_short_training_run_lowers_loss_and_yields_a_loadable_head(tmp_path, tiny_target, bidirectional, reveal):
    out = tmp_path / "head"
    args = train_args(
        tmp_path,
        tiny_target,
        "--out",
        str(out),
        "--steps",
        "40",
        "--eval-every",
        "20",
        "--warmup-steps",
        "5",
        "--lr",
        "3e-3",
        "--save-dtype",
        "fp32",
    )
    args += (["--bidirectional"] if bidirectional else []) + (
        ["--reveal", "prefix", "--all-mask-share", "0.4"] if reveal else []
    )
    assert main(args) == 0
    record = json.loads((out / "training_record.json").read_text())
    evals = [h for h in record["history"] if "heldout_loss" in h]
    losses = [h["loss"] for h in record["history"]]
    assert losses[-1] < 0.7 * losses[0], losses
    assert record["data_manifest"]["responses"] == 8 + 2  # greedy for all, sampled for every 4th
    assert record["more_data"] == [] and record["init_head"] is None
    assert record["command"].startswith("jetspec train --target")
    assert evals and evals[-1]["step"] == 40
    cfg = read_head_config(out)
    assert cfg.causal_head is (not bidirectional) and cfg.block_size == 6 and len(cfg.target_layer_ids) == 2
    assert cfg.draft_reveal == ({"scheme": "prefix", "all_mask_share": 0.4} if reveal else None)
    assert ("heldout_conditioned_chain_accept_length" in evals[-1]) is reveal
    if reveal:
        # depth d drafted with the true depths 1..d-1 shown: never worse than the all-mask chain on the same blocks
        assert evals[-1]["heldout_conditioned_chain_accept_length"] >= evals[-1]["heldout_chain_accept_length"] - 0.05
    target = TargetModel(tiny_target)
    load_head(out, target.info)
    assert record["files_sha256"]["model.safetensors"]
    # resuming a finished run does not train further
    assert main(args + ["--resume"]) == 0
    assert json.loads((out / "training_record.json").read_text())["steps"] == 40


def test_init_head_fine_tunes_from_a_head_and_refuses_another_shape(tmp_path, tiny_target):
    common = train_args(tmp_path, tiny_target, "--warmup-steps", "2", "--save-dtype", "fp32")
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(common + ["--out", str(first), "--steps", "6", "--eval-every", "6"]) == 0
    # zero further steps: the fine-tuned head is the head it started from, and its record names it
    assert main(common + ["--out", str(second), "--steps", "0", "--init-head", str(first)]) == 0
    assert (second / "model.safetensors").read_bytes() == (first / "model.safetensors").read_bytes()
    record = json.loads((second / "training_record.json").read_text())
    assert record["init_head"] == {
        "dir": str(first),
        "model_sha256": record_of(first)["files_sha256"]["model.safetensors"],
    }
    with pytest.raises(SystemExit, match="--init-head .*num_hidden_layers=1 vs 2.*--layers"):
        main(common + ["--out", str(tmp_path / "third"), "--steps", "0", "--layers", "2", "--init-head", str(first)])


def record_of(head_dir):
    return json.loads((head_dir / "training_record.json").read_text())


def test_prompt_sets_are_named_once_each_and_share_no_data_dir(tmp_path):
    with pytest.raises(
        SystemExit, match="--prompt-set default,nope: name each of default, code-mix, chat at most once"
    ):
        main(["train", "--target", "smollm2", "--out", str(tmp_path / "h"), "--prompt-set", "default,nope"])
    with pytest.raises(SystemExit, match="--data-dir names one directory for 2 prompt sets"):
        main(
            [
                "train",
                "--target",
                "smollm2",
                "--out",
                str(tmp_path / "h"),
                "--prompt-set",
                "default,chat",
                "--data-dir",
                str(tmp_path),
            ]
        )


def test_reveal_is_refused_for_a_bidirectional_head(tmp_path, capsys):
    with pytest.raises(SystemExit, match="--reveal prefix needs a causal head"):
        main(
            ["train", "--target", str(tmp_path), "--out", str(tmp_path / "h"), "--bidirectional", "--reveal", "prefix"]
        )


VOCAB, HIDDEN = 12, 16  # a tiny vocabulary: argmax hits at several depths, so the runs have length


def _random_sequence(ids: torch.Tensor, prompt_len: int, gen: torch.Generator):
    """A training sequence of these ids with random tap and final-layer features."""
    from sglang_jetspec.train.data import Sequence

    n = len(ids)
    return Sequence(ids, prompt_len, torch.randn(n, HIDDEN, generator=gen), torch.randn(n, HIDDEN, generator=gen))


def _tiny_trainer(tmp_path, seqs, train_config, embed, lm_head, **head):
    """A Trainer of a one-tap head, HIDDEN wide over VOCAB tokens (keywords: its HeadConfig fields)."""
    from sglang_jetspec.train.trainer import Trainer

    cfg = tiny_head_config(
        hidden_size=HIDDEN,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=32,
        vocab_size=VOCAB,
        target_layer_ids=(0,),
        **head,
    )
    return Trainer(cfg, train_config, embed, lm_head, seqs, tmp_path, torch.device("cpu"))


def test_conditioned_chain_accept_in_one_pass_equals_one_pass_per_revealed_prefix(tmp_path):
    from sglang_jetspec.train.trainer import TrainConfig

    gen = torch.Generator().manual_seed(0)
    # mostly token 0, which a biased lm_head mostly predicts: chains of varied length
    seqs = [_random_sequence((torch.rand(30, generator=gen) < 0.2).long(), 4, gen) for _ in range(3)]
    lm_head = torch.nn.Linear(HIDDEN, VOCAB)
    with torch.no_grad():
        lm_head.bias.copy_(torch.tensor([3.0] + [0.0] * (VOCAB - 1)))
    trainer = _tiny_trainer(
        tmp_path,
        seqs,
        TrainConfig(reveal="prefix"),
        torch.nn.Embedding(VOCAB, HIDDEN),
        lm_head,
        num_hidden_layers=1,
        block_size=5,
    )
    with torch.no_grad():
        for p in trainer.head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    seq, anchors = seqs[0], torch.tensor([4, 10, 25, 27])  # the last two blocks run out of tokens
    room = 30 - 2 - anchors
    slow = []
    for k in range(4):
        _, argmax, labels, distance = trainer.batch_loss([seq], [anchors], [torch.clamp(room, max=k)])
        first = distance == 1
        slow.append((argmax[first] == labels[first]) & (k <= room))
    expected = (1 + torch.stack(slow, 1).int().cumprod(1).sum(1)).tolist()
    with torch.no_grad():
        assert trainer._conditioned_chain_accepts(seq, anchors) == expected
    assert max(expected) > 2 and min(expected) < max(expected)  # runs of varied length, so the check has teeth


def test_a_padded_batch_trains_each_sequence_as_if_alone(tmp_path):
    """Sequences of different lengths and block counts share one padded head pass: each one's loss and
    the batch's gradient equal what it gets alone (padding and other sequences leak nothing)."""
    from sglang_jetspec.train.trainer import TrainConfig

    gen = torch.Generator().manual_seed(1)
    seqs = [_random_sequence(torch.randint(0, VOCAB - 1, (n,), generator=gen), 3, gen) for n in (9, 30, 17)]
    anchors = [
        torch.tensor([2, 5, 7]),
        torch.tensor([2, 8, 13, 20, 26, 28]),
        torch.tensor([4, 15]),
    ]  # the last blocks run out of tokens
    revealed = [torch.tensor([0, 1, 0]), torch.tensor([0, 2, 1, 0, 2, 0]), torch.tensor([1, 0])]
    embed, lm_head = torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, VOCAB)
    trainer = _tiny_trainer(
        tmp_path, seqs, TrainConfig(position_decay=2.0, reveal="prefix"), embed, lm_head, block_size=4
    )
    with torch.no_grad():
        for p in [*trainer.head.parameters(), *embed.parameters(), *lm_head.parameters()]:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    def grads(loss):
        trainer.head.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in trainer.head.parameters()]

    losses, argmax, labels, distance = trainer.batch_loss(seqs, anchors, revealed)
    alone = [trainer.batch_loss([s], [a], [r]) for s, a, r in zip(seqs, anchors, revealed)]
    assert torch.allclose(losses.detach(), torch.stack([one[0][0] for one in alone]).detach(), atol=1e-5)
    assert torch.equal(argmax, torch.cat([one[1] for one in alone])) and torch.equal(
        labels, torch.cat([one[2] for one in alone])
    )
    assert torch.equal(distance, torch.cat([one[3] for one in alone]))
    batched = grads(losses.mean())
    separate = [grads(one[0][0]) for one in alone]
    for got, *each in zip(batched, *separate):
        assert torch.allclose(got, sum(each) / len(each), atol=1e-5)
    assert (losses.max() - losses.min()).item() > 0.05  # the sequences' losses differ, so a mix-up would show
