"""The training loop: AdamW, warmup + cosine schedule, gradient clipping, resume, held-out evaluation."""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.head import DraftHead
from ..core.head_config import HeadConfig
from ..core.head_io import init_head, save_head
from .config import TrainConfig
from .data import Sequence
from .objective import (
    block_inputs,
    distillation_per_row,
    per_sequence_mean,
    position_weights,
    sample_reveals,
    target_rows,
    training_mask,
)

CHECKPOINT = "checkpoint.pt"
TIMED_STEPS = (5, 25)  # a time-budgeted run times its steps [a, b) (the first ones pay for warm-up: allocator, kernels)
BUDGET_RESERVE = 0.1  # share of the budget kept for evaluations, checkpoints and export


@dataclass(frozen=True)
class TrainedRows:
    """The trained rows of a batch, sequence by sequence, block by block: head output, the target's
    final hidden state of its teacher position, the real next token, distance from the last real
    token, and the row's sequence in the batch."""

    hidden: torch.Tensor
    teacher: torch.Tensor
    labels: torch.Tensor
    distance: torch.Tensor
    sequence: torch.Tensor


def copy_target_layers(head: DraftHead, target_model: torch.nn.Module, layer_ids: tuple[int, ...]) -> list[str]:
    """Copy the weights of target decoder layers `layer_ids` into head layers 0, 1, ... wherever a head
    parameter has a target counterpart of the same name and shape (Llama: norms, q/k/v/o, MLP; Qwen3
    also q_norm/k_norm), and the target's final norm into the head's. The head's fc / hidden_norm
    (and q_norm/k_norm for a Llama target) keep their initialisation. Returns the names copied."""
    layers = target_model.model.layers
    if len(layer_ids) > len(head.layers):
        raise ValueError(f"{len(layer_ids)} target layers for a {len(head.layers)}-layer head")
    copied = []
    with torch.no_grad():
        for i, layer_id in enumerate(layer_ids):
            if not 0 <= layer_id < len(layers):
                raise ValueError(f"target layer {layer_id}: the target has layers 0..{len(layers) - 1}")
            source = layers[layer_id].state_dict()
            for name, param in head.layers[i].named_parameters():
                if name in source and source[name].shape == param.shape:
                    param.copy_(source[name].to(param.dtype))
                    copied.append(f"layers.{i}.{name}")
        final_norm = target_model.model.norm.weight
        if head.norm.weight.shape == final_norm.shape:
            head.norm.weight.copy_(final_norm.to(head.norm.weight.dtype))
            copied.append("norm.weight")
    return copied


