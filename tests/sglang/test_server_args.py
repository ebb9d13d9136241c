"""Argument validation on real ServerArgs objects, resolved by SGLang's own pipeline on this CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_jetspec.adapter.policy import POLICY_ENV

# Everything JETSPEC needs; each test breaks one thing.
# Argument resolution runs on any machine, so a GPU device is resolvable here.
GOOD = [
    "--attention-backend",
    "flashinfer",
    "--disable-overlap-schedule",
    "--disable-decode-cuda-graph",
    "--device",
    "cuda",
]


@pytest.fixture(scope="module")
def resolve(jetspec_registered, smollm2_dir, head_dir):
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import prepare_server_args

    def run(*extra, head=head_dir, base=GOOD):
        argv = ["--model-path", str(smollm2_dir), "--speculative-algorithm", "jetspec", *base, *extra]
        if head is not None:
            argv += ["--speculative-draft-model-path", str(head)]
        server_args = prepare_server_args(argv)
        server_args.resolve_once()
        return resolving_view(server_args)

    return run


def _problems(resolve, *extra, **kw) -> str:
    from sglang_jetspec.adapter.server_args import JetSpecArgsError

    with pytest.raises(JetSpecArgsError) as info:
        resolve(*extra, **kw)
    return str(info.value)


def test_valid_arguments_resolve_the_speculative_shape(resolve):
    cfg = resolve()
    assert cfg.speculative_algorithm == "JETSPEC"
    # shipped head: block_size 16 -> 15 drafted depths; default policy's largest budget is 64
    assert (cfg.speculative_num_steps, cfg.speculative_eagle_topk, cfg.speculative_num_draft_tokens) == (15, 1, 64)


def test_missing_draft_path(resolve):
    assert "--speculative-draft-model-path is missing" in _problems(resolve, head=None)


def test_head_that_does_not_fit_the_target(resolve, head_dir, tmp_path):
    config = json.loads((head_dir / "config.json").read_text())
    config["hidden_size"] = 1024
    (tmp_path / "config.json").write_text(json.dumps(config))
    text = _problems(resolve, head=tmp_path)
    assert "head hidden_size=1024 but target hidden_size=576" in text


def test_head_tapping_layers_the_target_lacks(resolve, head_dir, tmp_path):
    config = json.loads((head_dir / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 40]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert "layers [40] do not exist in a target with num_hidden_layers=30" in _problems(resolve, head=tmp_path)


@pytest.mark.parametrize("backend", ["fa3", "torch_native"])
def test_attention_backend_that_ignores_tree_masks(resolve, backend):
    base = [a for a in GOOD if a not in ("--attention-backend", "flashinfer")]
    text = _problems(resolve, "--attention-backend", backend, base=base)
    assert f"--attention-backend {backend}: this attention backend ignores the tree mask" in text
    assert "pass --attention-backend flashinfer (or triton)" in text


CPU = ["--disable-overlap-schedule", "--disable-decode-cuda-graph", "--disable-radix-cache", "--device", "cpu"]


def test_intel_amx_is_accepted_on_a_cpu_device(resolve):
    from sglang.srt.runtime_context import override_platform

    with override_platform(has_amx=True):  # what SGLang's CPU engine reports on an AMX machine
        assert resolve("--attention-backend", "intel_amx", base=CPU).attention_backend == "intel_amx"


def test_cpu_without_amx_falls_back_to_torch_native_and_is_refused_with_the_reason(resolve):
    from sglang.srt.runtime_context import override_platform

    with override_platform(has_amx=False):
        text = _problems(resolve, "--attention-backend", "intel_amx", base=CPU)
    assert "--attention-backend torch_native: this attention backend ignores the tree mask" in text
    assert "SGLang falls back from intel_amx to torch_native when the platform reports no AMX" in text
    assert "pass --attention-backend intel_amx (SGLang's CPU backend)" in text


@pytest.mark.parametrize(
    "device, backend, expected",
    [
        (
            "cpu",
            "flashinfer",
            "--attention-backend flashinfer: a GPU backend, but --device is cpu; pass --attention-backend intel_amx",
        ),
        (
            "cuda",
            "intel_amx",
            "--attention-backend intel_amx: a CPU-only backend, but --device is cuda; "
            "pass --attention-backend flashinfer",
        ),
    ],
)
def test_backend_must_match_the_device(resolve, device, backend, expected):
    from sglang.srt.runtime_context import override_platform

    base = [a for a in CPU if a != "cpu"] + [device]
    with override_platform(has_amx=True):
        assert expected in _problems(resolve, "--attention-backend", backend, base=base)


def test_triton_is_accepted(resolve):
    base = [a for a in GOOD if a != "flashinfer"]
    base[base.index("--attention-backend") + 1 : 1] = ["triton"]
    assert resolve(base=base).attention_backend == "triton"


def test_prefill_backend_decides_in_prefill_mode(resolve):
    text = _problems(resolve, "--prefill-attention-backend", "fa3")
    assert "--prefill-attention-backend fa3: this attention backend ignores the tree mask" in text


@pytest.mark.parametrize(
    "flag, expected",
    [
        (
            ["--speculative-use-rejection-sampling"],
            "--speculative-use-rejection-sampling: JETSPEC accepts with its own",
        ),
        (["--pp-size", "2"], "--pp-size 2: pipeline parallelism is not supported"),
        (["--enable-mixed-chunk"], "--enable-mixed-chunk is not supported by JETSPEC"),
        (["--page-size", "16"], "--page-size 16: JETSPEC compacts accepted tree nodes slot by slot"),
        (["--speculative-eagle-topk", "4"], "--speculative-eagle-topk 4: JETSPEC's tree width comes from the head"),
        (
            ["--speculative-num-draft-tokens", "32"],
            "--speculative-num-draft-tokens 32 is below the policy's largest budget 64",
        ),
        (["--grammar-backend", "outlines"], "--grammar-backend outlines: JETSPEC masks each draft tree node"),
    ],
)
def test_unsupported_flags(resolve, flag, expected):
    assert expected in _problems(resolve, *flag)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_grammar_backends_that_roll_back_are_accepted(resolve, backend):
    assert resolve("--grammar-backend", backend).grammar_backend == backend


def test_block_verification_is_refused(resolve):
    # SGLang refuses it for plugin algorithms before JETSPEC's own check runs
    with pytest.raises(ValueError, match="--speculative-use-block-verification only supports"):
        resolve("--speculative-use-block-verification")


def test_tensor_parallelism_is_served(resolve):
    assert resolve("--tp-size", "2").tp_size == 2  # rank 0 drafts, every rank accepts (adapter.tensor_parallel)


def test_dp_attention_is_refused(resolve):
    text = _problems(resolve, "--tp-size", "2", "--attn-dp-size", "2")
    assert "attention data parallelism (--attn-dp-size 2, or the deprecated --enable-dp-attention)" in text


def test_the_overlap_scheduler_must_be_off(resolve):
    text = _problems(resolve, base=["--attention-backend", "flashinfer", "--device", "cuda"])
    assert (
        "the overlap scheduler is on: JETSPEC runs synchronously" in text and "pass --disable-overlap-schedule" in text
    )
    assert "decode" not in text  # decode CUDA graphs, SGLang's default on CUDA, are served


def test_the_radix_cache_is_served_and_kv_from_outside_the_pool_is_refused(resolve):
    assert resolve().disable_radix_cache is False  # GOOD leaves SGLang's default: the radix cache on
    assert resolve("--disable-radix-cache").disable_radix_cache is True
    text = _problems(resolve, "--enable-hierarchical-cache")
    assert (
        "--enable-hierarchical-cache: KV loaded back from host memory or storage arrives without the head's context"
        in text
    )


def test_pd_disaggregation_is_refused(resolve):
    # SGLang's own checks may add theirs (transfer backend, ...); JETSPEC's must be among them
    try:
        text = _problems(resolve, "--disaggregation-mode", "decode")
    except ValueError as exc:  # SGLang refused first: then it is refused all the same, but say so
        pytest.fail(f"SGLang refused PD disaggregation before JETSPEC's check ran: {exc}")
    assert "--disaggregation-mode decode: a decode server would receive requests without the tap rows" in text


def test_every_problem_is_reported_at_once(resolve):
    from sglang.srt.runtime_context import override_platform

    with override_platform(has_amx=False):
        text = _problems(resolve, "--pp-size", "2", "--enable-mixed-chunk", base=["--device", "cpu"])
    lines = text.splitlines()[1:]
    # the CPU default backend, pp, mixed chunk, graphs (pp > 1 already switches overlap off in SGLang)
    assert [line.split(":")[0].split(" is ")[0] for line in lines] == [
        "  - --attention-backend torch_native",
        "  - --pp-size 2",
        "  - --enable-mixed-chunk",
        "  - decode graphs are on with --device cpu",
    ]


def test_bad_policy_file_names_the_env_var_and_the_line(resolve, tmp_path, monkeypatch):
    bad = tmp_path / "policy.yaml"
    bad.write_text("cohorts:\n  - name: all\n    min_batch: 1\n    max_batch: 8\n    budgets: [0, 8]\n    default: 5\n")
    monkeypatch.setenv(POLICY_ENV, str(bad))
    text = _problems(resolve)
    assert f"{POLICY_ENV}={bad}" in text and f"{bad}:6: cohorts[0] 'all' default 5 is not one of its budgets" in text


def test_policy_budgets_set_the_verify_width(resolve, tmp_path, monkeypatch):
    small = tmp_path / "policy.yaml"
    small.write_text(
        "cohorts:\n  - name: all\n    min_batch: 1\n    max_batch: 8\n    budgets: [0, 4, 24]\n"
        "    default: 24\ngate:\n  reprobe_budget: 4\n"
    )
    monkeypatch.setenv(POLICY_ENV, str(small))
    assert resolve().speculative_num_draft_tokens == 24


def test_prefill_cuda_graphs_are_switched_off_with_a_warning(resolve, monkeypatch):
    """JETSPEC's prefill asks for FULL hidden capture, which SGLang's prefill graphs never replay.
    (SGLang alone keeps `--cuda-graph-backend-prefill breakable` on this model.)"""
    from sglang_jetspec.adapter import spec_algo

    warnings = []
    monkeypatch.setattr(spec_algo.log, "warning", lambda msg, *a: warnings.append(msg % a))
    cfg = resolve("--cuda-graph-backend-prefill", "breakable")
    assert cfg.cuda_graph_config.prefill.backend == "disabled"
    assert cfg.cuda_graph_config.decode.backend == "disabled"
    assert any("prefill CUDA graphs (breakable) switched off" in w for w in warnings)


def test_the_kubernetes_manifest_passes_jetspec_validation(resolve):
    """ops/k8s/sglang.yaml's server arguments, with this machine's model and head in place of its volumes."""
    import yaml

    manifest = Path(__file__).parents[2] / "ops" / "k8s" / "sglang.yaml"
    (deployment,) = [doc for doc in yaml.safe_load_all(manifest.read_text()) if doc and doc["kind"] == "StatefulSet"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    paths = ("--model-path=", "--speculative-draft-model-path=", "--speculative-algorithm=")
    args = [arg for arg in container["args"] if not arg.startswith(paths)]
    assert resolve(base=[*args, "--device", "cuda"]).speculative_algorithm.upper() == "JETSPEC"


def test_a_malformed_verify_width_ladder_is_refused_at_start_up(resolve, monkeypatch):
    from sglang_jetspec.core.verify_widths import WIDTHS_ENV

    monkeypatch.setenv(WIDTHS_ENV, "4,8,sixteen")
    assert f"{WIDTHS_ENV}='4,8,sixteen': 'sixteen' is not a width" in _problems(resolve)
    monkeypatch.setenv(WIDTHS_ENV, "4,8,16,32,64")
    assert resolve().speculative_num_draft_tokens >= 16  # a good ladder starts


def test_decode_cuda_graphs_stay_on_by_default_on_cuda_and_pad_to_the_default_ladder(resolve, monkeypatch):
    from sglang_jetspec.adapter.server_args import configured_verify_widths, verify_graphs_on
    from sglang_jetspec.core.verify_widths import WIDTHS_ENV

    monkeypatch.delenv(WIDTHS_ENV, raising=False)
    on = ["--attention-backend", "flashinfer", "--device", "cuda", "--disable-overlap-schedule"]
    cfg = resolve(base=on)
    assert verify_graphs_on(cfg) and cfg.speculative_num_draft_tokens == 64
    assert configured_verify_widths(64, verify_graphs_on(cfg)).rungs == (4, 8, 16, 32, 64)
    assert configured_verify_widths(24, graphs=True).rungs == (4, 8, 16, 24)  # capped by the KV reserved
    off = resolve(base=[*on, "--disable-decode-cuda-graph"])
    assert not verify_graphs_on(off) and not configured_verify_widths(64, verify_graphs_on(off)).pads  # eager
    assert not verify_graphs_on(resolve("--disable-cuda-graph"))  # CPU: never
    monkeypatch.setenv(WIDTHS_ENV, "8,32")  # the operator's ladder wins over the default
    assert configured_verify_widths(64, graphs=True).rungs == (8, 32, 64)
    assert configured_verify_widths(64, graphs=False).rungs == (8, 32, 64)  # and pads an eager verify too


def test_decode_graphs_on_a_cpu_are_refused(resolve):
    text = _problems(resolve, base=["--attention-backend", "intel_amx", "--device", "cpu"])
    assert "decode graphs are on with --device cpu" in text and "pass --disable-cuda-graph" in text
