"""The hybrid drafter's lookups for a whole batch in one vectorised pass, a fixed number of numpy calls
a step whatever the batch size.

Per request, `suffix_store.context_continuations` (the request's own tokens), `SuffixStore.continuations`
(the draft corpus, finished outputs) and `likeliest_paths` are the definition: the continuations of the
most recent occurrences of the longest recurring suffix, counted as a trie, the `limit` likeliest paths
kept. Run per request they cost about 0.7 ms of Python a request on a 2-core EPYC (0.3 ms of it counting
the trie one token at a time), the host work of a step that grew with its batch (issue 56). Here every
request's search is one comparison per suffix length over the batch's contexts laid out as one padded
matrix, every store's search one `searchsorted` per suffix length, and every (request, source) pair's
trie is counted at once: the continuation rows of all their occurrences sorted together, a path being a
run of equal prefixes. Only the kept paths (at most `limit` a pair) become Python tuples.

Same result as the per-request functions, ties included (tests/test_batched_lookup.py compares them on
random and real text): `likeliest_paths` ranks paths by count, then depth, then the order a scan of the
occurrences first meets them, which is (occurrence, depth) here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .suffix_store import SuffixStore, _keys

_PAD = -2  # left of a context in the padded matrix: never a token, never a separator
_END = -1  # after a context (suffix_store's separator): no continuation runs past it


@dataclass
class Occurrences:
    """Where lookups matched: `positions` into a flat token array (the token after each occurrence), the
    lookup `groups` they belong to, ascending within a group (the oldest occurrence first)."""

    tokens: np.ndarray
    positions: np.ndarray
    groups: np.ndarray


class PaddedContexts:
    """A batch's contexts right-aligned in one matrix [B, L + 1]: `_PAD` before each, `_END` after."""

    def __init__(self, contexts: list[list[int]]) -> None:
        self.lengths = np.array([len(c) for c in contexts], dtype=np.int64)
        self.width = int(self.lengths.max(initial=0))
        self.matrix = np.full((len(contexts), self.width + 1), _PAD, dtype=np.int64)
        self.matrix[:, -1] = _END
        for row, (context, length) in enumerate(zip(contexts, self.lengths.tolist())):
            if length:
                self.matrix[row, self.width - length : self.width] = context

    def suffixes(self, n: int) -> np.ndarray:
        """[B, n]: each context's last n tokens (valid where its length is at least n)."""
        return self.matrix[:, self.width - n : self.width]


def own_occurrences(
    padded: PaddedContexts, min_ngram: int, max_ngram: int, max_occurrences: int
) -> tuple[Occurrences, np.ndarray]:
    """`context_continuations`' search for every context at once: the most recent occurrences (at most
    `max_occurrences`) of its longest suffix (n from `max_ngram` down to `min_ngram`) that occurred
    earlier with something after it, and each context's n (0: none recurs). Group b is context b."""
    batch, width = padded.matrix.shape[0], padded.width
    stride = width + 1
    matched_n = np.zeros(batch, dtype=np.int64)
    found: list[tuple[np.ndarray, np.ndarray]] = []  # (lanes, flat positions) per suffix length
    for n in range(max_ngram, min_ngram - 1, -1):
        lanes = np.flatnonzero((matched_n == 0) & (padded.lengths - 1 >= n))
        if lanes.size == 0:
            continue
        # windows over all but each context's last token: every match has a token after it
        windows = np.lib.stride_tricks.sliding_window_view(padded.matrix[lanes, : width - 1], n, axis=1)
        hits = (windows == padded.suffixes(n)[lanes, None, :]).all(axis=2)
        rows, columns = np.nonzero(hits)
        if rows.size == 0:
            continue
        keep = _most_recent(rows, max_occurrences)
        rows, columns = rows[keep], columns[keep]
        matched_n[lanes[np.unique(rows)]] = n
        found.append((lanes[rows], lanes[rows] * stride + columns + n))
    return _occurrences(padded.matrix.ravel(), found), matched_n


def store_occurrences(store: SuffixStore, padded: PaddedContexts) -> Occurrences:
    """`SuffixStore.continuations`' search for every context at once (group b: context b)."""
    store._refresh()
    found: list[tuple[np.ndarray, np.ndarray]] = []
    if not store._index:
        return _occurrences(store._tokens, found)
    tokens = store._tokens
    resolved = np.zeros(padded.matrix.shape[0], dtype=bool)
    for n in range(store.max_ngram, 0, -1):
        lanes = np.flatnonzero(~resolved & (padded.lengths >= n))
        if lanes.size == 0:
            continue
        suffixes = padded.suffixes(n)[lanes]
        keys, after = store._index[n - 1]
        wanted = _keys(suffixes)
        lo, hi = np.searchsorted(keys, wanted, "left"), np.searchsorted(keys, wanted, "right")
        counts = hi - lo
        if not counts.any():
            continue
        owner = np.repeat(np.arange(lanes.size), counts)  # index into `lanes` of each candidate
        starts = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        positions = after[starts]
        # a hash collision or an occurrence at the very end of a sequence has no usable continuation
        same = (tokens[positions[:, None] - n + np.arange(n)] == suffixes[owner]).all(axis=1)
        usable = same & (tokens[positions] != _END)
        owner, positions = owner[usable], positions[usable]
        if owner.size == 0:
            continue
        keep = _most_recent(owner, store.max_occurrences)
        owner, positions = owner[keep], positions[keep]
        resolved[lanes[owner]] = True
        found.append((lanes[owner], positions))
    return _occurrences(tokens, found)


