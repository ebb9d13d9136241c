"""A suffix store: what followed the context's longest recurring suffix in a body of token sequences.

Prompt lookup searches the request's own tokens. The same search over text the target itself wrote
earlier (its regenerated training outputs, shipped in the head directory as `draft_corpus.safetensors`,
and the outputs of requests this engine already finished) finds the boilerplate a target repeats
across requests: `for i in range(len(`, `return result`, docstring phrasing. The idea is REST's
datastore and SuffixDecoding's global tree; here it is one more source of guesses for the hybrid
drafter's tree (core/prompt_lookup.py), so like every draft it only proposes: losslessness is untouched.

Index: for each n-gram length 1..max_ngram, a sorted array of 64-bit n-gram keys and the position
that followed each occurrence. A query hashes the context's last n tokens (longest n first), takes
the most recent occurrences (at most `max_occurrences`), and counts the continuations as a trie: a
path's share of the occurrences is the chance that the corpus continues that way.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from .head_io import read_head_file_tensor

DRAFT_CORPUS_FILE = "draft_corpus.safetensors"
RECENT_OUTPUT_TOKENS = 200_000  # newest finished outputs an engine keeps looking up (about 13 MB of index)
MAX_OCCURRENCES = 64  # most recent occurrences of a suffix whose continuations a lookup counts
_SEPARATOR = -1  # between sequences: no continuation crosses it
_MULTIPLIER = np.int64(0x9E3779B97F4A7C15 - (1 << 64))  # odd 64-bit constant; int64 arithmetic wraps


class DraftCorpusError(ValueError):
    """A draft corpus that cannot serve this target; the message names the file and the fix."""


class SuffixStore:
    """Token sequences indexed by their n-grams (n = 1..max_ngram), appendable."""

    def __init__(
        self, max_ngram: int = 4, max_occurrences: int = MAX_OCCURRENCES, max_tokens: int | None = None
    ) -> None:
        if max_ngram < 1 or max_occurrences < 1 or (max_tokens is not None and max_tokens < 1):
            raise ValueError(
                f"max_ngram={max_ngram}, max_occurrences={max_occurrences}, max_tokens={max_tokens}: each must be >= 1"
            )
        # max_tokens bounds a store that learns while serving: past it, the oldest sequences go first
        self.max_ngram, self.max_occurrences, self.max_tokens = max_ngram, max_occurrences, max_tokens
        self._chunks: list[np.ndarray] = []
        self._pending = 0  # tokens in _chunks, not yet indexed
        self._tokens = np.zeros(0, dtype=np.int64)
        self._index: list[tuple[np.ndarray, np.ndarray]] = []  # per n: (sorted keys, positions after the n-gram)
        self._stale = False

    @property
    def num_tokens(self) -> int:
        """Tokens held, separators excluded."""
        self._refresh()
        return int((self._tokens != _SEPARATOR).sum())

    def add(self, tokens) -> None:
        """Append one sequence (indexed lazily, at the next query); -1 inside it separates sequences."""
        if len(tokens):
            self._chunks.append(np.asarray(tokens, dtype=np.int64))
            self._pending += len(tokens)
            self._stale = True
            # a store that is fed but rarely queried (an engine without the hybrid drafter) stays bounded too
            if self.max_tokens is not None and self._pending > self.max_tokens:
                self._refresh()

    def _refresh(self) -> None:
        """Index what was added since the last refresh. Only the new sequences' n-grams are hashed and
        sorted; they merge into the sorted index in one linear pass, and evicted sequences leave it by
        one filter: a full store (RECENT_OUTPUT_TOKENS) refreshes in a few milliseconds where re-sorting
        all of it took about 80 ms, which a serving engine pays at every step after a request finished
        (`python -m bench.suffix_store_refresh`)."""
        if not self._stale:
            return
        sep = np.array([_SEPARATOR], dtype=np.int64)
        old_len = len(self._tokens)
        tokens = np.concatenate([self._tokens] + [part for chunk in self._chunks for part in (chunk, sep)])
        cut = 0  # tokens evicted from the front
        if self.max_tokens is not None and len(tokens) > self.max_tokens:
            # down to 7/8 of the bound: the eviction's pass over the index comes once in many refreshes
            keep = self.max_tokens - self.max_tokens // 8
            separators = np.nonzero(tokens[: len(tokens) - keep] == _SEPARATOR)[0]
            cut = int(separators[-1] + 1 if separators.size else len(tokens) - keep)
        old_index = self._index or [None] * self.max_ngram
        self._tokens, self._chunks, self._pending, self._stale = tokens[cut:], [], 0, False
        self._index = [_merged_index(old_index[n - 1], n, old_len, cut, tokens) for n in range(1, self.max_ngram + 1)]

    def continuations(self, context: list[int], depth: int) -> tuple[dict[tuple[int, ...], int], int]:
        """Counts of every continuation path (up to `depth` tokens) after the most recent occurrences of
        the longest suffix of `context` (n <= max_ngram) that recurs with something after it, and the
        number of occurrences counted; ({}, 0) when even its last token never recurs."""
        self._refresh()
        if depth < 1 or not context or not self._index:  # nothing asked, or nothing held yet
            return {}, 0
        tokens = self._tokens
        for n in range(min(self.max_ngram, len(context)), 0, -1):
            suffix = np.asarray(context[-n:], dtype=np.int64)
            keys, after = self._index[n - 1]
            key = _keys(suffix[None, :])[0]
            lo, hi = np.searchsorted(keys, key, "left"), np.searchsorted(keys, key, "right")
            if lo == hi:
                continue
            positions = after[lo:hi]
            # a hash collision or an occurrence at the very end of a sequence has no usable continuation
            found = tokens[positions[:, None] - n + np.arange(n)]
            positions = positions[(found == suffix).all(axis=1) & (tokens[positions] != _SEPARATOR)]
            if positions.size == 0:
                continue
            positions = positions[-self.max_occurrences :]
            return _count_paths(tokens, positions, depth), int(positions.size)
        return {}, 0


def context_continuations(
    context: list[int], depth: int, min_ngram: int, max_ngram: int, max_occurrences: int = MAX_OCCURRENCES
) -> tuple[dict[tuple[int, ...], int], int, int]:
    """A request's own tokens as a store: counts of every continuation path (up to `depth` tokens) after
    the most recent occurrences (at most `max_occurrences`) of the longest suffix of `context` (n from
    `max_ngram` down to `min_ngram`) that occurred earlier with something after it, the number of
    occurrences and n; ({}, 0, 0) when no such suffix recurs. Unlike a SuffixStore nothing is indexed:
    one vectorised scan per n, since the context grows by a few tokens every step."""
    tokens = np.asarray(context, dtype=np.int64)
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        # windows over all but the last token: every match has a token after it, and the suffix itself is excluded
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        positions = np.nonzero((windows == tokens[-n:]).all(axis=1))[0] + n
        if positions.size:
            positions = positions[-max_occurrences:]
            return _count_paths(tokens, positions, depth), int(positions.size), n
    return {}, 0, 0


def _keys(windows: np.ndarray) -> np.ndarray:
    """One int64 hash per row of n-gram windows [M, n] (wrapping polynomial; collisions are checked)."""
    keys = np.zeros(windows.shape[0], dtype=np.int64)
    with np.errstate(over="ignore"):
        for column in range(windows.shape[1]):
            keys = keys * _MULTIPLIER + windows[:, column] + 1
    return keys


def _merged_index(
    old: tuple[np.ndarray, np.ndarray] | None, n: int, old_len: int, cut: int, tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The index of n-grams of `tokens[cut:]`: `old` (that of `tokens[:old_len]`) less the n-grams that
    start before `cut`, plus those that end past `old_len`, in positions from `cut`."""
    start = max(old_len - n + 1, cut, 0)  # the first n-gram the old index cannot hold
    keys, after = ngram_index(tokens[start:], n)
    after = after + (start - cut)
    if old is None:
        return keys, after
    old_keys, old_after = old
    if cut:
        kept = old_after - n >= cut
        old_keys, old_after = old_keys[kept], old_after[kept] - cut
    # every new n-gram comes after every old one: on equal keys after them, so each key's
    # occurrences stay in position order (the last are the most recent)
    at = np.searchsorted(old_keys, keys, "right")
    return np.insert(old_keys, at, keys), np.insert(old_after, at, after)


