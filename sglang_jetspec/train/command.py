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
from ..prompts import read_prompt_file
from .data import MANIFEST, RegenerationConfig, featurize, load_sequences, regenerate, write_manifest
from .objective import LOSSES, REVEALS
from .prompt_sources import default_prompt_records
from .trainer import TrainConfig, Trainer

RECORD = "training_record.json"


def register(sub) -> None:
    from ..cli import add_target_arguments

    p = sub.add_parser("train", help="train a JetSpec (or DFlash-style) draft head for a target")
    add_target_arguments(p)
    p.set_defaults(head=None)
    p.add_argument("--out", required=True, help="output head directory")
    p.add_argument("--prompts", help="JSONL of prompt/messages lines (default: built-in stdlib + instruction prompts, never HumanEval)")
    p.add_argument("--data-dir", help="where regenerated data and features are cached (default: $JETSPEC_CACHE_DIR/data/<target>-<prompts>)")
    p.add_argument("--max-new-tokens", type=int, default=RegenerationConfig.max_new_tokens)
    p.add_argument("--sampled-share", type=float, default=RegenerationConfig.sampled_share, help="share of prompts that also get a sampled response")
    p.add_argument("--regen-batch-size", type=int, default=RegenerationConfig.batch_size)
    p.add_argument("--layers", type=int, default=1, help="head decoder layers")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--taps", type=int, default=4, help="number of evenly spaced target layers to tap")
    p.add_argument("--tap-layers", help="explicit comma-separated target layers (overrides --taps)")
    p.add_argument("--bidirectional", action="store_true", help="DFlash-style baseline: full attention inside the block")
    p.add_argument("--reveal", choices=REVEALS, default=TrainConfig.reveal,
                   help="prefix: blocks may show the true tokens before their masks, so the head can draft conditioned on a "
                        "tree branch (--draft-rounds at decode time); causal heads only; recorded in config.json dflash_config.draft_reveal")
    p.add_argument("--all-mask-share", type=float, default=TrainConfig.all_mask_share,
                   help="with --reveal prefix: share of blocks with nothing revealed (keeps the marginal first pass as good)")
    p.add_argument("--loss", choices=LOSSES, default=TrainConfig.loss)
    p.add_argument("--kd-temperature", type=float, default=TrainConfig.kd_temperature)
    p.add_argument("--position-decay", type=float, help="weight depth d by exp(-(d-1)/DECAY) (default: uniform)")
    p.add_argument("--steps", type=int, default=TrainConfig.steps)
    p.add_argument("--lr", type=float, default=TrainConfig.lr)
    p.add_argument("--seqs-per-step", type=int, default=TrainConfig.seqs_per_step)
    p.add_argument("--blocks-per-seq", type=int, default=TrainConfig.blocks_per_seq)
    p.add_argument("--warmup-steps", type=int, default=TrainConfig.warmup_steps)
    p.add_argument("--eval-every", type=int, default=TrainConfig.eval_every)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for the head's compute")
    p.add_argument("--save-dtype", choices=["fp32", "bf16"], default="bf16", help="dtype of the saved weights")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint.pt")
    p.set_defaults(func=run)


def pick_mask_token_id(tokenizer) -> int:
    """A special token ordinary text never contains: the highest-id added special token that is not bos/eos/pad/unk."""
    reserved = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    specials = [i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special and i not in reserved]
    return max(specials) if specials else tokenizer.eos_token_id