def _most_recent(groups: np.ndarray, limit: int) -> np.ndarray:
    """Mask of the last `limit` entries of each run of equal `groups` (sorted)."""
    index = np.arange(groups.size)
    is_last = np.ones(groups.size, dtype=bool)
    is_last[:-1] = groups[1:] != groups[:-1]
    run_end = np.minimum.accumulate(np.where(is_last, index, groups.size)[::-1])[::-1]
    return run_end - index < limit


def _occurrences(tokens: np.ndarray, found: list[tuple[np.ndarray, np.ndarray]]) -> Occurrences:
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return Occurrences(tokens, empty, empty)
    groups = np.concatenate([g for g, _ in found])
    positions = np.concatenate([p for _, p in found])
    order = np.argsort(groups, kind="stable")  # each group's positions stay ascending
    return Occurrences(tokens, positions[order], groups[order])


def continuation_rows(occurrences: Occurrences, depth: int) -> np.ndarray:
    """[P, depth]: the tokens after each occurrence, `_END` from its first separator (or the end) on."""
    tokens = occurrences.tokens
    if tokens.size == 0:
        return np.zeros((0, depth), dtype=np.int64)
    index = np.minimum(occurrences.positions[:, None] + np.arange(depth), tokens.size - 1)
    rows = tokens[index]
    ended = np.logical_or.accumulate(rows < 0, axis=1)
    ended |= occurrences.positions[:, None] + np.arange(depth) >= tokens.size
    rows[ended] = _END
    return rows


def likeliest_paths_batch(
    rows: np.ndarray, groups: np.ndarray, num_groups: int, limit: int
) -> list[dict[tuple[int, ...], float]]:
    """`likeliest_paths(counts, occurrences, limit)` of every group at once, where a group's counts are
    those of its continuation `rows` (`continuation_rows`, its occurrences in scan order) and its
    occurrences their number."""
    kept: list[dict[tuple[int, ...], float]] = [{} for _ in range(num_groups)]
    total, depth = rows.shape
    if total == 0 or depth == 0 or limit <= 0:
        return kept
    # rows sorted by group, then token by token: the rows sharing a path are one run at its depth
    order = np.lexsort((*rows[:, ::-1].T, groups))
    ranked, group_of = rows[order], groups[order]
    differs = np.ones((total, depth), dtype=bool)
    differs[1:] = ranked[1:] != ranked[:-1]
    differs[1:] |= (group_of[1:] != group_of[:-1])[:, None]
    new_path = np.logical_or.accumulate(differs, axis=1)  # the prefix up to this depth differs from the row before

    # runs column by column (column-major: cell d * total + row); every column's first row starts a run
    starts = np.flatnonzero(new_path.T.ravel())
    run_length = np.diff(np.append(starts, total * depth))
    first_seen = np.minimum.reduceat(np.tile(order, depth), starts)  # the run's first occurrence in scan order
    run_of_cell = np.cumsum(new_path.T.ravel()) - 1
    run_depth, run_row = starts // total, starts % total
    run_group = group_of[run_row]
    real = ranked[run_row, run_depth] != _END

    occurrences = np.bincount(groups, minlength=num_groups)
    parent_count = np.where(
        run_depth > 0,
        run_length[run_of_cell[np.maximum(run_depth - 1, 0) * total + run_row]],
        occurrences[run_group],
    )
    candidates = np.flatnonzero(real)
    # likeliest_paths' order within each group: most occurrences, then shallower, then first met
    ranking = candidates[
        np.lexsort((first_seen[candidates], run_depth[candidates], -run_length[candidates], run_group[candidates]))
    ]
    ranked_group = run_group[ranking]
    group_start = np.searchsorted(ranked_group, ranked_group, "left")
    chosen = ranking[np.arange(ranking.size) - group_start < limit]
    paths = ranked[run_row[chosen]].tolist()
    for path, path_depth, group, count, parent in zip(
        paths,
        run_depth[chosen].tolist(),
        run_group[chosen].tolist(),
        run_length[chosen].tolist(),
        parent_count[chosen].tolist(),
    ):
        kept[group][tuple(path[: path_depth + 1])] = math.log(count / parent)
    return kept
