"""The worker's pure pieces: SGLang sampling params -> core params, per-request draft state across
join / re-prefill / finish, result assembly (accept lengths incl. bonus, output layout, kept rows) and
the argmax-on-device acceptance the worker relies on."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from sglang_jetspec.adapter.request_sampling import (
    UNLIMITED_NEW_TOKENS,
    core_sampling_params,
    crashing_input,
    unsupported_feature,
)
from sglang_jetspec.adapter.request_state import DraftStateStore
from sglang_jetspec.adapter.step_outputs import accept_step
from sglang_jetspec.core.sampling import SamplingParams, make_generator
from sglang_jetspec.core.tree import TreeSpec, build_tree, root_only_tree, top_k_per_depth

# ---- sampling params ----


def _sglang_params(**kw):
    pytest.importorskip("sglang")
    from sglang.srt.sampling.sampling_params import SamplingParams as SGLangParams

    return SGLangParams(**kw)


def test_sglang_greedy_normalisation_maps_to_core_greedy():
    core = core_sampling_params(_sglang_params(temperature=0.0, max_new_tokens=7, sampling_seed=3), 49152)
    assert core == SamplingParams(temperature=0.0, max_new_tokens=7, seed=3)


def test_sampled_params_carry_over_and_top_k_all_means_off():
    sp = _sglang_params(temperature=0.7, top_p=0.9, top_k=-1, min_p=0.05, max_new_tokens=None, ignore_eos=True)
    assert sp.top_k == 1 << 30  # SGLang's TOP_K_ALL after normalisation
    core = core_sampling_params(sp, 49152)
    assert (core.temperature, core.top_p, core.top_k, core.min_p) == (
        pytest.approx(0.7),
        pytest.approx(0.9),
        -1,
        pytest.approx(0.05),
    )
    assert core.max_new_tokens == UNLIMITED_NEW_TOKENS and core.ignore_eos and core.seed is None
    assert core_sampling_params(_sglang_params(temperature=1.0, top_k=20), 49152).top_k == 20
    assert core_sampling_params(_sglang_params(temperature=1.0, top_k=60000), 49152).top_k == -1


def _req(**kw):
    fields = dict(
        sampling_params=_sglang_params(),
        grammar=None,
        custom_logit_processor=None,
        return_hidden_states=False,
        return_sampling_mask=False,
    )
    fields.update(kw)
    return SimpleNamespace(**fields)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(custom_logit_processor="x"), "custom_logit_processor"),
        (dict(return_hidden_states=True), "return_hidden_states"),
        (dict(return_sampling_mask=True), "return_sampling_mask"),
    ],
)
def test_unsupported_request_features_are_named(change, field):
    if "sampling_params" in change:
        change = dict(sampling_params=_sglang_params(**change["sampling_params"]))
    assert field in unsupported_feature(_req(**change))


def test_plain_and_constrained_requests_are_supported():
    assert unsupported_feature(_req()) is None
    assert (
        unsupported_feature(_req(grammar=object(), sampling_params=_sglang_params(json_schema='{"type": "object"}')))
        is None
    )


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(origin_input_ids=[]), "the prompt is empty"),
        (dict(origin_input_ids=[5, 49152]), "input_ids: token id 49152 is outside the model's vocabulary [0, 49152)"),
        (dict(origin_input_ids=[-1, 5]), "input_ids: token id -1 is outside"),
        (dict(origin_input_ids=[2**40]), f"input_ids: token id {2**40} is outside"),
        (dict(sampling_params={"top_k": 10**12}), "sampling_params.top_k 1000000000000"),
        (dict(sampling_params={"top_k": 49153}), "sampling_params.top_k 49153"),
        (dict(sampling_params={"top_k": 2.5}), "sampling_params.top_k 2.5"),
        (
            dict(logprob=SimpleNamespace(top_logprobs_num=100_000)),
            "top_logprobs_num 100000 is above the vocabulary size 49152",
        ),
        (
            dict(sampling_params={"stop_token_ids": [2, 10**6], "min_new_tokens": 2}),
            "sampling_params.stop_token_ids: 1000000 is outside",
        ),
    ],
)
def test_inputs_that_crash_sglangs_scheduler_are_named(change, field):
    if "sampling_params" in change:
        change = dict(sampling_params=_sglang_params(**change["sampling_params"]))
    assert field in crashing_input(_req(**{"origin_input_ids": [1, 2], **change}), 49152)


@pytest.mark.parametrize(
    "change",
    [
        dict(),
        dict(origin_input_ids=[0, 49151]),
        dict(sampling_params={"top_k": 49152}),
        dict(sampling_params={"top_k": -1}),
        dict(sampling_params={"temperature": 0}),
        dict(logprob=SimpleNamespace(top_logprobs_num=49152)),
    ],
)
def test_inputs_at_the_limits_are_admitted(change):
    if "sampling_params" in change:
        change = dict(sampling_params=_sglang_params(**change["sampling_params"]))
    assert crashing_input(_req(**{"origin_input_ids": [1, 2], **change}), 49152) is None


# ---- per-request draft state ----


def test_join_chunked_prefill_and_finish():
    store = DraftStateStore()
    a = store.extended("a", SamplingParams(), prefix_held=True)  # first chunk
    assert store.extended("a", SamplingParams(), prefix_held=True) is a  # second chunk: the same state
    b = store.extended("b", SamplingParams(temperature=1.0, seed=5), prefix_held=True)  # joins mid-batch
    assert a.drafts and b.drafts and len(store) == 2
    assert store.drop("a") is a and "a" not in store and store.drop("a") is None
    assert store.rids() == ["b"]


def test_a_prefix_whose_context_is_not_in_the_pool_stops_the_request_drafting_not_decoding():
    store = DraftStateStore()
    hit = store.extended("h", SamplingParams(), prefix_held=False)  # written while speculation was off
    assert hit.context_lost and not hit.drafts
    assert store.extended("h", SamplingParams(), prefix_held=True).context_lost  # for good (e.g. after a retraction)
    ok = store.extended("o", SamplingParams(), prefix_held=True)
    ok.gated_off = True  # its cohort gated off by default
    assert not ok.drafts and not ok.context_lost


def test_each_request_has_its_own_seeded_generator():
    store = DraftStateStore()
    x = store.extended("x", SamplingParams(temperature=1.0, seed=11), prefix_held=True)
    y = store.extended("y", SamplingParams(temperature=1.0, seed=11), prefix_held=True)
    assert x.generator is not y.generator
    assert torch.equal(torch.rand(3, generator=x.generator), torch.rand(3, generator=y.generator))


# ---- result assembly ----


def _tree(seed, budget=10):
    gen = torch.Generator().manual_seed(seed)
    tokens, logprobs = top_k_per_depth(torch.randn(4, 30, generator=gen) * 3, 3)
    return build_tree(1, tokens, logprobs, TreeSpec(budget, 4, 3))


def test_outputs_follow_sglang_slicing_and_the_kv_mover_layout():
    trees = [_tree(0), root_only_tree(4), _tree(2)]
    n = 12
    logits = torch.randn(3 * n, 30)
    for b, tree in enumerate(trees):  # make the target agree with every first child: long paths
        for node, kids in enumerate(tree.children()):
            if kids:
                logits[b * n + node, int(tree.tokens[kids[0]])] = 50.0
    out = accept_step(trees, logits, n, [SamplingParams()] * 3, [make_generator(0)] * 3)
    lens = out.accept_lens.tolist()
    assert lens[1] == 1 and lens[0] > 1 and lens[2] > 1  # bonus included; root-only commits one token
    flat = out.next_token_ids.tolist()
    for b, result in enumerate(out.results):
        # what batch_result_processor._resolve_spec_v2_tokens takes for request b
        assert flat[b * out.stride : b * out.stride + lens[b]] == result.tokens
        assert out.accept_index[b, : lens[b]].tolist() == [b * n + node for node in result.path]
        assert (out.accept_index[b, lens[b] :] == -1).all()
        assert out.bonus_tokens[b] == result.tokens[-1]
    # compute_spec_logprobs reads predict[accept_index]: the committed tokens again
    kept = out.accept_index >= 0
    assert out.predict[out.accept_index[kept].long()].tolist() == [t for r in out.results for t in r.tokens]
    # tap rows for the draft context: root + accepted nodes, request-major
    assert out.row_index.tolist() == [b * n + node for b, r in enumerate(out.results) for node in r.path]
    assert out.row_counts == lens and out.accept_index.dtype == torch.int32


class _CopyCounting(torch.Tensor):
    """Records the shape of every tensor moved with .cpu() (a device-to-host copy on a GPU)."""

    copied: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.cpu:
            cls.copied.append(tuple(args[0].shape))
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize(
    "params, method",
    [
        (SamplingParams(), "match"),
        (SamplingParams(temperature=1.0), "match"),
        (SamplingParams(temperature=0.8, top_p=0.9), "residual"),
    ],
)
def test_acceptance_never_copies_the_tree_distribution_to_the_host(params, method):
    """Greedy rows copy [B, N] token ids; sample-then-match copies its draws at every node once (token ids:
    at most B x N, and one flag per chunk); the residual rule, per depth of its walk, one [V] row of each
    request still walking (at most B rows a copy); no [B, N] argmax for a batch without greedy rows
    (nothing reads it). A [B, N, V] copy would move N vocabulary rows per request over PCIe every step."""
    trees = [_tree(0), _tree(1)]
    logits = torch.randn(2 * 10, 30)
    plain = accept_step(trees, logits, 10, [params] * 2, [make_generator(0), make_generator(1)], method)
    _CopyCounting.copied = []
    counted = accept_step(
        trees, logits.as_subclass(_CopyCounting), 10, [params] * 2, [make_generator(0), make_generator(1)], method
    )
    assert ((2, 10) in _CopyCounting.copied) == params.greedy, _CopyCounting.copied
    for shape in _CopyCounting.copied:
        token_ids = len(shape) == 1 and shape[0] <= 2 * 10 + 1
        assert token_ids or (len(shape) == 2 and shape[0] <= 2), _CopyCounting.copied
    assert [r.tokens for r in counted.results] == [r.tokens for r in plain.results]


# ---- telemetry and shadow ----


def test_verify_step_feeds_the_jetspec_step_metrics():
    from prometheus_client import CollectorRegistry

    from sglang_jetspec.core.step_record import StepRecord
    from sglang_jetspec.observability.metrics import JetspecMetrics

    registry = CollectorRegistry()
    JetspecMetrics(registry).record_step(
        "bs1",
        StepRecord(
            batch_size=2,
            budget=16,
            committed_tokens=7,
            accept_lengths=[3, 4],
            draft_s=0.1,
            tree_s=0.01,
            verify_s=0.2,
            accept_s=0.05,
            wall_s=0.4,
        ),
    )
    labels = {"cohort": "bs1", "budget": "16"}
    assert registry.get_sample_value("jetspec_committed_tokens_total", labels) == 7
    assert registry.get_sample_value("jetspec_request_seconds_total", labels) == pytest.approx(0.8)
    assert registry.get_sample_value("jetspec_accept_length_count", labels) == 2


def test_finished_requests_are_spooled_with_their_speculation_log(tmp_path):
    pytest.importorskip("sglang")
    from prometheus_client import CollectorRegistry
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH

    from sglang_jetspec.adapter.worker_observability import WorkerShadow
    from sglang_jetspec.spool.tee import ShadowTee
    from sglang_jetspec.spool.writer import SpoolWriter

    store = DraftStateStore()
    state = store.extended("q", SamplingParams(temperature=0.5, seed=2, max_new_tokens=3), prefix_held=True)
    state.budgets, state.accept_lengths = [16, 0], [2, 1]
    req = SimpleNamespace(
        rid="q",
        origin_input_ids=[5, 6],
        output_ids=[7, 8, 9],
        finished_reason=FINISH_LENGTH(3),
        sampling_params=_sglang_params(temperature=0.5),
        grammar=None,
    )
    registry = CollectorRegistry()
    shadow = WorkerShadow(
        ShadowTee(SpoolWriter(tmp_path), sample_rate=1.0, registry=registry).start(), model="m", head="h"
    )
    assert shadow.finished(req, state)
    req.finished_reason = FINISH_ABORT("bad")
    assert not shadow.finished(req, state)  # an abort says nothing about the target distribution
    # the checker rescores without masks or penalties: such requests are counted, never teed
    req.finished_reason = FINISH_LENGTH(3)
    for change, reason in (
        (dict(grammar=object()), "grammar"),
        (dict(sampling_params=_sglang_params(frequency_penalty=0.5)), "penalty"),
        (dict(sampling_params=_sglang_params(logit_bias={"5": 1.0})), "logit_bias"),
        (dict(sampling_params=_sglang_params(min_new_tokens=2)), "min_new_tokens"),
    ):
        assert not shadow.finished(SimpleNamespace(**{**vars(req), **change}), state)
        assert registry.get_sample_value("jetspec_shadow_unchecked_total", {"reason": reason}) == 1
    shadow.close()
    (line,) = [line for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
    record = json.loads(line)
    assert (record["prompt_ids"], record["output_ids"], record["finish_reason"]) == ([5, 6], [7, 8, 9], "length")
    assert record["spec"] == {"budgets": [16, 0], "accept_lengths": [2, 1]} and record["sampling"]["seed"] == 2


def test_a_grammar_request_is_spooled_with_the_grammar_sglang_compiled(tmp_path, smollm2, xgrammar_backend):
    """With the server's xgrammar options the record carries the grammar as compiled (dispatch type, key,
    whitespace options, stop tokens) for the checker to rebuild; another backend, or a grammar beside a
    penalty, stays a counted blind spot."""
    from prometheus_client import CollectorRegistry
    from sglang.srt.managers.schedule_batch import FINISH_MATCHED_TOKEN

    from sglang_jetspec.adapter.worker_observability import WorkerShadow, xgrammar_options
    from sglang_jetspec.spool.tee import ShadowTee
    from sglang_jetspec.spool.writer import SpoolWriter

    store = DraftStateStore()
    state = store.extended("g", SamplingParams(temperature=0.8, seed=1, max_new_tokens=8), prefix_held=True)
    regex = r"[0-9]{3}"
    req = SimpleNamespace(
        rid="g",
        origin_input_ids=[5, 6],
        output_ids=[7, 8],
        finished_reason=FINISH_MATCHED_TOKEN(8),
        sampling_params=_sglang_params(temperature=0.8, regex=regex),
        grammar=xgrammar_backend.dispatch_regex(regex),
    )
    args = SimpleNamespace(
        grammar_backend="xgrammar", constrained_json_disable_any_whitespace=True, constrained_json_max_whitespace_cnt=2
    )
    registry = CollectorRegistry()
    tee = ShadowTee(SpoolWriter(tmp_path), sample_rate=1.0, registry=registry).start()
    shadow = WorkerShadow(tee, model="m", head="h", grammar=xgrammar_options(args))
    assert shadow.finished(req, state)
    penalised = SimpleNamespace(**{**vars(req), "sampling_params": _sglang_params(regex=regex, presence_penalty=0.5)})
    assert not shadow.finished(penalised, state)
    assert registry.get_sample_value("jetspec_shadow_unchecked_total", {"reason": "penalty"}) == 1
    outlines = WorkerShadow(
        tee, model="m", head="h", grammar=xgrammar_options(SimpleNamespace(grammar_backend="outlines"))
    )
    assert not outlines.finished(req, state)
    assert registry.get_sample_value("jetspec_shadow_unchecked_total", {"reason": "grammar"}) == 1
    shadow.close()
    (line,) = [line for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert json.loads(line)["constraint"] == {
        "kind": "regex",
        "value": regex,
        "any_whitespace": False,
        "max_whitespace_cnt": 2,
        "stop_token_ids": [smollm2.tokenizer.eos_token_id],
    }


def test_step_spans_follow_sglang_tracing(monkeypatch):
    """No tracer (and no span work) unless SGLang's --enable-trace initialised tracing in the process."""
    pytest.importorskip("sglang")
    from sglang.srt.observability import trace as sglang_trace

    from sglang_jetspec.adapter.worker_observability import step_tracer

    monkeypatch.setattr(sglang_trace, "opentelemetry_initialized", False)
    assert step_tracer() is None
    monkeypatch.setattr(sglang_trace, "opentelemetry_initialized", True)
    assert step_tracer() is not None


