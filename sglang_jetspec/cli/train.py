"""`jetspec train` (distil a draft head), `jetspec draft-vocab` (its reduced draft vocabulary) and
`jetspec draft-corpus` (its draft corpus): the flags.

The runs themselves are sglang_jetspec/train/command.py, train/vocab_command.py and train/corpus_command.py,
imported when a command runs (they load torch); the flags read their defaults from train/config.py.
"""

from __future__ import annotations

from ..train.config import (
    DEFAULT_CORPUS_TOKENS,
    DEFAULT_VOCAB_SIZE,
    FEATURE_MODES,
    LOSSES,
    REGEN_BACKENDS,
    REVEALS,
    RegenerationConfig,
    TrainConfig,
)
from .args import add_target_arguments, run_of


def register(sub) -> None:
    p = sub.add_parser("train", help="train a JetSpec (or DFlash-style) draft head for a target")
    add_target_arguments(p)
    p.set_defaults(head=None)
    p.add_argument("--out", required=True, help="output head directory")
    p.add_argument(
        "--prompts", help="JSONL of prompt/messages lines (default: the built-in --prompt-set, never HumanEval)"
    )
    p.add_argument(
        "--prompt-set",
        default="default",
        help="built-in prompts when --prompts is not given, one set or several comma-separated (each regenerated "
        "into its own data directory, trained on together): default (stdlib completion/chat + instructions, "
        "the shipped head's set) or code-mix (HumanEval-shaped completions from stdlib/numpy/scipy/... docstrings "
        "mixed with chat; train/code_prompts.py; --prompt-count prompts, --code-share of them completions) or chat "
        "(templated general-assistant requests: explanations, tips, emails, poems, recipes, travel, how-to in "
        "several languages; train/chat_prompts.py; --prompt-count prompts)",
    )
    p.add_argument("--prompt-count", type=int, default=4000, help="--prompt-set code-mix / chat: number of prompts")
    p.add_argument(
        "--code-share",
        type=float,
        default=0.7,
        help="--prompt-set code-mix: share of raw code completions (the rest chat)",
    )
    p.add_argument(
        "--prompt-limit",
        type=int,
        help="use only the first N prompts (a pilot on a prefix of the set; a later full run "
        "with the same --data-dir resumes from it)",
    )
    p.add_argument(
        "--data-only",
        action="store_true",
        help="regenerate and featurize every prompt set, write the manifests, and stop "
        "(prepares the data for several later trainings, e.g. side by side on one GPU)",
    )
    p.add_argument(
        "--data-dir",
        help="where regenerated data and features are cached (default: $JETSPEC_CACHE_DIR/data/<target>-<prompts>)",
    )
    p.add_argument("--max-new-tokens", type=int, default=RegenerationConfig.max_new_tokens)
    p.add_argument(
        "--sampled-share",
        type=float,
        default=RegenerationConfig.sampled_share,
        help="share of prompts that also get a sampled response; above 1, a whole number of sampled responses "
        "per prompt",
    )
    p.add_argument("--regen-batch-size", type=int, default=RegenerationConfig.batch_size)
    p.add_argument(
        "--regen-dtype",
        choices=["fp32", "bf16"],
        default=RegenerationConfig.dtype,
        help="target dtype for regeneration and teacher features (bf16: faster batched generation on CPU; the "
        "manifest records it); training itself always reads the fp32 target's embedding and lm_head",
    )
    p.add_argument(
        "--features",
        choices=FEATURE_MODES,
        default=RegenerationConfig.features,
        help="teacher-forced: a second target pass per sequence after regeneration; generation: tapped rows kept "
        "while generating (what the engine computes at inference, no second pass; ties the data dir to the taps)",
    )
    p.add_argument(
        "--regen-backend",
        choices=REGEN_BACKENDS,
        default=RegenerationConfig.backend,
        help="engine: the reference engine's lanes (CPU); hf-generate: transformers generate in padded batches of "
        "--regen-batch-size, then padded teacher-forced feature passes (a GPU: hundreds of sequences per call)",
    )
    p.add_argument("--layers", type=int, default=1, help="head decoder layers")
    p.add_argument(
        "--init-from-target-layers",
        help="comma-separated target layers copied into head layers 0, 1, ... (weights "
        "whose name and shape match; the head's final norm from the target's)",
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--taps", type=int, default=4, help="number of evenly spaced target layers to tap")
    p.add_argument("--tap-layers", help="explicit comma-separated target layers (overrides --taps)")
    p.add_argument(
        "--bidirectional", action="store_true", help="DFlash-style baseline: full attention inside the block"
    )
    p.add_argument(
        "--reveal",
        choices=REVEALS,
        default=TrainConfig.reveal,
        help="prefix: blocks may show the true tokens before their masks, so the head can draft conditioned on a "
        "tree branch (--draft-rounds at decode time); causal heads only; recorded in config.json "
        "dflash_config.draft_reveal",
    )
    p.add_argument(
        "--all-mask-share",
        type=float,
        default=TrainConfig.all_mask_share,
        help="with --reveal prefix: share of blocks with nothing revealed (keeps the marginal first pass as good)",
    )
    p.add_argument("--loss", choices=LOSSES, default=TrainConfig.loss)
    p.add_argument("--kd-temperature", type=float, default=TrainConfig.kd_temperature)
    p.add_argument("--position-decay", type=float, help="weight depth d by exp(-(d-1)/DECAY) (default: uniform)")
    p.add_argument("--steps", type=int, default=TrainConfig.steps)
    p.add_argument("--lr", type=float, default=TrainConfig.lr)
    p.add_argument("--seqs-per-step", type=int, default=TrainConfig.seqs_per_step)
    p.add_argument("--blocks-per-seq", type=int, default=TrainConfig.blocks_per_seq)
    p.add_argument("--warmup-steps", type=int, default=TrainConfig.warmup_steps)
    p.add_argument("--eval-every", type=int, default=TrainConfig.eval_every)
    p.add_argument(
        "--time-budget-min",
        type=float,
        help="fit training into this many minutes: after a few timed steps --steps is lowered to what fits "
        "(the schedule follows the lowered count; the record keeps both)",
    )
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for the head's compute")
    p.add_argument("--save-dtype", choices=["fp32", "bf16"], default="bf16", help="dtype of the saved weights")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint.pt")
    p.add_argument(
        "--init-head",
        help="fine-tune: start from this head directory's weights (same layers, block size and taps; "
        "ignored when --resume finds a checkpoint)",
    )
    p.set_defaults(func=run_of(".train.command"))


def _head_file_parser(sub, name: str, help_text: str, file_name: str):
    """A `jetspec draft-*` command: it writes `file_name` into --head from --data-dir's target outputs."""
    p = sub.add_parser(name, help=help_text)
    p.add_argument("--head", required=True, help=f"head directory to write {file_name} into")
    p.add_argument(
        "--data-dir", required=True, help="a `jetspec train` data directory (its responses.jsonl: target outputs)"
    )
    p.add_argument(
        "--append",
        action="store_true",
        help=f"keep the head's current {file_name} and add --data-dir's outputs to it "
        "(the earlier record is kept under appended_to)",
    )
    return p


def register_draft_vocab(sub) -> None:
    p = _head_file_parser(
        sub,
        "draft-vocab",
        "write a head's reduced draft vocabulary from the target's own regenerated outputs",
        "draft_vocab.safetensors",
    )
    p.add_argument("--size", type=int, default=DEFAULT_VOCAB_SIZE, help="tokens in the draft vocabulary")
    p.set_defaults(func=run_of(".train.vocab_command"))


def register_draft_corpus(sub) -> None:
    p = _head_file_parser(
        sub,
        "draft-corpus",
        "write a head's draft corpus (what the target wrote) for the hybrid drafter's lookups",
        "draft_corpus.safetensors",
    )
    p.add_argument(
        "--max-tokens", type=int, default=DEFAULT_CORPUS_TOKENS, help="most tokens kept in all (4 bytes each on disk)"
    )
    p.set_defaults(func=run_of(".train.corpus_command"))