class Trainer:
    def __init__(
        self,
        head_cfg: HeadConfig,
        cfg: TrainConfig,
        embed_tokens: torch.nn.Module,
        lm_head: torch.nn.Module,
        sequences: list[Sequence],
        out_dir: Path,
        device: torch.device,
        target_model: torch.nn.Module | None = None,
    ) -> None:
        if cfg.reveal != "none" and not head_cfg.causal_head:
            raise ValueError(
                f"reveal={cfg.reveal!r} needs a causal head: "
                "revealed tokens would leak into earlier rows of a bidirectional block"
            )
        if cfg.reveal != "none" and head_cfg.block_size < 3:
            raise ValueError(
                f"reveal={cfg.reveal!r} needs block_size >= 3 (root, a revealed token, a masked one); "
                f"got {head_cfg.block_size}"
            )
        self.head_cfg, self.cfg, self.out_dir, self.device = head_cfg, cfg, out_dir, device
        self.embed_tokens, self.lm_head = embed_tokens, lm_head
        for module in (embed_tokens, lm_head):
            module.requires_grad_(False)
        usable = [s for s in sequences if s.ids.numel() - s.prompt_len >= 2]
        random.Random(cfg.seed).shuffle(usable)
        n_heldout = max(1, int(len(usable) * cfg.heldout_share))
        self.heldout, self.train = usable[:n_heldout], usable[n_heldout:]
        self.head: DraftHead = init_head(head_cfg, seed=cfg.seed).to(device).train()
        self.copied_from_target: list[str] = []
        if cfg.init_from_target_layers:
            if target_model is None:
                raise ValueError("init_from_target_layers needs the target model")
            self.copied_from_target = copy_target_layers(self.head, target_model, cfg.init_from_target_layers)
        decay = [p for n, p in self.head.named_parameters() if not n.endswith("norm.weight")]
        no_decay = [p for n, p in self.head.named_parameters() if n.endswith("norm.weight")]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
            betas=(0.9, 0.95),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.requested_steps = cfg.steps
        self.step = 0
        self.history: list[dict] = []
        self.rng = random.Random(cfg.seed + 1)

    def _lr_factor(self, step: int) -> float:
        if step < self.cfg.warmup_steps:
            return (step + 1) / self.cfg.warmup_steps
        progress = (step - self.cfg.warmup_steps) / max(1, self.cfg.steps - self.cfg.warmup_steps)
        return self.cfg.min_lr_ratio + (1 - self.cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def _anchors(self, seq: Sequence, rng: random.Random, count: int) -> torch.Tensor:
        """Distinct anchors in the response (on the host): the root is a committed response position
        (or the prompt's last token)."""
        low, high = seq.prompt_len - 1, seq.ids.numel() - 2
        picks = rng.sample(range(low, high + 1), min(count, high - low + 1))
        return torch.tensor(sorted(picks))

    def _batch_rows(
        self, seqs: list[Sequence], anchors: list[torch.Tensor], revealed: list[torch.Tensor | None]
    ) -> TrainedRows:
        """One head pass over several sequences' blocks (sequence i's block j showing `revealed[i][j]` true tokens).

        Sequences are padded to the longest and their blocks to the most; a block's context mask stops at
        its anchor, so no row sees another sequence's padding, and a padding block only sees itself (a row
        with no key at all would make attention NaN). Rows come sequence by sequence, block by block."""
        cfg, device = self.head_cfg, self.device
        size, count = cfg.block_size, len(seqs)
        length, rows = max(s.ids.numel() for s in seqs), max(a.numel() for a in anchors) * cfg.block_size
        block_ids = torch.full((count, rows), cfg.mask_token_id, dtype=torch.long)
        positions = torch.zeros((count, rows), dtype=torch.long)
        mask = torch.zeros((count, rows, length + rows), dtype=torch.bool)
        mask[:, :, length:] = torch.eye(rows, dtype=torch.bool)
        query, teacher_pos, distance, sequence = [], [], [], []
        for i, (seq, seq_anchors, seq_revealed) in enumerate(zip(seqs, anchors, revealed)):
            n, seq_len = seq_anchors.numel() * size, seq.ids.numel()
            block_ids[i, :n], positions[i, :n] = block_inputs(
                seq.ids, seq_anchors, size, cfg.mask_token_id, seq_revealed
            )
            own = training_mask(seq_anchors, size, length, cfg.causal_head)[0, 0]
            mask[i, :n, :length], mask[i, :n, length : length + n] = own[:, :length], own[:, length:]
            q, t, d = target_rows(seq_anchors, size, seq_len, seq_revealed)
            query.append(q + i * rows)
            teacher_pos.append(t)
            distance.append(d)
            sequence.append(torch.full_like(q, i))
        taps = torch.nn.utils.rnn.pad_sequence([s.taps for s in seqs], batch_first=True).to(device, torch.float32)
        context = self.head.project_context(taps, torch.arange(length, device=device).expand(count, length))
        embeds = self.embed_tokens(block_ids.to(device)).float()
        hidden = self.head(embeds, positions.to(device), context, mask.to(device).unsqueeze(1))
        return TrainedRows(
            hidden=hidden.reshape(count * rows, -1)[torch.cat(query).to(device)],
            teacher=torch.cat([s.final[t] for s, t in zip(seqs, teacher_pos)]).to(device, torch.float32),
            labels=torch.cat([s.ids[t + 1] for s, t in zip(seqs, teacher_pos)]).to(device),
            distance=torch.cat(distance).to(device),
            sequence=torch.cat(sequence).to(device),
        )

    def batch_loss(
        self, seqs: list[Sequence], anchors: list[torch.Tensor], revealed: list[torch.Tensor | None] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each sequence's loss [S] (the weighted mean of its rows, as if it were trained alone); also
        (draft argmax, labels, distances from the last real token) of the trained rows."""
        rows = self._batch_rows(seqs, anchors, revealed or [None] * len(seqs))
        draft_logits = self.lm_head(rows.hidden)
        with torch.no_grad():
            teacher_logits = self.lm_head(rows.teacher)
        per_row = distillation_per_row(
            draft_logits, teacher_logits, rows.labels, self.cfg.loss, self.cfg.kd_temperature
        )
        losses = per_sequence_mean(
            per_row, position_weights(rows.distance, self.cfg.position_decay), rows.sequence, len(seqs)
        )
        return losses, draft_logits.argmax(-1), rows.labels, rows.distance

    def train_step(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        seqs = self.rng.sample(self.train, min(self.cfg.seqs_per_step, len(self.train)))
        anchors, revealed = [], []
        for seq in seqs:  # anchors, then reveals, sequence by sequence: one rng stream whatever the batching
            anchors.append(self._anchors(seq, self.rng, self.cfg.blocks_per_seq))
            if self.cfg.reveal == "prefix":
                revealed.append(
                    sample_reveals(
                        self.rng, anchors[-1], self.head_cfg.block_size, seq.ids.numel(), self.cfg.all_mask_share
                    )
                )
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16):
            losses, *_ = self.batch_loss(seqs, anchors, revealed or None)
        loss = losses.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return loss.item()

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out loss and chain accept length: 1 + leading depths whose draft argmax is the real next token.

        With prefix reveal, also the conditioned chain accept length: the same, but depth d is drafted
        with the true tokens of depths 1..d-1 revealed (what a tree-causal round sees on the right branch).
        """
        self.head.eval()
        rng = random.Random(12345)  # the same held-out blocks every evaluation
        losses, accept, conditioned = [], [], []
        for start in range(0, len(self.heldout), self.cfg.seqs_per_step):
            seqs = self.heldout[start : start + self.cfg.seqs_per_step]
            anchors = [self._anchors(seq, rng, self.cfg.blocks_per_seq) for seq in seqs]
            seq_losses, argmax, labels, depths = self.batch_loss(seqs, anchors)
            losses += seq_losses.tolist()
            hit = (argmax == labels).float()
            # rows are ordered sequence by sequence, block by block, depth 1.. within each block
            for block in hit.split(torch.bincount((depths == 1).cumsum(0) - 1).tolist()):
                accept.append(1 + int(block.cumprod(0).sum()))
            if self.cfg.reveal == "prefix":
                for seq, seq_anchors in zip(seqs, anchors):
                    conditioned += self._conditioned_chain_accepts(seq, seq_anchors)
        self.head.train()
        metrics = {"heldout_loss": sum(losses) / len(losses), "heldout_chain_accept_length": sum(accept) / len(accept)}
        if conditioned:
            metrics["heldout_conditioned_chain_accept_length"] = sum(conditioned) / len(conditioned)
        return metrics

    def _conditioned_chain_accepts(self, seq: Sequence, anchors: torch.Tensor) -> list[int]:
        """Per block, 1 + leading depths d whose argmax with depths 1..d-1 revealed is the real token.

        One head pass: every anchor repeated once per k = 0..B-2 (blocks never see each other), and
        only each block's first masked row pays for the lm_head."""
        steps = self.head_cfg.block_size - 1
        anchors = anchors.repeat_interleave(steps)
        shown = torch.arange(steps).repeat(anchors.numel() // steps)
        room = seq.ids.numel() - 2 - anchors  # the most tokens a block can reveal and still predict one
        rows = self._batch_rows([seq], [anchors], [torch.minimum(shown, room)])
        first = rows.distance == 1  # the first masked row: exactly one per block, in block order
        hits = (self.lm_head(rows.hidden[first]).argmax(-1) == rows.labels[first]).cpu() & (shown <= room)
        return (1 + hits.view(-1, steps).int().cumprod(1).sum(1)).tolist()

    def save_checkpoint(self) -> None:
        state = {
            "head": self.head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "history": self.history,
            "rng": self.rng.getstate(),
            "config": asdict(replace(self.cfg, steps=self.requested_steps)),
            "planned_steps": self.cfg.steps,
        }
        tmp = self.out_dir / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        tmp.replace(self.out_dir / CHECKPOINT)  # atomic: a crash never leaves a half-written checkpoint

    def load_checkpoint(self) -> bool:
        path = self.out_dir / CHECKPOINT
        if not path.exists():
            return False
        state = torch.load(path, map_location=self.device, weights_only=False)
        # keys a checkpoint predates (e.g. reveal) had their default value when it was written
        if {**asdict(TrainConfig()), **state["config"]} != asdict(self.cfg):
            raise ValueError(
                f"{path}: written with a different training config; start a fresh --out directory or drop --resume"
            )
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.history = state["step"], state["history"]
        self.cfg = replace(self.cfg, steps=state.get("planned_steps", self.cfg.steps))  # a time budget's count stays
        self.rng.setstate(state["rng"])
        return True

    def fit_steps_to_budget(self, elapsed_s: float, timed_s: float, timed_steps: int) -> None:
        """Lower `steps` to what the time budget still allows at the measured rate (never raise it);
        the cosine schedule then runs over the new count."""
        per_step = timed_s / timed_steps
        remaining = self.cfg.time_budget_s * (1 - BUDGET_RESERVE) - elapsed_s
        fits = self.step + max(0, int(remaining / per_step))
        if fits < self.cfg.steps:
            self.cfg = replace(self.cfg, steps=max(self.step + 1, fits))
            tqdm.write(
                f"time budget {self.cfg.time_budget_s / 60:.1f} min at {per_step * 1000:.0f} ms/step: "
                f"{self.cfg.steps} steps "
                f"(asked for {self.requested_steps})"
            )

    def run(self) -> list[dict]:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        start = time.time()
        timed_from, first_step = None, self.step  # a resumed run times its own first steps against its own budget
        with tqdm(total=self.cfg.steps, initial=self.step, desc="training head", unit="step") as bar:
            while self.step < self.cfg.steps:
                if self.cfg.time_budget_s and self.step - first_step in TIMED_STEPS:
                    if self.step - first_step == TIMED_STEPS[0]:
                        timed_from = time.time()
                    else:
                        self.fit_steps_to_budget(
                            time.time() - start, time.time() - timed_from, TIMED_STEPS[1] - TIMED_STEPS[0]
                        )
                        bar.total = self.cfg.steps
                loss = self.train_step()
                entry = {"step": self.step, "loss": loss, "lr": self.scheduler.get_last_lr()[0]}
                if self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps:
                    entry.update(self.evaluate())
                    tqdm.write(json.dumps(entry))
                self.history.append(entry)
                bar.set_postfix(loss=f"{loss:.3f}")
                bar.update(1)
                if self.step % self.cfg.save_every == 0 or self.step == self.cfg.steps:
                    self.save_checkpoint()  # the last one too: a finished run resumes as finished
        self.elapsed_s = time.time() - start
        return self.history

    def export(self, head_dir: Path, dtype: torch.dtype) -> Path:
        head = DraftHead(self.head_cfg)
        head.load_state_dict(self.head.state_dict())
        return save_head(head.to(dtype), head_dir)
