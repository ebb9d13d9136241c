"""The accelerator data path (train/batched_data.py), sampled-response counts, --data-only and the
training time budget."""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from sglang_jetspec.cli import main
from sglang_jetspec.reference.target import TargetModel
from sglang_jetspec.train.batched_data import _trim_at_eos, featurize_batched, regenerate_batched
from sglang_jetspec.train.data import (
    RegenerationConfig,
    featurize,
    jobs_for,
    load_sequences,
    read_responses,
    regenerate,
)
from sglang_jetspec.train.trainer import TrainConfig, Trainer
from tests.builders import train_args

# prompts of different lengths, so every batch is left-padded (generate) or right-padded (features)
RECORDS = [{"prompt": f"def f{i}(x):\n    " + "y = x + 1\n    " * (i % 3)} for i in range(7)] + [
    {"messages": [{"role": "user", "content": "hi there"}]}
]


@pytest.fixture(scope="module")
def tiny(tiny_target):
    return TargetModel(tiny_target)


def test_batched_greedy_regeneration_equals_the_engine_and_padded_features_equal_one_pass_features(tmp_path, tiny):
    engine_dir, batched_dir = tmp_path / "engine", tmp_path / "batched"
    regenerate(tiny, RECORDS, engine_dir, RegenerationConfig(max_new_tokens=12, sampled_share=0.5, batch_size=3))
    regenerate_batched(
        tiny,
        RECORDS,
        batched_dir,
        RegenerationConfig(max_new_tokens=12, sampled_share=0.5, batch_size=3, backend="hf-generate"),
    )
    engine = {r["id"]: r for r in read_responses(engine_dir)}
    batched = {r["id"]: r for r in read_responses(batched_dir)}
    assert (
        sorted(batched)
        == sorted(engine)
        == sorted([f"{i}:greedy" for i in range(8)] + [f"{i}:sampled" for i in (0, 2, 4, 6)])
    )
    for job_id, response in engine.items():
        assert batched[job_id]["prompt_ids"] == response["prompt_ids"]
        if job_id.endswith("greedy"):  # fp32: padding does not change an argmax
            assert batched[job_id]["output_ids"] == response["output_ids"], job_id
        assert batched[job_id]["temperature"] == response["temperature"] and len(batched[job_id]["output_ids"]) == 12
    # the batched model still runs the engine's attention afterwards
    assert tiny.model.config._attn_implementation != "sdpa"

    padded_dir = tmp_path / "padded"
    shutil.copytree(batched_dir, padded_dir)
    one_pass = load_sequences(featurize(tiny, batched_dir, (1, 3)))
    padded = load_sequences(featurize_batched(tiny, padded_dir, (1, 3), batch_size=4, shard_size=5))
    assert len(list((padded_dir / "features-1-3").glob("shard-*.safetensors"))) == 3
    assert len(padded) == len(one_pass) == 12
    for a, b in zip(one_pass, padded):
        assert torch.equal(a.ids, b.ids) and a.prompt_len == b.prompt_len
        assert a.taps.shape == b.taps.shape == (a.ids.numel(), 2 * 64) and a.final.shape == b.final.shape
        torch.testing.assert_close(b.taps.float(), a.taps.float(), atol=0.05, rtol=0.02)
        torch.testing.assert_close(b.final.float(), a.final.float(), atol=0.05, rtol=0.02)
    # resuming redoes nothing
    regenerate_batched(
        tiny,
        RECORDS,
        batched_dir,
        RegenerationConfig(max_new_tokens=12, sampled_share=0.5, batch_size=3, backend="hf-generate"),
    )
    assert len(read_responses(batched_dir)) == 12


def test_generated_ids_are_cut_after_the_first_end_of_sequence():
    assert _trim_at_eos([5, 6, 2, 7, 2], frozenset({2})) == [5, 6, 2]
    assert _trim_at_eos([5, 6], frozenset({2})) == [5, 6]


