"""The verifiable reward R_m in {0, 1}: a think block, then a \\boxed{} answer math-verify accepts.

math-verify bounds its time with `signal.alarm`, which only works on a process's main thread: off it
(Ray Train's training thread, threaded actors) both timeouts must be None or it raises. So off the
main thread sympy runs unbounded here; the trial therefore scores in a Ray task, whose main thread
keeps the timeouts. A parse failure or a timeout is reward 0 with its reason, never an exception.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

REASONS = ("correct", "wrong", "no_think", "no_boxed", "parse_error", "timeout")
TIMEOUT_SECONDS = 5
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_ANSWER_CONFIG = [LatexExtractionConfig(boxed_match_priority=0)]
_GOLD_CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]


@dataclass(frozen=True)
class Verdict:
    reward: float
    reason: str


def _time_limit() -> int | None:
    return TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None


def verify_response(response: str, gold: str) -> Verdict:
    """1.0 if `response` = ...<think>...</think>... \\boxed{x} with x equal to `gold`, else 0.0."""
    match = _THINK.search(response)
    if match is None:
        return Verdict(0.0, "no_think")
    answer_part = response[match.end():]
    if "\\boxed" not in answer_part:
        return Verdict(0.0, "no_boxed")
    limit = _time_limit()
    try:
        answer = parse(answer_part, extraction_config=_ANSWER_CONFIG, parsing_timeout=limit, raise_on_error=True)
        target = parse(f"${gold}$", extraction_config=_GOLD_CONFIG, parsing_timeout=limit, raise_on_error=True)
        if not answer or not target:
            return Verdict(0.0, "parse_error")
        ok = verify(target, answer, timeout_seconds=limit, raise_on_error=True)
    except TimeoutError:
        return Verdict(0.0, "timeout")
    except Exception:  # noqa: BLE001 - untrusted model text can break sympy in any way; reward 0
        return Verdict(0.0, "parse_error")
    return Verdict(1.0, "correct") if ok else Verdict(0.0, "wrong")


def score_batch(responses: Sequence[str], golds: Sequence[str]) -> tuple[list[float], dict[str, int]]:
    """Rewards and the count of each reason (every reason present)."""
    if len(responses) != len(golds):
        raise ValueError(f"score_batch: {len(responses)} responses but {len(golds)} gold answers")
    counts = dict.fromkeys(REASONS, 0)
    rewards = []
    for response, gold in zip(responses, golds):
        verdict = verify_response(response, gold)
        counts[verdict.reason] += 1
        rewards.append(verdict.reward)
    return rewards, counts
