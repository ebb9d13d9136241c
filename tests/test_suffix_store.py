"""The suffix store (core/suffix_store.py) and its guesses in the hybrid drafter's trees: the draft
corpus shipped in a head directory and the outputs of finished requests."""

import hashlib
import json
import math

import numpy as np
import pytest

from sglang_jetspec.core.prompt_lookup import STORE_FACTOR, LookupMerge, lookup_guesses
from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.core.suffix_store import (
    DRAFT_CORPUS_FILE,
    DraftCorpusError,
    SuffixStore,
    likeliest_paths,
    load_draft_corpus,
    ngram_index,
    save_draft_corpus,
)
from sglang_jetspec.core.tree import TreeSpec, noisy_or
from sglang_jetspec.core.tree_drafting import headless_trees
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request

LOG = math.log


def store_of(*sequences, **kwargs) -> SuffixStore:
    store = SuffixStore(max_ngram=3, **kwargs)
    for seq in sequences:
        store.add(seq)
    return store


def test_continuations_follow_the_longest_recurring_suffix_and_count_every_path():
    store = store_of([1, 2, 3, 4, 5], [9, 2, 3, 4, 6], [7, 2, 3, 8])
    # "2 3" recurs three times (the 3-gram "0 2 3" never): 4 5, 4 6, 8
    assert store.continuations([0, 2, 3], 3) == ({(4,): 2, (4, 5): 1, (4, 6): 1, (8,): 1}, 3)
    # "3 4" (n = 2) beats "4" (n = 1); sequences end at their separator, never run into the next one
    assert store.continuations([5, 5, 3, 4], 3) == ({(5,): 1, (6,): 1}, 2)
    assert store.continuations([42], 3) == ({}, 0)
    assert store.continuations([5], 3) == ({}, 0)  # 5 only ends a sequence: nothing follows it
    assert SuffixStore().continuations([1, 2], 3) == ({}, 0)


def test_only_the_most_recent_occurrences_are_counted():
    store = store_of([1, 2], [1, 3], [1, 4], max_occurrences=2)
    assert store.continuations([1], 1) == ({(3,): 1, (4,): 1}, 2)


def test_a_bounded_store_forgets_its_oldest_sequences_first():
    store = store_of([1, 2], [1, 3], [1, 4], max_tokens=7)  # each sequence holds 3 slots with its separator
    assert store.continuations([1], 1)[0] == {(3,): 1, (4,): 1}
    assert store.num_tokens == 4


def test_a_refresh_indexes_only_what_was_added_and_equals_the_store_reindexed(monkeypatch):
    """Over random adds with eviction, and a 4-token vocabulary (every key recurs, so the order of equal
    keys matters): after each refresh the index is the whole store's, re-indexed from scratch, and
    lookups answer as a store filled in one go; each refresh hashed only the new tokens' n-grams."""
    import sglang_jetspec.core.suffix_store as module

    indexed = []
    monkeypatch.setattr(module, "ngram_index", lambda tokens, n: indexed.append(len(tokens)) or ngram_index(tokens, n))
    rng = np.random.default_rng(0)
    for trial in range(60):
        store = SuffixStore(max_ngram=int(rng.integers(1, 5)), max_tokens=int(rng.integers(8, 120)))
        for _ in range(12):
            added = [rng.integers(0, 4, int(rng.integers(1, 15))).tolist() for _ in range(int(rng.integers(1, 3)))]
            indexed.clear()
            for sequence in added:
                store.add(sequence)  # a store fed past its bound refreshes here already
            store._refresh()
            # the new tokens, their separators, and the n - 1 before them a spanning n-gram may start in
            assert max(indexed, default=0) <= sum(len(a) + 1 for a in added) + store.max_ngram - 1, trial
            for n in range(1, store.max_ngram + 1):
                keys, after = store._index[n - 1]
                want_keys, want_after = ngram_index(store._tokens, n)
                assert np.array_equal(keys, want_keys) and np.array_equal(after, want_after), (trial, n)
            once = SuffixStore(max_ngram=store.max_ngram)
            once.add(store._tokens[:-1])  # the held sequences, -1 between them, as one add
            for context in ([0], [1, 2], [3, 0, 1], [2, 2, 2, 2]):
                assert store.continuations(context, 3) == once.continuations(context, 3), (trial, context)