def test_sampled_share_above_one_is_that_many_samples_per_prompt_and_keeps_the_old_ids():
    records = [{"prompt": str(i)} for i in range(5)]
    quarter = [job_id for job_id, _, _ in jobs_for(records, RegenerationConfig(sampled_share=0.25))]
    assert quarter == ["0:greedy", "0:sampled", "1:greedy", "2:greedy", "3:greedy", "4:greedy", "4:sampled"]
    two = jobs_for(records, RegenerationConfig(sampled_share=2))
    assert [job_id for job_id, _, _ in two][:3] == ["0:greedy", "0:sampled", "0:sampled-1"] and len(two) == 15
    seeds = [params.seed for _, _, params in two if params.temperature > 0]
    assert len(set(seeds)) == 10 and seeds[0] == 0  # the first sample keeps its historical seed
    with pytest.raises(ValueError, match="whole number"):
        RegenerationConfig(sampled_share=1.5)


def test_the_backend_stays_out_of_engine_digests_so_existing_data_dirs_keep_their_names():
    # the shipped head's bf16 data directories: smollm2-135m-instruct-{default,chat-...}-8dd95ef9
    shipped = RegenerationConfig(dtype="bf16", features="generation", tap_layers=(1, 10, 18, 27), batch_size=32)
    assert shipped.digest() == "8dd95ef9" and "backend" not in shipped.as_json()
    assert RegenerationConfig(backend="hf-generate").as_json()["backend"] == "hf-generate"
    assert RegenerationConfig(backend="hf-generate").digest() != RegenerationConfig().digest()
    with pytest.raises(ValueError, match="teacher-forced"):
        RegenerationConfig(backend="hf-generate", features="generation", tap_layers=(1,))


def _train_args(tmp_path, tiny_target, *extra):
    return train_args(
        tmp_path, tiny_target, "--device", "cpu", "--regen-backend", "hf-generate", *extra, prompts=6, max_new_tokens=12
    )


def test_data_only_prepares_the_data_and_trains_nothing(tmp_path, tiny_target):
    out = tmp_path / "head"
    assert main(_train_args(tmp_path, tiny_target, "--out", str(out), "--data-only", "--sampled-share", "2")) == 0
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["responses"] == 18 and manifest["regeneration"]["backend"] == "hf-generate"
    assert manifest["features"]["dir"] == "features-1-3" and manifest["features"]["mode"] == "teacher-forced"
    assert not out.exists()


def test_time_budget_lowers_the_steps_and_the_schedule_ends_on_time(tmp_path, tiny_target):
    out = tmp_path / "head"
    args = _train_args(
        tmp_path,
        tiny_target,
        "--out",
        str(out),
        "--steps",
        "100000",
        "--warmup-steps",
        "2",
        "--eval-every",
        "20",
        "--lr",
        "1e-3",
        "--time-budget-min",
        "0.05",
    )
    assert main(args) == 0
    record = json.loads((out / "training_record.json").read_text())
    assert record["requested_steps"] == 100000 and 25 < record["steps"] < 100000
    assert record["train_config"]["steps"] == record["steps"]
    last = record["history"][-1]
    assert last["step"] == record["steps"] and last["lr"] == pytest.approx(1e-3 * 0.1)  # the cosine ran to its end
    # resuming keeps the budgeted count instead of training towards the requested one
    assert main(args + ["--resume"]) == 0
    assert json.loads((out / "training_record.json").read_text())["steps"] == record["steps"]


def test_budgeted_steps_are_what_the_measured_rate_fits_less_the_reserve():
    run = SimpleNamespace(cfg=TrainConfig(steps=5000, time_budget_s=100.0), step=25, requested_steps=5000)
    # 10 s spent, 0.1 s a step: (100 * 0.9 - 10) / 0.1 = 800 more steps
    Trainer.fit_steps_to_budget(run, elapsed_s=10.0, timed_s=2.0, timed_steps=20)
    assert run.cfg.steps == 825 and run.cfg.time_budget_s == 100.0
    Trainer.fit_steps_to_budget(run, elapsed_s=10.0, timed_s=0.2, timed_steps=20)  # faster than planned: never raised
    assert run.cfg.steps == 825
    Trainer.fit_steps_to_budget(run, elapsed_s=200.0, timed_s=2.0, timed_steps=20)  # over budget already: one more step
    assert run.cfg.steps == 26


def test_hf_generate_backend_refuses_generation_features(tmp_path, tiny_target):
    with pytest.raises(SystemExit, match="teacher-forced features.*--regen-backend, --features"):
        main(_train_args(tmp_path, tiny_target, "--out", str(tmp_path / "h"), "--features", "generation"))
