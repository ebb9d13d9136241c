"""The training loop: AdamW, warmup + cosine schedule, gradient clipping, resume, held-out evaluation."""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.head import DraftHead
from ..core.head_config import HeadConfig
from ..core.head_io import init_head, save_head
from .data import Sequence
from .objective import block_inputs, distillation_loss, position_weights, target_rows, training_mask

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    seqs_per_step: int = 4
    blocks_per_seq: int = 8
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    loss: str = "forward_kl"
    kd_temperature: float = 1.0
    position_decay: float | None = None
    heldout_share: float = 0.03
    eval_every: int = 250
    save_every: int = 250
    seed: int = 0
    bf16: bool = False


class Trainer:
    def __init__(self, head_cfg: HeadConfig, cfg: TrainConfig, embed_tokens: torch.nn.Module, lm_head: torch.nn.Module, sequences: list[Sequence], out_dir: Path, device: torch.device) -> None:
        self.head_cfg, self.cfg, self.out_dir, self.device = head_cfg, cfg, out_dir, device
        self.embed_tokens, self.lm_head = embed_tokens, lm_head
        for module in (embed_tokens, lm_head):
            module.requires_grad_(False)
        usable = [s for s in sequences if s.ids.numel() - s.prompt_len >= 2]
        random.Random(cfg.seed).shuffle(usable)
        n_heldout = max(1, int(len(usable) * cfg.heldout_share))
        self.heldout, self.train = usable[:n_heldout], usable[n_heldout:]
        self.head: DraftHead = init_head(head_cfg, seed=cfg.seed).to(device).train()
        decay = [p for n, p in self.head.named_parameters() if not n.endswith("norm.weight")]
        no_decay = [p for n, p in self.head.named_parameters() if n.endswith("norm.weight")]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step = 0
        self.history: list[dict] = []
        self.rng = random.Random(cfg.seed + 1)

    def _lr_factor(self, step: int) -> float:
        if step < self.cfg.warmup_steps:
            return (step + 1) / self.cfg.warmup_steps
        progress = (step - self.cfg.warmup_steps) / max(1, self.cfg.steps - self.cfg.warmup_steps)
        return self.cfg.min_lr_ratio + (1 - self.cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def _anchors(self, seq: Sequence, rng: random.Random, count: int) -> torch.Tensor:
        """Distinct anchors in the response: the root is a committed response position (or the prompt's last token)."""
        low, high = seq.prompt_len - 1, seq.ids.numel() - 2
        picks = rng.sample(range(low, high + 1), min(count, high - low + 1))
        return torch.tensor(sorted(picks), device=self.device)

    def sequence_loss(self, seq: Sequence, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Loss of one sequence's blocks; also (draft argmax, labels, depths) of the trained rows."""
        cfg = self.head_cfg
        ids = seq.ids.to(self.device)
        length = ids.numel()
        taps = seq.taps.to(self.device, torch.float32)
        context = self.head.project_context(taps.unsqueeze(0), torch.arange(length, device=self.device).unsqueeze(0))
        block_ids, positions = block_inputs(ids, anchors, cfg.block_size, cfg.mask_token_id)
        mask = training_mask(anchors, cfg.block_size, length, cfg.causal_head)
        hidden = self.head(self.embed_tokens(block_ids).unsqueeze(0).float(), positions.unsqueeze(0), context, mask)[0]
        query, teacher_pos, depths = target_rows(anchors, cfg.block_size, length)
        draft_logits = self.lm_head(hidden[query])
        with torch.no_grad():
            teacher_logits = self.lm_head(seq.final.to(self.device, torch.float32)[teacher_pos])
        labels = ids[teacher_pos + 1]
        loss = distillation_loss(draft_logits, teacher_logits, labels, position_weights(depths, self.cfg.position_decay), self.cfg.loss, self.cfg.kd_temperature)
        return loss, draft_logits.argmax(-1), labels, depths

    def train_step(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for seq in self.rng.sample(self.train, min(self.cfg.seqs_per_step, len(self.train))):
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16):
                loss, *_ = self.sequence_loss(seq, self._anchors(seq, self.rng, self.cfg.blocks_per_seq))
            (loss / self.cfg.seqs_per_step).backward()
            total += loss.item() / self.cfg.seqs_per_step
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return total

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out loss and chain accept length: 1 + leading depths whose draft argmax is the real next token."""
        self.head.eval()
        rng = random.Random(12345)  # the same held-out blocks every evaluation
        losses, accept = [], []
        for seq in self.heldout:
            anchors = self._anchors(seq, rng, self.cfg.blocks_per_seq)
            loss, argmax, labels, depths = self.sequence_loss(seq, anchors)
            losses.append(loss.item())
            hit = (argmax == labels).float()
            # rows are ordered block by block, depth 1.. within each block
            for block in hit.split(torch.bincount((depths == 1).cumsum(0) - 1).tolist()):
                accept.append(1 + int(block.cumprod(0).sum()))
        self.head.train()
        return {"heldout_loss": sum(losses) / len(losses), "heldout_chain_accept_length": sum(accept) / len(accept)}

    def save_checkpoint(self) -> None:
        state = {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "step": self.step, "history": self.history, "rng": self.rng.getstate(), "config": asdict(self.cfg)}
        tmp = self.out_dir / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        tmp.replace(self.out_dir / CHECKPOINT)  # atomic: a crash never leaves a half-written checkpoint

    def load_checkpoint(self) -> bool:
        path = self.out_dir / CHECKPOINT
        if not path.exists():
            return False
        state = torch.load(path, map_location=self.device, weights_only=False)
        if state["config"] != asdict(self.cfg):
            raise ValueError(f"{path}: written with a different training config; start a fresh --out directory or drop --resume")
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.history = state["step"], state["history"]
        self.rng.setstate(state["rng"])
        return True

    def run(self) -> list[dict]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        start = time.time()
        with tqdm(total=self.cfg.steps, initial=self.step, desc="training head", unit="step") as bar:
            while self.step < self.cfg.steps:
                loss = self.train_step()
                entry = {"step": self.step, "loss": loss, "lr": self.scheduler.get_last_lr()[0]}
                if self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps:
                    entry.update(self.evaluate())
                    tqdm.write(json.dumps(entry))
                self.history.append(entry)
                bar.set_postfix(loss=f"{loss:.3f}")
                bar.update(1)
                if self.step % self.cfg.save_every == 0:
                    self.save_checkpoint()
        self.elapsed_s = time.time() - start
        return self.history

    def export(self, head_dir: Path, dtype: torch.dtype) -> Path:
        head = DraftHead(self.head_cfg)
        head.load_state_dict(self.head.state_dict())
        return save_head(head.to(dtype), head_dir)
