"""The reduced draft vocabulary: ranking, file checks, exact logits, and greedy identity in the engine."""

import pytest
import torch
from safetensors.torch import save_file

from sglang_jetspec.core.draft_vocab import (
    DRAFT_VOCAB_FILE,
    DraftVocabError,
    coverage,
    load_draft_vocab,
    rank_tokens,
    save_draft_vocab,
)
from sglang_jetspec.core.head_drafter import HeadDrafter
from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request
from sglang_jetspec.reference.prompts import humaneval_prompts


def test_rank_tokens_orders_by_frequency_with_end_tokens_first():
    ids = rank_tokens([[5, 5, 7, 3], [7, 5, 9]], size=4, vocab_size=12, always=[2])
    assert ids.tolist() == [2, 5, 7, 3]  # eos, then 5 (x3), 7 (x2), 3 and 9 tie at 1: lower id first


def test_rank_tokens_fills_up_when_the_data_has_too_few_distinct_tokens():
    ids = rank_tokens([[4, 4]], size=3, vocab_size=10)
    assert ids.tolist() == [4, 0, 1]


def test_rank_tokens_refuses_a_size_outside_the_vocabulary():
    with pytest.raises(DraftVocabError, match="within 1..10"):
        rank_tokens([[1]], size=11, vocab_size=10)


def test_coverage_counts_member_tokens():
    assert coverage(torch.tensor([1, 2]), [[1, 2, 3, 1]]) == 0.75


def test_round_trip_and_absent_file(tmp_path):
    assert load_draft_vocab(tmp_path, 100) is None
    save_draft_vocab(tmp_path, torch.tensor([7, 3, 9]), {"source": "test"})
    assert load_draft_vocab(tmp_path, 100).tolist() == [7, 3, 9]


@pytest.mark.parametrize("ids, message", [([3, 120], "outside the target's vocabulary"), ([3, 3], "repeats ids")])
def test_a_vocabulary_that_does_not_fit_is_refused_naming_the_file(tmp_path, ids, message):
    save_file({"token_ids": torch.tensor(ids)}, str(tmp_path / DRAFT_VOCAB_FILE))
    with pytest.raises(DraftVocabError, match=message) as err:
        load_draft_vocab(tmp_path, 100)
    assert DRAFT_VOCAB_FILE in str(err.value)


@pytest.fixture(scope="module")
def drafters(smollm2, untrained_drafter):
    vocab = torch.arange(0, 49152, 6)  # every 6th token: 8192 ids
    reduced = HeadDrafter(untrained_drafter.head, smollm2.embed_tokens, smollm2.lm_head, vocab)
    return untrained_drafter, reduced, vocab


class _Lane:
    def __init__(self, rows: torch.Tensor, root: int) -> None:
        from sglang_jetspec.core.context_cache import ContextCache

        self.root_token, self.draft_cache, self._rows = root, ContextCache(), rows

    def tap_rows(self) -> torch.Tensor:
        return self._rows


def test_reduced_logits_are_the_full_logits_columns_and_the_causal_block_is_cut(drafters):
    full, reduced, vocab = drafters
    rows = torch.randn(20, full.head.config.num_taps * full.head.config.hidden_size)
    whole = full.propose([_Lane(rows, 42)], 15)  # the whole block of 16 rows
    cut = reduced.propose([_Lane(rows, 42)], 3)  # a causal head's block cut to 4 rows
    assert whole.shape[-1] == 49152 and cut.shape == (1, 3, vocab.numel())
    torch.testing.assert_close(cut, whole[:, :3, vocab], rtol=1e-4, atol=1e-4)


