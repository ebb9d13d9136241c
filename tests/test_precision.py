"""`--dtype auto` and the greedy-divergence report with logit margins."""

import pytest

from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.reference.divergence import first_difference, first_divergence
from sglang_jetspec.reference.engine import ReferenceEngine, Request
from sglang_jetspec.reference.precision import cpu_flags, resolve_dtype
from sglang_jetspec.reference.target import Segment


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"avx2", "amx_bf16", "amx_tile", "avx512_bf16"}, ("bf16", "auto: CPU has AMX-BF16")),
        ({"avx2", "avx512f", "avx512_bf16"}, ("bf16", "auto: CPU has AVX512-BF16")),
    ],
)
def test_auto_picks_bf16_where_the_cpu_multiplies_bf16_natively(flags, expected):
    assert resolve_dtype("auto", "cpu", flags) == expected


def test_auto_stays_fp32_on_a_cpu_without_bf16_units():
    dtype, reason = resolve_dtype("auto", "cpu", {"avx2", "avx512f", "fma"})
    assert dtype == "fp32" and "no AMX-BF16" in reason


def test_auto_on_a_gpu_and_an_explicit_choice():
    assert resolve_dtype("auto", "cuda:0", set()) == ("bf16", "auto: GPU")
    assert resolve_dtype("fp32", "cuda", {"amx_bf16"}) == ("fp32", "requested")


def test_cpu_flags_reads_the_flags_line():
    assert cpu_flags("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\nbugs\t: x\n") == {"fpu", "avx2", "amx_bf16"}


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2


def test_first_divergence_reports_where_and_the_target_margins(smollm2):
    prompt = smollm2.tokenizer("def fib(n):\n")["input_ids"]
    reference = (
        ReferenceEngine(smollm2)
        .generate([Request(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True), "0")], budget=0)[0]
        .output_ids
    )
    other = list(reference)
    other[3] = (other[3] + 1) % smollm2.info.vocab_size
    assert first_divergence(smollm2, prompt, reference, reference) is None
    d = first_divergence(smollm2, prompt, reference, other)
    assert d["index"] == 3 and d["autoregressive_token"] == reference[3] and d["speculative_token"] == other[3]
    # the fp32 autoregressive token is the argmax there: its gap to any other token is at least the top-2 margin
    assert d["chosen_gap"] >= d["top2_margin"] - 1e-5 and d["top2_margin"] >= 0
    prefix = prompt + reference[:3]
    top = (
        smollm2.logits(smollm2.forward(smollm2.new_cache(1, len(prefix)), [Segment.chain(prefix, 0)]).hidden[0, -1])
        .topk(2)
        .values
    )
    assert d["top2_margin"] == pytest.approx(float(top[0] - top[1]), abs=1e-4)
