"""The built-in chat prompt set (train/chat_prompts.py): distinct, deterministic, tuning prompts kept
out of training, and never a prompt of the report set bench/prompts/chat.jsonl."""

import json
from collections import Counter
from pathlib import Path

from sglang_jetspec.train.chat_prompts import HELDOUT_TUNE, TEMPLATES, chat_prompt_records, tuning_prompt_records
from sglang_jetspec.train.command import PROMPT_SETS

REPORT_SET = Path(__file__).resolve().parents[1] / "bench" / "prompts" / "chat.jsonl"


def _texts(records):
    return [r["messages"][0]["content"] for r in records]


def test_chat_prompts_are_distinct_filled_and_deterministic():
    records = chat_prompt_records(seed=0, total=2000)
    texts = _texts(records)
    assert len(texts) == 2000 == len(set(texts)) and texts == _texts(chat_prompt_records(seed=0, total=2000))
    assert not any("{" in t or "}" in t for t in texts)
    # every template is used and none dominates (templates with small subject pools run out of distinct prompts early)
    by_template = Counter(r["source"] for r in records)
    assert len(by_template) == len(TEMPLATES) and max(by_template.values()) < 0.15 * len(records)
    assert _texts(chat_prompt_records(seed=0, total=100)) == texts[:100]  # a smaller set is a prefix
    assert texts != _texts(chat_prompt_records(seed=1, total=2000))


def test_tuning_prompts_never_train_and_the_report_set_is_never_generated():
    tuning = _texts(tuning_prompt_records())
    assert len(tuning) == HELDOUT_TUNE == len(set(tuning))
    assert not set(tuning) & set(_texts(chat_prompt_records(seed=0, total=2000)))
    report = {
        json.loads(line)["messages"][0]["content"] for line in REPORT_SET.read_text().splitlines() if line.strip()
    }
    assert len(report) == 64 and not report & set(tuning + _texts(chat_prompt_records(seed=0, total=2000)))


def test_chat_is_a_training_prompt_set():
    assert "chat" in PROMPT_SETS


def test_the_committed_tuning_file_is_the_tuning_set():
    lines = (REPORT_SET.parent / "chat-tune.jsonl").read_text().splitlines()
    assert [json.loads(line)["messages"][0]["content"] for line in lines] == _texts(tuning_prompt_records())