def ngram_index(tokens: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every n-gram of `tokens` that holds no separator: keys sorted (equal keys in position order) and the
    position that follows each."""
    if len(tokens) < n:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, n)  # windows[i] = tokens[i : i + n]
    starts = np.nonzero((windows != _SEPARATOR).all(axis=1))[0]
    keys = _keys(windows[starts])
    order = np.argsort(keys, kind="stable")
    return keys[order], starts[order] + n


def _count_paths(tokens: np.ndarray, positions: np.ndarray, depth: int) -> dict[tuple[int, ...], int]:
    ends = np.minimum(positions + depth, len(tokens))
    counts: dict[tuple[int, ...], int] = {}
    for start, end in zip(positions.tolist(), ends.tolist()):
        path: tuple[int, ...] = ()
        for token in tokens[start:end].tolist():
            if token == _SEPARATOR:
                break
            path += (token,)
            counts[path] = counts.get(path, 0) + 1
    return counts


def likeliest_paths(counts: dict[tuple[int, ...], int], occurrences: int, limit: int) -> dict[tuple[int, ...], float]:
    """The `limit` paths with the most occurrences (shallower first on ties), each with the log of its
    share given its parent. A path never outnumbers its prefix, so the kept set is prefix-closed."""
    kept = sorted(counts, key=lambda path: (-counts[path], len(path)))[: max(limit, 0)]
    return {path: math.log(counts[path] / (counts[path[:-1]] if len(path) > 1 else occurrences)) for path in kept}


def save_draft_corpus(head_dir: str | Path, sequences: list[list[int]], metadata: dict) -> Path:
    """`draft_corpus.safetensors`: `tokens` int32, the sequences joined with -1 between them."""
    joined = [t for seq in sequences for t in (*seq, _SEPARATOR)]
    path = Path(head_dir) / DRAFT_CORPUS_FILE
    save_file(
        {"tokens": torch.tensor(joined, dtype=torch.int32)},
        str(path),
        metadata={k: str(v) for k, v in metadata.items()},
    )
    return path


def _corpus_tokens(head_dir: str | Path, vocab_size: int) -> np.ndarray | None:
    """The head directory's draft corpus file as one checked array (sequences joined by _SEPARATOR), or None."""
    path = Path(head_dir) / DRAFT_CORPUS_FILE
    if not path.is_file():
        return None
    tokens = read_head_file_tensor(path, "tokens", DraftCorpusError, "jetspec draft-corpus")
    if tokens.dim() != 1 or tokens.dtype not in (torch.int32, torch.int64):
        raise DraftCorpusError(f"{path}: tokens must be a 1-D integer tensor, got {tuple(tokens.shape)} {tokens.dtype}")
    values = tokens.long().numpy()
    if values.size and (values.min() < _SEPARATOR or values.max() >= vocab_size):
        raise DraftCorpusError(
            f"{path}: token ids outside the target's vocabulary 0..{vocab_size - 1}; it was built for "
            "another target: rebuild it with `jetspec draft-corpus`"
        )
    return values


def load_draft_corpus(head_dir: str | Path, vocab_size: int, max_ngram: int = 4) -> SuffixStore | None:
    """The head directory's draft corpus as an indexed store, or None when it has none."""
    values = _corpus_tokens(head_dir, vocab_size)
    if values is None:
        return None
    store = SuffixStore(max_ngram)
    store.add(values)
    store._refresh()  # index now: lazily, the first request to look it up would pay for it (about 0.1 s)
    return store


def corpus_sequences(head_dir: str | Path, vocab_size: int) -> list[list[int]]:
    """The sequences the head directory's draft corpus holds (none without a corpus)."""
    values = _corpus_tokens(head_dir, vocab_size)
    if values is None:
        return []
    cuts = np.flatnonzero(values == _SEPARATOR)
    starts = np.concatenate(([0], cuts[:-1] + 1)) if cuts.size else np.array([], dtype=np.int64)
    return [values[a:b].tolist() for a, b in zip(starts, cuts)]