def test_reduced_vocabulary_greedy_equals_autoregressive_and_drafts_only_its_tokens(smollm2, drafters, monkeypatch):
    from sglang_jetspec.core import tree_drafting as drafting

    _, reduced, vocab = drafters
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    requests = [
        Request(smollm2.tokenizer(p)["input_ids"], params, str(i)) for i, p in enumerate(humaneval_prompts(range(2)))
    ]
    engine = ReferenceEngine(smollm2, reduced, EngineConfig(max_batch_size=2))
    plain = [o.output_ids for o in engine.generate(requests, budget=0)]
    drafted, original = [], drafting.tree_from_candidates

    def spy(*args, **kwargs):
        tree = original(*args, **kwargs)
        drafted.extend(tree.tokens[1:].tolist())
        return tree

    monkeypatch.setattr(drafting, "tree_from_candidates", spy)
    assert [o.output_ids for o in engine.generate(requests, budget=16)] == plain
    assert drafted and set(drafted) <= set(vocab.tolist())


def test_draft_vocab_command_writes_the_file_and_keeps_the_head_record_whole(tmp_path, capsys):
    import hashlib
    import json

    from sglang_jetspec.cli import main

    data, head = tmp_path / "data", tmp_path / "head"
    data.mkdir()
    head.mkdir()
    lines = [{"id": str(i), "output_ids": [5, 5, 7, 9 + i % 2]} for i in range(20)]
    (data / "responses.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (head / "config.json").write_text(json.dumps({"vocab_size": 50}))
    (head / "training_record.json").write_text(json.dumps({"files_sha256": {"config.json": "c0"}}))
    (head / "SHA256SUMS").write_text("c0  config.json\n")
    assert main(["draft-vocab", "--head", str(head), "--data-dir", str(data), "--size", "3"]) == 0
    assert load_draft_vocab(head, 50).tolist() == [5, 7, 9]  # the last tenth (ids 18, 19) is held out
    record = json.loads((head / "training_record.json").read_text())
    assert record["draft_vocab"]["command"] == f"jetspec draft-vocab --head {head} --data-dir {data} --size 3"
    assert record["draft_vocab"]["heldout_coverage"] == 0.875  # [5, 5, 7, 10] is missing 10 in one of two lines
    digest = hashlib.sha256((head / DRAFT_VOCAB_FILE).read_bytes()).hexdigest()
    assert (head / "SHA256SUMS").read_text() == f"c0  config.json\n{digest}  {DRAFT_VOCAB_FILE}\n"
    assert json.loads(capsys.readouterr().out)["counted_responses"] == 18


def test_draft_vocab_append_keeps_the_current_tokens_first(tmp_path):
    import json

    from sglang_jetspec.cli import main

    head, code, chat = tmp_path / "head", tmp_path / "code", tmp_path / "chat"
    for d, out in ((head, None), (code, [5, 5, 7, 9]), (chat, [20, 20, 20, 21, 21, 22, 5])):
        d.mkdir()
        if out:
            (d / "responses.jsonl").write_text(
                "".join(json.dumps({"id": str(i), "output_ids": out}) + "\n" for i in range(10))
            )
    (head / "config.json").write_text(json.dumps({"vocab_size": 50}))
    (head / "training_record.json").write_text(json.dumps({"files_sha256": {}}))
    assert main(["draft-vocab", "--head", str(head), "--data-dir", str(code), "--size", "3"]) == 0
    assert main(["draft-vocab", "--head", str(head), "--data-dir", str(chat), "--size", "5", "--append"]) == 0
    # the code tokens stay, then the chat data's most frequent others (22, the least frequent, left out)
    assert load_draft_vocab(head, 50).tolist() == [5, 7, 9, 20, 21]
    record = json.loads((head / "training_record.json").read_text())["draft_vocab"]
    assert record["heldout_coverage"] == round(6 / 7, 5) and record["appended_to"]["size"] == 3
    with pytest.raises(SystemExit, match="--size 4 with --append: the head's vocabulary already holds 5 tokens"):
        main(["draft-vocab", "--head", str(head), "--data-dir", str(chat), "--size", "4", "--append"])


def test_draft_vocab_command_names_a_missing_data_dir(tmp_path):
    from sglang_jetspec.cli import main

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="--data-dir .*no responses.jsonl"):
        main(["draft-vocab", "--head", str(tmp_path), "--data-dir", str(tmp_path / "nowhere")])
