"""Chat prompts as the papers build them: one registry of templates, a generation prefill, and the
text the verifier reads.

    builtin   the built-in task's short system prompt, then the question (the embedded default)
    openr1    the OpenR1 system prompt that LUFFY's data and the OGER paper's Table 5 use, verbatim from
              the paper, then the question
    dataset   the data file's own chat list, kept whole (system turn included); a problem without one
              (the built-in task, a benchmark file) gets its question as the only turn
    none      the question alone, no system prompt (the OGER paper's out-of-domain evaluations)

`prefill` is text appended after the chat template's generation prompt (LUFFY's data ends its prompts
with "<think>\\n"), so the policy starts inside the think block. The assistant's turn is then the
prefill followed by the response, and that whole turn is what the verifier judges (LUFFY's reward
prepends "<think>\\n" to the response before checking).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from trainables.data.arithmetic import SYSTEM_PROMPT

# The OGER paper, Appendix, Table 5, verbatim, "\n" as the two characters the paper prints. LUFFY's data
# differs in two places: its Python source turns each "\n" into a newline, and puts the comma of
# '"</think>\n",' inside the quotes. `template: dataset` on LUFFY's own files keeps their prompt byte for byte.
OPENR1_SYSTEM_PROMPT = (
    "Your task is to follow a systematic, thorough reasoning process before providing the final solution. "
    "This involves analyzing, summarizing, exploring, reassessing, and refining your thought process through "
    "multiple iterations. Structure your response into two sections: Thought and Solution. In the Thought "
    'section, present your reasoning using the format: "<think>\\n {thoughts} </think>\\n". Each thought should '
    'include detailed analysis, brainstorming, verification, and refinement of ideas. After "</think>\\n", in '
    "the Solution section, provide the final, logical, and accurate answer, clearly derived from the "
    "exploration in the Thought section. If applicable, include the answer in \\boxed{} for closed-form results "
    "like multiple choices or mathematical solutions."
)
Messages = list[dict[str, str]]


class PromptProblem(Protocol):
    """What a template reads of a problem: its question; `dataset` also reads an optional `messages`,
    the (role, content) turns of a chat-list prompt in a data file."""

    question: str


def _system_then_user(system: str | None) -> Callable[[PromptProblem, str], Messages]:
    def template(problem: PromptProblem, user_format: str) -> Messages:
        user = [{"role": "user", "content": user_format.format(question=problem.question)}]
        return ([{"role": "system", "content": system}] if system else []) + user

    return template


def _dataset(problem: PromptProblem, user_format: str) -> Messages:
    turns: Sequence[tuple[str, str]] = getattr(problem, "messages", ())
    if turns:
        return [{"role": role, "content": content} for role, content in turns]
    return _system_then_user(None)(problem, user_format)


TEMPLATES: dict[str, Callable[[PromptProblem, str], Messages]] = {
    "builtin": _system_then_user(SYSTEM_PROMPT),
    "openr1": _system_then_user(OPENR1_SYSTEM_PROMPT),
    "dataset": _dataset,
    "none": _system_then_user(None),
}


def chat_messages(problem: PromptProblem, template: str = "builtin", user_format: str = "{question}") -> Messages:
    """The chat turns of one problem under a template of TEMPLATES."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; choose one of {sorted(TEMPLATES)}")
    return TEMPLATES[template](problem, user_format)


def prompt_text(
    tokenizer, problem: PromptProblem, template: str = "builtin", prefill: str = "", user_format: str = "{question}"
) -> str:
    """The prompt as text: the chat template with its generation prompt, then the prefill."""
    text = tokenizer.apply_chat_template(
        chat_messages(problem, template, user_format), add_generation_prompt=True, tokenize=False
    )
    return text + prefill


def prompt_ids(
    tokenizer, problem: PromptProblem, template: str = "builtin", prefill: str = "", user_format: str = "{question}"
) -> list[int]:
    """Token ids of `prompt_text`: the tokens of the whole text, so a prefill merges with the template's
    last token as the tokenizer would merge them (as LUFFY tokenizes its templated prompts)."""
    text = prompt_text(tokenizer, problem, template, prefill, user_format)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def strip_prefill(response: str, prefill: str) -> str:
    """A teacher's response as the policy continues it after the prefill: the prefill's text removed from
    its start (LUFFY strips a leading "<think>\\n" from its targets when the prompt ends with it). The
    offline store writes "<think>" with no newline after it, so the prefill without its trailing
    whitespace is removed too."""
    for head in (prefill, prefill.rstrip()):
        if head and response.startswith(head):
            return response[len(head) :]
    return response