def test_a_full_store_evicts_down_to_seven_eighths_of_its_bound():
    store = SuffixStore(max_ngram=3, max_tokens=40)  # each [5, 6, 7] holds 4 slots with its separator
    for _ in range(11):
        store.add([5, 6, 7])
        store._refresh()
    assert store.num_tokens == 27  # 44 slots > 40: down to 36 (<= 35 and the next sequence boundary)
    store.add([5, 6, 7])
    assert store.num_tokens == 30  # 40 slots: no eviction pass on this refresh
    assert store.continuations([5, 6], 1) == ({(7,): 10}, 10)


def test_likeliest_paths_keep_a_prefix_closed_set_scored_by_share_given_the_parent():
    counts = {(4,): 3, (4, 5): 2, (4, 6): 1, (8,): 1}
    kept = likeliest_paths(counts, 4, 3)
    assert kept == pytest.approx({(4,): LOG(3 / 4), (4, 5): LOG(2 / 3), (8,): LOG(1 / 4)})  # ties: shallower first
    assert likeliest_paths(counts, 4, 0) == {}


def test_corpus_guesses_join_the_requests_own_trie_and_agreeing_guesses_combine():
    corpus = store_of([7, 8, 9, 1], [7, 8, 2])
    merge = LookupMerge(LOG(0.9), corpus=corpus)
    spec = TreeSpec(budget=8, max_depth=4, width=4)
    # the request's own "5 6 7" recurs once (a 3-token match: scored at the merge's own rate)
    own_only = lookup_guesses([5, 6, 7, 8, 9, 5, 6, 7], spec, LookupMerge(LOG(0.9)))
    assert own_only == {
        (): {8: pytest.approx(LOG(0.9))},
        (8,): {9: pytest.approx(LOG(0.9))},
        (8, 9): {5: pytest.approx(LOG(0.9))},
        (8, 9, 5): {6: pytest.approx(LOG(0.9))},
    }
    guesses = lookup_guesses([5, 6, 7, 8, 9, 5, 6, 7], spec, merge)
    # the corpus after "7": 8 (both times), then 9 or 2 (half each), then 1 after 9; other text is
    # trusted STORE_FACTOR times less than the request's own
    stored = 0.9 * STORE_FACTOR
    assert guesses[()][8] == pytest.approx(noisy_or(LOG(0.9), LOG(stored)))
    assert guesses[(8,)][9] == pytest.approx(noisy_or(LOG(0.9), LOG(stored * 0.5)))
    assert guesses[(8,)][2] == pytest.approx(LOG(stored * 0.5))
    assert guesses[(8, 9)] == pytest.approx({5: LOG(0.9), 1: LOG(stored)})
    # a budget of 2 nodes keeps the one likeliest path
    one_path = lookup_guesses([7], TreeSpec(budget=2, max_depth=4, width=4), merge)
    assert one_path == {(): {8: pytest.approx(LOG(stored))}}


def test_the_requests_own_tokens_give_every_recent_continuation_scored_by_share_and_match_length():
    spec = TreeSpec(budget=8, max_depth=2, width=4)
    merge = LookupMerge(LOG(0.9))
    # "1 2" occurred twice before the end, followed by 3 and by 4: both branches, half each (a 2-token match: x 0.9)
    guesses = lookup_guesses([1, 2, 3, 1, 2, 4, 1, 2], spec, merge)
    assert guesses == {
        (): pytest.approx({3: LOG(0.81 / 2), 4: LOG(0.81 / 2)}),
        (3,): {1: pytest.approx(LOG(0.81))},
        (4,): {1: pytest.approx(LOG(0.81))},
    }
    # only the last token recurs: a one-token match is trusted about half as much
    assert lookup_guesses([7, 1, 9, 8, 7], spec, merge) == {
        (): {1: pytest.approx(LOG(0.9 * 0.55))},
        (1,): {9: pytest.approx(LOG(0.9 * 0.55))},
    }
    # min_ngram 2 refuses that match; nothing recurs at all: no guess
    assert lookup_guesses([7, 1, 9, 8, 7], spec, LookupMerge(LOG(0.9), min_ngram=2)) == {}
    assert lookup_guesses([1, 2, 3], spec, merge) == {}
    # a long match raises the rate, but never to certainty
    long_match = lookup_guesses([1, 2, 3, 4, 5, 1, 2, 3, 4], spec, LookupMerge(LOG(0.98)))
    assert long_match[()] == pytest.approx({5: LOG(0.99)})