def run(args) -> int:
    from ..loading import load_target, untrained_head_config

    if args.reveal != "none" and args.bidirectional:
        raise SystemExit(f"jetspec train: --reveal {args.reveal} needs a causal head (revealed tokens would leak into earlier "
                         "rows of a bidirectional block); drop --bidirectional or use --reveal none")
    if not 0.0 <= args.all_mask_share <= 1.0:
        raise SystemExit(f"jetspec train: --all-mask-share {args.all_mask_share}: must be within [0, 1]")
    target = load_target(args.target, "fp32", args.device, args.attention)
    if args.prompts:
        records = read_prompt_file(args.prompts)
        label = f"{Path(args.prompts).stem}-{hashlib.sha256(Path(args.prompts).read_bytes()).hexdigest()[:10]}"
    else:
        records, label = default_prompt_records(seed=args.seed), "default"
    data_dir = Path(args.data_dir) if args.data_dir else cache_root() / "data" / f"{target.path.name}-{label}"
    regen = RegenerationConfig(max_new_tokens=args.max_new_tokens, sampled_share=args.sampled_share, batch_size=args.regen_batch_size, seed=args.seed)
    _check_same_regeneration(data_dir, regen)
    regenerate(target, records, data_dir, regen)
    manifest = write_manifest(data_dir, records, regen, target.path)

    head_cfg = untrained_head_config(target, layers=args.layers, block_size=args.block_size, taps=args.taps)
    taps = tuple(int(t) for t in args.tap_layers.split(",")) if args.tap_layers else tuple(default_tap_layers(target.info.num_hidden_layers, args.taps))
    from dataclasses import replace

    reveal = {"scheme": args.reveal, "all_mask_share": args.all_mask_share} if args.reveal != "none" else None
    head_cfg = replace(head_cfg, target_layer_ids=taps, causal_head=not args.bidirectional, mask_token_id=pick_mask_token_id(target.tokenizer),
                       draft_reveal=reveal)
    head_cfg.check_fits(target.info)
    sequences = load_sequences(featurize(target, data_dir, taps))

    train_cfg = TrainConfig(steps=args.steps, lr=args.lr, seqs_per_step=args.seqs_per_step, blocks_per_seq=args.blocks_per_seq, warmup_steps=args.warmup_steps,
                            loss=args.loss, kd_temperature=args.kd_temperature, position_decay=args.position_decay, eval_every=args.eval_every,
                            save_every=args.eval_every, seed=args.seed, bf16=args.bf16, reveal=args.reveal, all_mask_share=args.all_mask_share)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    trainer = Trainer(head_cfg, train_cfg, target.embed_tokens, target.lm_head, sequences, out, target.device)
    if args.resume and trainer.load_checkpoint():
        print(f"resumed from step {trainer.step}")
    history = trainer.run()
    trainer.export(out, torch.bfloat16 if args.save_dtype == "bf16" else torch.float32)
    record = {
        "command": "jetspec " + " ".join(shlex.quote(a) for a in args.argv),
        "target": str(target.path),
        "head_config": head_cfg.to_json_dict(),
        "train_config": asdict(train_cfg),
        "data_dir": str(data_dir),
        "data_manifest": manifest,
        "data_manifest_sha256": sha256_file(data_dir / MANIFEST),
        "train_sequences": len(trainer.train),
        "heldout_sequences": len(trainer.heldout),
        "steps": trainer.step,
        "elapsed_s": getattr(trainer, "elapsed_s", None),
        "machine": f"{platform.machine()} {platform.processor()}, {torch.get_num_threads()} threads, torch {torch.__version__}, {target.device}",
        "final": next((h for h in reversed(history) if "heldout_loss" in h), None),
        "history": [h for h in history if "heldout_loss" in h or h["step"] == 1 or h["step"] % 50 == 0],
        "files_sha256": {p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.name in ("config.json", "model.safetensors")},
    }
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    print(f"head written to {out}: {json.dumps(record['final'])}")
    return 0


def _check_same_regeneration(data_dir: Path, regen: RegenerationConfig) -> None:
    manifest = data_dir / MANIFEST
    if manifest.exists():
        previous = json.loads(manifest.read_text()).get("regeneration")
        if previous and previous != asdict(regen):
            raise SystemExit(f"{data_dir} was generated with {previous}; pass the same --max-new-tokens/--sampled-share/--regen-batch-size/--seed or a new --data-dir")
