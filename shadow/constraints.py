"""A constrained record's grammar, applied to the reference's logits before the checks.

SGLang masks a constrained request's logits to what its grammar allows next, before temperature and
the top-k / top-p / min-p filters, at every output position (prefill's first token included). The
record carries the grammar as SGLang's xgrammar backend compiled it (sglang_jetspec.spool.record.
RecordConstraint: dispatch type, key string, JSON whitespace options, the compiled grammar's stop
tokens), so the checker rebuilds the same masks with the same backend class and tokenizer, walking
the grammar over the emitted tokens: row i is masked by the matcher's state after tokens 0..i-1.
Then a greedy token is checked against the masked argmax and a sampled one against the masked
distribution, exactly what SGLang sampled from. A token the grammar refuses is left masked out (its
row flags it: a greedy error of infinite margin, or an impossible sampled token); later rows cannot
be rebuilt and stay unmasked. SGLang is imported only when a constrained record arrives.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sglang_jetspec.spool.record import RecordConstraint, ShadowRecord
from shadow.target_logits import ReferenceError


class ConstraintMasks:
    """Masks constrained records' logits with grammars compiled for the tokenizer at `tokenizer_dir`
    (a callable returning the directory: resolved, and the tokenizer loaded, on first use)."""

    def __init__(self, tokenizer_dir) -> None:
        self._tokenizer_dir = tokenizer_dir
        self._tokenizer = None
        self._backends: dict[tuple, object] = {}

    def apply(self, record: ShadowRecord, logits: torch.Tensor) -> None:
        """Mask `logits` [len(output_ids), V] in place by the record's grammar (free text: unchanged)."""
        if record.constraint is None or not record.output_ids:
            return
        grammar = self._grammar(record.constraint, logits.shape[-1], record.request_id)
        bitmask = grammar.allocate_vocab_mask(logits.shape[-1], 1, "cpu")
        for i, token in enumerate(record.output_ids):
            if grammar.is_terminated():
                return  # SGLang ends the request here; nothing after it was sampled under this grammar
            grammar.fill_vocab_mask(bitmask, 0)
            grammar.apply_vocab_mask(logits[i : i + 1], bitmask)
            try:
                grammar.accept_token(token)
            except ValueError:
                return  # refused: row i shows it; the grammar's later states cannot be rebuilt

    def _grammar(self, constraint: RecordConstraint, vocab_size: int, request_id: str):
        from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject  # importable: _backend checked

        backend = self._backend(constraint, vocab_size)
        grammar = getattr(backend, f"dispatch_{constraint.kind}")(constraint.value)
        if isinstance(grammar, InvalidGrammarObject):
            raise ReferenceError(
                f"request {request_id}: its {constraint.kind} grammar does not compile here "
                f"({grammar!r}) -- was it served with another tokenizer?"
            )
        return grammar

    def _backend(self, constraint: RecordConstraint, vocab_size: int):
        key = (vocab_size, constraint.any_whitespace, constraint.max_whitespace_cnt, tuple(constraint.stop_token_ids))
        if key not in self._backends:
            try:
                from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
            except ImportError:
                raise ReferenceError(
                    "constrained records need SGLang's xgrammar backend to rebuild their grammars: "
                    "run the checker where sglang is installed"
                ) from None
            self._backends[key] = XGrammarGrammarBackend(
                self._load_tokenizer(),
                vocab_size=vocab_size,
                model_eos_token_ids=list(constraint.stop_token_ids),
                any_whitespace=constraint.any_whitespace,
                max_whitespace_cnt=constraint.max_whitespace_cnt,
            )
        return self._backends[key]

    def _load_tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                path = Path(self._tokenizer_dir())
                self._tokenizer = AutoTokenizer.from_pretrained(path)
            except (OSError, SystemExit) as exc:  # resolve_target_dir exits on a bad --target
                raise ReferenceError(
                    f"tokenizer: {exc} -- constrained records need the served model's tokenizer (--tokenizer DIR)"
                ) from None
        return self._tokenizer
