"""Server-argument checks and defaults for --speculative-algorithm JETSPEC.

SGLang calls `validate_server_args` and then the spec class's `handle_server_args` during argument
resolution, each with a recorder whose reads are the resolved values and whose writes become
declared resolutions. Every problem found is reported at once, each naming the flag and the fix.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from policies import PolicyError, read_head_capacity
from sglang_jetspec.adapter.attention_backends import backend_problems
from sglang_jetspec.adapter.policy import POLICY_ENV, load_runtime_policy, max_budget, policy_path
from sglang_jetspec.core.head_config import HeadConfigError, TargetInfo
from sglang_jetspec.core.verify_widths import DEFAULT_LADDER, WIDTHS_ENV, VerifyWidths, VerifyWidthsError

log = logging.getLogger(__name__)


class JetSpecArgsError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("--speculative-algorithm JETSPEC cannot start:\n" + "\n".join(f"  - {p}" for p in problems))


def target_info(model_path: str, trust_remote_code: bool = False) -> TargetInfo:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code).get_text_config()
    return TargetInfo(
        hidden_size=config.hidden_size, vocab_size=config.vocab_size, num_hidden_layers=config.num_hidden_layers
    )


def _head_problems(cfg) -> list[str]:
    draft = cfg.speculative_draft_model_path
    if draft is None:
        return [
            "--speculative-draft-model-path is missing: pass the directory of a JetSpec/DFlash draft head "
            "(config.json + model.safetensors), e.g. sglang_jetspec/heads/smollm2-135m-instruct"
        ]
    if not Path(draft).is_dir():
        return [f"--speculative-draft-model-path {draft}: not a local directory; pass a downloaded head directory"]
    from sglang_jetspec.core.head_io import read_head_config  # imports the head module: only when validating

    problems = []
    try:
        head = read_head_config(draft)
        head.check_fits(target_info(cfg.model_path, cfg.trust_remote_code))
    except HeadConfigError as exc:
        problems.append(f"--speculative-draft-model-path {draft}: {exc}")
    try:
        load_runtime_policy(draft)
    except (PolicyError, ValueError) as exc:
        where = f"{POLICY_ENV}={policy_path()}"
        problems.append(f"{where}: the speculation policy is invalid:\n      " + str(exc).replace("\n", "\n      "))
    return problems


def verify_graphs_on(cfg) -> bool:
    """Whether the target's verify runs under decode CUDA graphs: SGLang's default on CUDA, off with
    --disable-decode-cuda-graph (or --disable-cuda-graph)."""
    return str(cfg.device) == "cuda" and cfg.cuda_graph_config.decode.backend != "disabled"


def configured_verify_widths(reserved: int, graphs: bool) -> VerifyWidths:
    """The verify widths JETSPEC_VERIFY_WIDTHS names, capped by the `reserved` width. Unset: the default
    ladder where the verify runs under graphs (a graph serves one width), no padding where it runs eager."""
    text = os.environ.get(WIDTHS_ENV)
    if (text is None or not text.strip()) and graphs:
        return VerifyWidths.ladder(DEFAULT_LADDER, reserved)
    return VerifyWidths.parse(text, reserved)


def _runtime_problems(cfg) -> list[str]:
    from sglang.srt.runtime_context import attn_dp_enabled_of

    problems = backend_problems(cfg)
    try:
        configured_verify_widths(reserved=1 << 16, graphs=False)  # the syntax; the cap comes with the resolved shape
    except VerifyWidthsError as exc:
        problems.append(str(exc))
    if cfg.speculative_use_rejection_sampling:
        problems.append(
            "--speculative-use-rejection-sampling: JETSPEC accepts with its own lossless rules for each "
            "request's sampling parameters; remove the flag"
        )
    if cfg.speculative_use_block_verification:
        problems.append("--speculative-use-block-verification is not supported by JETSPEC; remove the flag")
    if cfg.pp_size > 1:
        problems.append(f"--pp-size {cfg.pp_size}: pipeline parallelism is not supported by JETSPEC; use --pp-size 1")
    if attn_dp_enabled_of(cfg):
        problems.append(
            f"attention data parallelism (--attn-dp-size {cfg.attn_dp_size}, or the deprecated "
            "--enable-dp-attention) is not supported by JETSPEC; remove the flag"
        )
    if cfg.enable_mixed_chunk:
        problems.append(
            "--enable-mixed-chunk is not supported by JETSPEC (prefill and verify cannot share a batch); "
            "remove the flag"
        )
    if not cfg.disable_overlap_schedule:
        problems.append(
            "the overlap scheduler is on: JETSPEC runs synchronously (its tree and acceptance need the "
            "previous step's tokens on the host); pass --disable-overlap-schedule"
        )
    if cfg.cuda_graph_config.decode.backend != "disabled" and str(cfg.device) != "cuda":
        problems.append(
            f"decode graphs are on with --device {cfg.device}: SGLang's graphs there do not run a tree "
            "verify; pass --disable-cuda-graph"
        )
    if cfg.page_size != 1:
        problems.append(
            f"--page-size {cfg.page_size}: JETSPEC compacts accepted tree nodes slot by slot and keeps the "
            "head's context per slot; use --page-size 1"
        )
    # The radix cache works: the head's context lives per KV slot (adapter.context_pool_memory). KV that
    # reaches a slot without passing a forward of this worker would come without it:
    if cfg.enable_hierarchical_cache:
        problems.append(
            "--enable-hierarchical-cache: KV loaded back from host memory or storage arrives without the "
            "head's context, which lives only beside the device KV pool; remove the flag"
        )
    if cfg.enable_lmcache:
        problems.append("--enable-lmcache: KV loaded from LMCache arrives without the head's context; remove the flag")
    if cfg.disaggregation_mode != "null":
        problems.append(
            f"--disaggregation-mode {cfg.disaggregation_mode}: a decode server would receive requests "
            "without the tap rows the head drafts from; run JETSPEC without PD disaggregation"
        )
    if cfg.grammar_backend == "outlines":
        problems.append(
            "--grammar-backend outlines: JETSPEC masks each draft tree node by walking the request's grammar "
            "forward and back, and outlines' grammar objects cannot roll back; use --grammar-backend "
            "xgrammar (the default) or llguidance"
        )
    if cfg.speculative_eagle_topk not in (None, 1):
        problems.append(
            f"--speculative-eagle-topk {cfg.speculative_eagle_topk}: JETSPEC's tree width comes from the "
            "head (tree_width in its config.json, default 8); remove the flag"
        )
    return problems


def validate_server_args(cfg) -> None:
    """SGLang's `validate_server_args` callback; raises JetSpecArgsError listing every problem."""
    problems = _head_problems(cfg) + _runtime_problems(cfg)
    if problems:
        raise JetSpecArgsError(problems)


def resolve_speculative_shape(cfg) -> tuple[int, int, int]:
    """(num_steps, topk, num_draft_tokens) SGLang sizes KV and buffers by: depth = the head's drafted
    depths, topk 1 (the tree lives in the verify mask), draft tokens = the policy's largest budget."""
    draft = cfg.speculative_draft_model_path
    depth = read_head_capacity(draft).block_size - 1
    widest = max_budget(load_runtime_policy(draft))
    requested = cfg.speculative_num_draft_tokens
    if requested is not None and requested < widest:
        raise JetSpecArgsError(
            [
                f"--speculative-num-draft-tokens {requested} is below the policy's largest budget "
                f"{widest} ({POLICY_ENV}={policy_path()}); remove the flag or raise it to {widest}"
            ]
        )
    return depth, 1, requested or widest
