"""`jetspec train`: regenerate data with the target, extract teacher features, distil a head.

Every stage is cached and resumable; the output directory holds the head (config.json +
model.safetensors, the published layout) and training_record.json (configs, data manifest and its
hash, losses, held-out metrics, the exact command).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shlex
from dataclasses import asdict
from pathlib import Path

import torch

from ..core.head_config import default_tap_layers
from ..models.fetch import cache_root, sha256_file
from ..reference.prompts import read_prompt_file
from .batched_data import featurize_batched, regenerate_batched
from .data import (
    MANIFEST,
    RegenerationConfig,
    featurize,
    load_sequences,
    regenerate,
    regenerate_with_features,
    same_regeneration,
    write_manifest,
)
from .prompt_sources import default_prompt_records
from .trainer import TrainConfig, Trainer

RECORD = "training_record.json"
PROMPT_SETS = ("default", "code-mix", "chat")


def pick_mask_token_id(tokenizer) -> int:
    """A special token ordinary text never contains: the highest-id added special token that is not bos/eos/pad/unk."""
    reserved = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    specials = [i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special and i not in reserved]
    return max(specials) if specials else tokenizer.eos_token_id


def run(args) -> int:
    from ..reference.loading import load_target, untrained_head_config

    if args.reveal != "none" and args.bidirectional:
        raise SystemExit(
            f"jetspec train: --reveal {args.reveal} needs a causal head (revealed tokens would leak into earlier "
            "rows of a bidirectional block); drop --bidirectional or use --reveal none"
        )
    if not 0.0 <= args.all_mask_share <= 1.0:
        raise SystemExit(f"jetspec train: --all-mask-share {args.all_mask_share}: must be within [0, 1]")
    init_layers = tuple(int(t) for t in args.init_from_target_layers.split(",")) if args.init_from_target_layers else ()
    if len(init_layers) > args.layers:
        raise SystemExit(
            f"jetspec train: --init-from-target-layers names {len(init_layers)} layers for a {args.layers}-layer head"
        )
    sources = prompt_records(args)
    if args.data_dir and len(sources) > 1:
        raise SystemExit(
            f"jetspec train: --data-dir names one directory for {len(sources)} prompt sets; "
            "drop it (each set gets its own directory under the cache) or train on one set"
        )
    target = load_target(args.target, args.regen_dtype, args.device, args.attention)
    head_cfg = untrained_head_config(target, layers=args.layers, block_size=args.block_size, taps=args.taps)
    taps = (
        tuple(int(t) for t in args.tap_layers.split(","))
        if args.tap_layers
        else tuple(default_tap_layers(target.info.num_hidden_layers, args.taps))
    )
    try:
        regen = RegenerationConfig(
            max_new_tokens=args.max_new_tokens,
            sampled_share=args.sampled_share,
            batch_size=args.regen_batch_size,
            seed=args.seed,
            dtype=args.regen_dtype,
            features=args.features,
            tap_layers=taps if args.features == "generation" else (),
            backend=args.regen_backend,
        )
    except ValueError as err:
        raise SystemExit(f"jetspec train: {err} (flags --regen-backend, --features, --sampled-share)") from None
    data, sequences = [], []
    for records, label in sources:
        data_dir = Path(args.data_dir) if args.data_dir else default_data_dir(target.path, label, regen)
        _check_same_regeneration(data_dir, regen)
        if regen.backend == "hf-generate":
            regenerate_batched(target, records, data_dir, regen)
            feature_dir = featurize_batched(target, data_dir, taps, batch_size=max(1, regen.batch_size // 4))
        elif regen.features == "generation":
            feature_dir = regenerate_with_features(target, records, data_dir, regen)
        else:
            regenerate(target, records, data_dir, regen)
            feature_dir = featurize(target, data_dir, taps)
        manifest = write_manifest(data_dir, records, regen, target.path, feature_dir)
        print(
            f"data: {data_dir} ({manifest['responses']} responses, {manifest['response_tokens']} response tokens)",
            flush=True,
        )
        if not args.data_only:
            sequences += load_sequences(feature_dir)
        data.append(
            {
                "data_dir": str(data_dir),
                "data_manifest": manifest,
                "data_manifest_sha256": sha256_file(data_dir / MANIFEST),
            }
        )
    if args.data_only:
        return 0
    if target.dtype != torch.float32:  # distillation reads the fp32 embedding / lm_head (and target layers)
        del target
        target = load_target(args.target, "fp32", args.device, args.attention)
    from dataclasses import replace

    reveal = {"scheme": args.reveal, "all_mask_share": args.all_mask_share} if args.reveal != "none" else None
    head_cfg = replace(
        head_cfg,
        target_layer_ids=taps,
        causal_head=not args.bidirectional,
        mask_token_id=pick_mask_token_id(target.tokenizer),
        draft_reveal=reveal,
    )
    head_cfg.check_fits(target.info)

    train_cfg = TrainConfig(
        steps=args.steps,
        lr=args.lr,
        seqs_per_step=args.seqs_per_step,
        blocks_per_seq=args.blocks_per_seq,
        warmup_steps=args.warmup_steps,
        loss=args.loss,
        kd_temperature=args.kd_temperature,
        position_decay=args.position_decay,
        eval_every=args.eval_every,
        save_every=args.eval_every,
        seed=args.seed,
        bf16=args.bf16,
        reveal=args.reveal,
        all_mask_share=args.all_mask_share,
        init_from_target_layers=init_layers,
        time_budget_s=args.time_budget_min * 60 if args.time_budget_min else None,
    )
    torch.manual_seed(args.seed)
    out = Path(args.out)
    trainer = Trainer(
        head_cfg,
        train_cfg,
        target.embed_tokens,
        target.lm_head,
        sequences,
        out,
        target.device,
        target_model=target.model,
    )
    if args.resume and trainer.load_checkpoint():
        print(f"resumed from step {trainer.step}")
    elif args.init_head:
        start_from_head(trainer, Path(args.init_head), target.info)
    history = trainer.run()
    trainer.export(out, torch.bfloat16 if args.save_dtype == "bf16" else torch.float32)
    record = {
        "command": "jetspec " + " ".join(shlex.quote(a) for a in args.argv),
        "target": str(target.path),
        "head_config": head_cfg.to_json_dict(),
        "train_config": asdict(trainer.cfg),  # steps: as run (a time budget may lower them)
        "requested_steps": trainer.requested_steps,
        **data[0],
        "more_data": data[1:],  # further prompt sets, each with its own data directory
        "teacher_features": data[0]["data_manifest"].get("features"),
        "init_head": {"dir": args.init_head, "model_sha256": sha256_file(Path(args.init_head) / "model.safetensors")}
        if args.init_head
        else None,
        "init_from_target": {"layers": list(init_layers), "copied": len(trainer.copied_from_target)}
        if init_layers
        else None,
        "train_sequences": len(trainer.train),
        "heldout_sequences": len(trainer.heldout),
        "steps": trainer.step,
        "elapsed_s": getattr(trainer, "elapsed_s", None),
        "machine": f"{platform.machine()} {platform.processor()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, {target.device}",
        "final": next((h for h in reversed(history) if "heldout_loss" in h), None),
        "history": [h for h in history if "heldout_loss" in h or h["step"] == 1 or h["step"] % 50 == 0],
        "files_sha256": {
            p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.name in ("config.json", "model.safetensors")
        },
    }
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    print(f"head written to {out}: {json.dumps(record['final'])}")
    return 0


def _check_same_regeneration(data_dir: Path, regen: RegenerationConfig) -> None:
    manifest = data_dir / MANIFEST
    if manifest.exists():
        previous = json.loads(manifest.read_text()).get("regeneration")
        if previous and not same_regeneration(previous, regen):
            raise SystemExit(
                f"{data_dir} was generated with {previous}; "
                "pass the same --max-new-tokens/--sampled-share/--regen-batch-size/--regen-dtype/--features/--seed "
                "(and taps, for --features generation) or a new --data-dir"
            )


def start_from_head(trainer: Trainer, head_dir: Path, target_info) -> None:
    """Fine-tune: the trainer's head starts from `head_dir`'s weights, whose config must be the one being trained."""
    from ..core.head_io import load_head

    loaded = load_head(head_dir, target_info)
    theirs, ours = loaded.config.to_json_dict(), trainer.head_cfg.to_json_dict()
    differ = sorted(k for k in {**theirs, **ours} if theirs.get(k) != ours.get(k))
    if differ:
        raise SystemExit(
            f"jetspec train: --init-head {head_dir}: its {', '.join(differ)} differ from the head being trained "
            f"({', '.join(f'{k}={theirs.get(k)!r} vs {ours.get(k)!r}' for k in differ)}); pass the matching "
            "--layers/--block-size/--tap-layers or train from scratch"
        )
    trainer.head.load_state_dict({k: v.to(torch.float32) for k, v in loaded.state_dict().items()})


def prompt_records(args) -> list[tuple[list[dict], str]]:
    """The training prompts, per source: (records, a label naming them for the default data directory).
    One source for --prompts; one per name of a comma-separated --prompt-set."""
    if args.prompts:
        records = read_prompt_file(args.prompts)
        label = f"{Path(args.prompts).stem}-{hashlib.sha256(Path(args.prompts).read_bytes()).hexdigest()[:10]}"
        return [(_limited(records, args), label)]
    names = args.prompt_set.split(",")
    unknown = [n for n in names if n not in PROMPT_SETS]
    if unknown or len(set(names)) != len(names):
        raise SystemExit(
            f"jetspec train: --prompt-set {args.prompt_set}: name each of {', '.join(PROMPT_SETS)} at most once"
        )
    return [_prompt_set(name, args) for name in names]


def _limited(records: list[dict], args) -> list[dict]:
    # the label stays: a prefix run shares the full run's data directory
    return records[: args.prompt_limit] if args.prompt_limit is not None else records


def _prompt_set(name: str, args) -> tuple[list[dict], str]:
    if name == "code-mix":
        from .code_prompts import code_mix_prompt_records

        records = code_mix_prompt_records(seed=args.seed, total=args.prompt_count, code_share=args.code_share)
        label = f"code-mix-{hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()[:10]}"
    elif name == "chat":
        from .chat_prompts import chat_prompt_records

        records = chat_prompt_records(seed=args.seed, total=args.prompt_count)
        label = f"chat-{hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()[:10]}"
    else:
        records, label = default_prompt_records(seed=args.seed), "default"
    return _limited(records, args), label


def default_data_dir(target_dir: Path, label: str, regen: RegenerationConfig) -> Path:
    """$JETSPEC_CACHE_DIR/data/<target>-<prompts>[-<regeneration digest>]: the digest (absent for the default
    configuration, whose directory predates it) keeps different regeneration configs apart."""
    suffix = "" if regen.as_json() == RegenerationConfig().as_json() else f"-{regen.digest()}"
    return cache_root() / "data" / f"{target_dir.name}-{label}{suffix}"