def test_the_drafter_reads_the_targets_embedding_and_lm_head_after_a_weight_update():
    """SGLang's weight updates may replace the target's tensors; the head must see the new ones (a
    view taken at start-up would keep drafting with the old weights)."""
    from types import SimpleNamespace

    from torch import nn

    from sglang_jetspec.adapter.target_views import target_tables
    from sglang_jetspec.adapter.tensor_parallel import SingleRank

    embedding, lm_head = nn.Embedding(10, 4), nn.Linear(4, 12, bias=False)  # 12 rows: a padded table
    model = SimpleNamespace(get_input_embeddings=lambda: embedding, lm_head=lm_head)
    embed, head = target_tables(model, 10, SingleRank())
    ids, hidden = torch.tensor([1, 2]), torch.randn(2, 4)
    assert torch.equal(embed(ids), embedding.weight[ids]) and head(hidden).shape == (2, 10)
    embedding.weight = nn.Parameter(torch.randn(10, 4))  # what a loader does when it swaps the tensor
    lm_head.weight = nn.Parameter(torch.randn(12, 4))
    assert torch.equal(embed(ids), embedding.weight[ids])
    assert torch.equal(head(hidden), hidden @ lm_head.weight[:10].T)
    assert list(embed.parameters()) == [] and list(head.parameters()) == []  # the target is not the head's submodule
