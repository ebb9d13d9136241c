"""An SGLang request's sampling configuration as the core's SamplingParams (pure, no SGLang import).

The core's acceptance is lossless for the distribution `core.sampling.processed_probs` gives
(temperature, top-k, top-p, min-p). SGLang normalises its `SamplingParams` before the scheduler
sees a request (sampling/sampling_params.py `__post_init__`): temperature 0 becomes
temperature 1 with top_k 1, and top_k -1 becomes TOP_K_ALL. Greedy is therefore "top_k == 1"
on SGLang's side, and a top_k covering the vocabulary means "no top-k".

Request features the tree acceptance cannot honour are named by `unsupported_feature`, so such a
request is refused at admission (adapter.scheduler_hooks) with a message naming the field instead of
being decoded wrongly. Inputs that take SGLang 0.5.23's own scheduler down (and with it every request
of the server) are named by `crashing_input` and refused the same way.
"""

from __future__ import annotations

from sglang_jetspec.core.sampling import SamplingParams

# SGLang has no limit when max_new_tokens is None; the core needs a positive number.
UNLIMITED_NEW_TOKENS = 1 << 31
# SGLang's "no top-k" after normalisation (sampling_params.TOP_K_ALL); any other top_k is a count
TOP_K_ALL = 1 << 30


def core_sampling_params(sp, vocab_size: int) -> SamplingParams:
    """`sp`: a normalised sglang.srt.sampling.sampling_params.SamplingParams (read by attribute)."""
    common = dict(
        seed=sp.sampling_seed, max_new_tokens=sp.max_new_tokens or UNLIMITED_NEW_TOKENS, ignore_eos=bool(sp.ignore_eos)
    )
    if sp.top_k == 1:
        return SamplingParams(temperature=0.0, **common)
    top_k = -1 if sp.top_k < 1 or sp.top_k >= vocab_size else int(sp.top_k)
    return SamplingParams(
        temperature=float(sp.temperature), top_p=float(sp.top_p), top_k=top_k, min_p=float(sp.min_p), **common
    )


# constrained decoding is served (adapter.tree_grammar); a refused request drops these before SGLang compiles them
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")


def unsupported_feature(req) -> str | None:
    """Why JETSPEC cannot decode this sglang Req losslessly, naming the request field; None if it can."""
    sp = req.sampling_params
    if getattr(sp, "watermark", None):
        return "sampling_params.watermark is not supported by --speculative-algorithm JETSPEC; remove it"
    if getattr(req, "custom_logit_processor", None):
        return "custom_logit_processor is not supported by --speculative-algorithm JETSPEC; remove it"
    if getattr(req, "return_hidden_states", False):
        return (
            "return_hidden_states is not supported by --speculative-algorithm JETSPEC (its forward captures "
            "the draft head's tap layers instead); remove it"
        )
    if getattr(req, "return_sampling_mask", False):
        return (
            "return_sampling_mask is not supported by --speculative-algorithm JETSPEC (its acceptance does not "
            "record the sampler's support); remove it"
        )
    return None


def shadow_blind_spot(req, grammar_checkable: bool = False) -> str | None:
    """What of this sglang Req the shadow checker cannot rebuild (it rescores each output token under
    the target's distribution after temperature, top-k, top-p and min-p, masked by the request's grammar
    when `grammar_checkable`: its record carries the grammar), as a metric label; None when it can
    check the request. Such a request is served exactly but never teed."""
    sp = req.sampling_params
    if sp.frequency_penalty or sp.presence_penalty or sp.repetition_penalty != 1.0:
        return "penalty"
    if sp.logit_bias:
        return "logit_bias"
    if sp.min_new_tokens:
        return "min_new_tokens"
    constrained = getattr(req, "grammar", None) is not None or any(getattr(sp, f, None) for f in GRAMMAR_FIELDS)
    if constrained and not grammar_checkable:
        return "grammar"
    return None


def crashing_input(req, vocab_size: int) -> str | None:
    """Why this sglang Req would crash SGLang 0.5.23's scheduler (the whole server, not just the request),
    naming the field and the fix; None if it is safe. Its own checks let these through: an empty
    prompt, token or stop ids outside the vocabulary, and a top_k or top_logprobs_num no tensor of the
    vocabulary can hold."""
    ids = req.origin_input_ids
    if len(ids) == 0:
        return "text / input_ids: the prompt is empty -- send at least one token"
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        return (
            f"input_ids: token id {bad} is outside the model's vocabulary [0, {vocab_size}) -- send token ids "
            "the model's tokenizer produced"
        )
    stops = [t for t in (req.sampling_params.stop_token_ids or ()) if not 0 <= t < vocab_size]
    if stops:  # min_new_tokens scatters every stop id into a vocabulary-sized row
        return (
            f"sampling_params.stop_token_ids: {stops[0]} is outside the model's vocabulary [0, {vocab_size}) -- "
            "send token ids the model's tokenizer produced"
        )
    top_k = req.sampling_params.top_k
    if top_k != TOP_K_ALL and (top_k != int(top_k) or top_k > vocab_size):
        return (
            f"sampling_params.top_k {top_k} is not a whole number of tokens up to the vocabulary size {vocab_size} "
            "-- send -1 for no top-k, or 1..vocabulary size"
        )
    top_logprobs = getattr(getattr(req, "logprob", None), "top_logprobs_num", 0) or 0  # Req.logprob: a ReqLogprob
    if top_logprobs > vocab_size:
        return (
            f"top_logprobs_num {top_logprobs} is above the vocabulary size {vocab_size} -- ask for at most {vocab_size}"
        )
    return None
