"""Prompts as the papers build them: the templates' exact text and token ids, the `<think>` prefill, the
verifier reading prefill + response, teacher targets without the prefill, and a file's chat list kept whole."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from trainables.algo.hybrid import teacher_response
from trainables.config import PromptConfig, TrialConfig
from trainables.data.arithmetic import SYSTEM_PROMPT, Problem
from trainables.data.offline import read_rows
from trainables.data.prompts import OPENR1_SYSTEM_PROMPT, TEMPLATES, chat_messages, strip_prefill
from trainables.rewards.verify import verify_response
from trainables.tasks import encode_prompt, train_problems

QUESTION = Problem("L1-12+7", "12+7", "19", level=1)
FILE_TURNS = (("system", "Answer tersely."), ("user", "What is 12+7?"))
# The tiny policy's chat template: <|role|>content\n per turn, then <|assistant|> (trainables/data/bootstrap.py).
GOLDEN = {
    ("builtin", ""): f"<|system|>{SYSTEM_PROMPT}\n<|user|>12+7\n<|assistant|>",
    ("openr1", "<think>\n"): f"<|system|>{OPENR1_SYSTEM_PROMPT}\n<|user|>12+7\n<|assistant|><think>\n",
    ("none", ""): "<|user|>12+7\n<|assistant|>",
    ("dataset", "<think>\n"): "<|system|>Answer tersely.\n<|user|>What is 12+7?\n<|assistant|><think>\n",
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def test_openr1_system_prompt_is_the_papers_verbatim():
    """OGER's Table 5 (shared/papers), in the order and spelling of the paper."""
    assert OPENR1_SYSTEM_PROMPT.startswith("Your task is to follow a systematic, thorough reasoning process")
    assert 'the format: "<think>\\n {thoughts} </think>\\n". Each thought' in OPENR1_SYSTEM_PROMPT
    assert 'After "</think>\\n", in the Solution section' in OPENR1_SYSTEM_PROMPT
    assert OPENR1_SYSTEM_PROMPT.endswith(
        "include the answer in \\boxed{} for closed-form results like multiple choices or mathematical solutions."
    )


@pytest.mark.parametrize(("template", "prefill"), list(GOLDEN))
def test_prompt_text_and_token_ids_are_golden(tokenizer, template, prefill):
    problem = Problem("offline-0", "What is 12+7?", "19", 0, messages=FILE_TURNS) if template == "dataset" else QUESTION
    ids = encode_prompt(tokenizer, problem, PromptConfig(template=template, prefill=prefill))
    golden = GOLDEN[(template, prefill)]
    assert tokenizer.decode(ids) == golden
    assert ids == tokenizer(golden, add_special_tokens=False)["input_ids"]


def test_builtin_prompt_ids_are_todays(tokenizer):
    """The embedded default's prompts are bit for bit the ids of the chat template's own tokenization."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": QUESTION.question}]
    old = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    old = old["input_ids"] if hasattr(old, "keys") else old
    assert encode_prompt(tokenizer, QUESTION) == list(old)
    assert chat_messages(QUESTION, "builtin") == messages


def test_user_format_and_template_registry():
    assert set(TEMPLATES) == {"builtin", "openr1", "dataset", "none"}
    turns = chat_messages(QUESTION, "openr1", "This is the problem: {question}")
    assert turns == [
        {"role": "system", "content": OPENR1_SYSTEM_PROMPT},
        {"role": "user", "content": "This is the problem: 12+7"},
    ]
    assert chat_messages(QUESTION, "dataset") == [{"role": "user", "content": "12+7"}]  # no chat list: the question
    for bad in ("no field", "{question} twice {question}", "{other}", "{question} {"):
        with pytest.raises(ValidationError, match="user_format"):
            PromptConfig(user_format=bad)


def test_dataset_template_needs_a_data_file():
    with pytest.raises(ValidationError, match="prompt.template dataset"):
        TrialConfig(prompt={"template": "dataset"})


def test_reward_of_a_prefilled_completion():
    """The policy continues inside the prefilled think block: the verifier reads prefill + response."""
    response = "12 plus 7 is 19.</think> The answer is \\boxed{19}."
    assert verify_response(response, "19").reason == "no_think"
    prefilled = PromptConfig(prefill="<think>\n").completion(response)
    assert prefilled == "<think>\n" + response
    assert verify_response(prefilled, "19").reward == 1.0
    assert verify_response(PromptConfig().completion(response), "19").reward == 0.0


def test_teacher_targets_lose_the_prefill(tokenizer):
    """As LUFFY's dataset code: a target's leading <think>\\n goes when the prompt ends with it, so teacher
    and policy rows hold the same part of the assistant's turn."""
    stored = "<think>12 plus 7 is 19.</think> \\boxed{19}"  # the offline store's normal form
    for raw in (stored, "<think>\n12 plus 7 is 19.</think> \\boxed{19}"):
        assert strip_prefill(raw, "<think>\n") == "12 plus 7 is 19.</think> \\boxed{19}"
        assert strip_prefill(raw, "") == raw
    text, ids, reason = teacher_response(stored, tokenizer, 200, "<think>\n")
    assert text == "12 plus 7 is 19.</think> \\boxed{19}" and reason == "stop"
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert verify_response(PromptConfig(prefill="<think>\n").completion(text), "19").reward == 1.0


def test_a_files_chat_list_is_kept_whole(tmp_path):
    """read_rows used to keep only the last user turn; the dataset template needs the system turn too."""
    path = tmp_path / "luffy.jsonl"
    row = {
        "prompt": [{"role": role, "content": content} for role, content in FILE_TURNS],
        "target": [{"role": "assistant", "content": "<think>\nok</think> \\boxed{19}"}],
        "reward_model": {"ground_truth": "19"},
        "data_source": "r1",
    }
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "prompt": "What is 1+1?"}) + "\n")
    rows, skipped = read_rows(path)
    assert not skipped
    assert rows[0]["question"] == "What is 12+7?" and rows[0]["messages"] == FILE_TURNS
    assert "messages" not in rows[1]  # a string prompt has no chat list
    cfg = TrialConfig(
        task={"name": "offline_prompts"},
        offline={"teachers": [], "files": [{"path": str(path)}]},
        validation={"benchmarks": {"math500": str(path)}},
        prompt={"template": "dataset"},
    )
    problems = train_problems(cfg)
    assert problems[0].messages == FILE_TURNS
    assert chat_messages(problems[0], "dataset")[0] == {"role": "system", "content": "Answer tersely."}


def test_a_prompt_past_the_context_is_left_out_and_counted(tiny_model_path):
    from transformers import AutoTokenizer

    from trainables.tasks import within_context

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    problems = [
        Problem("a", "1 + 1 = ?", "2", level=1),
        Problem("b", "1 + " * 5000 + "1 = ?", "5001", level=1),
        Problem("c", "2 + 2 = ?", "4", level=1),
    ]
    budget = len(encode_prompt(tokenizer, problems[0], PromptConfig())) + 10
    kept, overlong = within_context(problems, tokenizer, PromptConfig(), budget)
    assert [p.uid for p in kept] == ["a", "c"] and overlong == 1