def test_a_headless_step_drafts_the_corpus_tree_best_first_within_the_budget():
    corpus = store_of([3, 4, 5], [3, 4, 6], [3, 4, 5], [3, 7])
    lane = type("Lane", (), {"committed_ids": [1, 3], "root_token": 3})()
    tree = headless_trees([lane], TreeSpec(budget=4, max_depth=4, width=4), LookupMerge(LOG(0.5), corpus=corpus))[0]
    # after 3: 4 (3 of 4), 7 (1 of 4); after 3 4: 5 (2 of 3), 6 (1 of 3); the budget keeps the three likeliest
    assert set(tree.token_paths()) == {(), (4,), (4, 5), (7,)}
    scores = dict(zip(tree.token_paths(), tree.cum_logprobs.double().exp().tolist()))
    stored = 0.5 * STORE_FACTOR
    assert scores[(4, 5)] == pytest.approx(stored * 0.75 * stored * 2 / 3, rel=1e-5)


def test_the_corpus_file_round_trips_and_a_foreign_one_is_refused(tmp_path):
    assert load_draft_corpus(tmp_path, 100) is None
    save_draft_corpus(tmp_path, [[1, 2, 3], [1, 2, 4]], {"source": "test"})
    assert load_draft_corpus(tmp_path, 100).continuations([1, 2], 1) == ({(3,): 1, (4,): 1}, 2)
    with pytest.raises(DraftCorpusError, match=f"{DRAFT_CORPUS_FILE}: token ids outside .* `jetspec draft-corpus`"):
        load_draft_corpus(tmp_path, 4)
    (tmp_path / DRAFT_CORPUS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(DraftCorpusError, match="unreadable"):
        load_draft_corpus(tmp_path, 100)


def test_draft_corpus_command_writes_the_file_and_keeps_the_head_record_whole(tmp_path, capsys):
    from sglang_jetspec.cli import main

    data, head = tmp_path / "data", tmp_path / "head"
    data.mkdir()
    head.mkdir()
    lines = [{"id": str(i), "prompt_ids": [1], "output_ids": [5, 6, 7, 9 + i % 2]} for i in range(20)]
    (data / "responses.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (head / "config.json").write_text(json.dumps({"vocab_size": 50}))
    (head / "training_record.json").write_text(json.dumps({"files_sha256": {"config.json": "c0"}}))
    (head / "SHA256SUMS").write_text("c0  config.json\n")
    assert main(["draft-corpus", "--head", str(head), "--data-dir", str(data), "--max-tokens", "40"]) == 0
    corpus = load_draft_corpus(head, 50)
    assert corpus.num_tokens == 40  # ten of the 18 counted responses fit; the last two are held out
    assert corpus.continuations([6, 7], 1) == ({(9,): 5, (10,): 5}, 10)
    record = json.loads((head / "training_record.json").read_text())["draft_corpus"]
    assert record["command"] == f"jetspec draft-corpus --head {head} --data-dir {data} --max-tokens 40"
    # held out [5 6 7 9] and [5 6 7 10]: 6 and 7 always follow, the last token is among the guesses too
    assert record["heldout_next_token_hit_rate"] == 1.0 and json.loads(capsys.readouterr().out)["responses"] == 10
    digest = hashlib.sha256((head / DRAFT_CORPUS_FILE).read_bytes()).hexdigest()
    assert (head / "SHA256SUMS").read_text() == f"c0  config.json\n{digest}  {DRAFT_CORPUS_FILE}\n"
    with pytest.raises(SystemExit, match="--data-dir .*no responses.jsonl"):
        main(["draft-corpus", "--head", str(head), "--data-dir", str(tmp_path / "nowhere")])


def test_draft_corpus_append_keeps_the_current_sequences_and_their_record(tmp_path):
    from sglang_jetspec.cli import main

    head, code, chat = tmp_path / "head", tmp_path / "code", tmp_path / "chat"
    for d in (head, code, chat):
        d.mkdir()
    (head / "config.json").write_text(json.dumps({"vocab_size": 50}))
    (head / "training_record.json").write_text(json.dumps({"files_sha256": {}}))
    for d, out in ((code, [5, 6, 7]), (chat, [20, 21, 22, 23])):
        (d / "responses.jsonl").write_text(
            "".join(json.dumps({"id": str(i), "prompt_ids": [1], "output_ids": out}) + "\n" for i in range(10))
        )
    assert main(["draft-corpus", "--head", str(head), "--data-dir", str(code)]) == 0
    assert main(["draft-corpus", "--head", str(head), "--data-dir", str(chat), "--append", "--max-tokens", "40"]) == 0
    corpus = load_draft_corpus(head, 50)
    # nine code responses (27 tokens) kept, then three of the nine counted chat ones fit in 40
    assert corpus.num_tokens == 27 + 12
    assert corpus.continuations([5, 6], 1) == ({(7,): 9}, 9) and corpus.continuations([21], 1) == ({(22,): 3}, 3)
    record = json.loads((head / "training_record.json").read_text())["draft_corpus"]
    assert (record["responses"], record["tokens"]) == (12, 39)
    assert record["appended_to"]["data_dir"] == str(code) and record["appended_to"]["tokens"] == 27
    # without --append the corpus is rebuilt from the one directory
    assert main(["draft-corpus", "--head", str(head), "--data-dir", str(chat)]) == 0
    assert load_draft_corpus(head, 50).continuations([5, 6], 1) == ({}, 0)


@pytest.fixture(scope="module")
def countdown(smollm2):
    """A request whose greedy output this module reuses: SmolLM2 counting, 24 tokens, and that output."""
    ids = smollm2.tokenizer("10, 9, 8, 7, 6,")["input_ids"]
    request = Request(ids, SamplingParams(max_new_tokens=24, ignore_eos=True), "0")
    output = ReferenceEngine(smollm2, None, EngineConfig(max_batch_size=1)).generate([request], budget=0)[0]
    return request, output.output_ids


def test_a_corpus_that_holds_the_answer_is_accepted_deep_and_greedy_output_is_unchanged(
    smollm2, untrained_drafter, countdown, single_thread
):
    request, expected = countdown
    corpus = store_of(expected)
    with_corpus = ReferenceEngine(
        smollm2,
        untrained_drafter,
        EngineConfig(
            tree_width=4, max_batch_size=1, check_invariants=True, lookup=LookupMerge(LOG(0.9), corpus=corpus)
        ),
    ).generate([request], 16)[0]
    assert with_corpus.output_ids == expected
    # the untrained head alone is never right here (23 steps), the request's own tokens take 14: 24
    # tokens in 7 steps are the corpus's doing
    assert len(with_corpus.accept_lengths) <= 7


def test_an_engine_looks_up_what_its_finished_requests_wrote(smollm2, untrained_drafter, countdown, single_thread):
    request, expected = countdown
    engine = ReferenceEngine(
        smollm2,
        untrained_drafter,
        EngineConfig(tree_width=4, max_batch_size=1, lookup=LookupMerge(LOG(0.9), corpus=SuffixStore())),
    )
    first = engine.generate([request], 16)[0]
    again = engine.generate([request], 16)[0]
    assert first.output_ids == again.output_ids == expected
    assert engine.recent_outputs.num_tokens == 2 * len(expected)
    assert len(again.accept_lengths) <= 7 < len(first.accept_lengths)
    # without a corpus the merge looks up the request's own tokens only: nothing is carried over
    own_only = ReferenceEngine(
        smollm2, untrained_drafter, EngineConfig(tree_width=4, max_batch_size=1, lookup=LookupMerge(LOG(0.9)))
    )
    own_only.generate([request], 16)
    assert len(own_only.generate([request], 16)[0].accept_lengths) == len(first.accept_lengths)
