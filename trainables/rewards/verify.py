"""The verifiable reward R_m in {0, 1}: a think block, then a \\boxed{} answer math-verify accepts.

math-verify bounds its time with `signal.alarm`, which only works on a process's main thread: off it
(Ray Train's training thread, threaded or async actors) both `parse(parsing_timeout=...)` and
`verify(timeout_seconds=...)` must be None, or it raises ValueError. So off the main thread sympy runs
unbounded here and the caller bounds the time: the trial scores in its `VerifierService` actor
(trainables/verifier.py), whose methods run on its process's main thread and so keep the timeouts.
Untrusted model text never raises: a parse failure or a timeout is reward 0 with its reason.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from trainables.names import REASONS

TIMEOUT_SECONDS = 5  # per parse / per comparison, main thread only (signal.alarm takes whole seconds)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_BOXED = re.compile(r"\\boxed\s*\{")
# The answer is what is boxed: boxed first, so "The answer is 5, i.e. \boxed{5}" reads the box.
_ANSWER_CONFIG = [LatexExtractionConfig(boxed_match_priority=0)]
_GOLD_CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]


@dataclass(frozen=True)
class Verdict:
    reward: float  # R_m: 1.0 or 0.0
    reason: str  # one of REASONS


def answer_part(response: str) -> str | None:
    """The text after the last `</think>`, if a `<think>` opens before it; else None."""
    opened, closed = response.find(THINK_OPEN), response.rfind(THINK_CLOSE)
    if opened == -1 or closed < opened:
        return None
    return response[closed + len(THINK_CLOSE) :]


def time_limit() -> int | None:
    """math-verify's timeout where signal.alarm works (the main thread), else None (no signals)."""
    return TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None


def _judge(answer_text: str, gold: str, limit: int | None) -> str:
    """ "correct" / "wrong" / "parse_error"; lets math-verify's TimeoutException through."""
    answer = parse(answer_text, extraction_config=_ANSWER_CONFIG, parsing_timeout=limit, raise_on_error=True)
    target = parse(f"${gold}$", extraction_config=_GOLD_CONFIG, parsing_timeout=limit, raise_on_error=True)
    if not answer or not target:
        return "parse_error"
    # verify(gold, prediction): the order matters to math-verify (it is not symmetric).
    return "correct" if verify(target, answer, timeout_seconds=limit, raise_on_error=True) else "wrong"


def verify_response(response: str, gold: str) -> Verdict:
    """R_m = 1.0 iff `response` is `...<think>...</think>...\\boxed{x}...` with x equal to `gold`.

    The box must come after the last `</think>`. Never raises: off the main thread math-verify runs
    without a time limit, so bound the caller's time (a Ray task or a process) there.
    """
    answer_text = answer_part(response)
    if answer_text is None:
        return Verdict(0.0, "no_think")
    if _BOXED.search(answer_text) is None:
        return Verdict(0.0, "no_boxed")
    try:
        reason = _judge(answer_text, gold, time_limit())
    except (TimeoutException, TimeoutError):  # TimeoutException is a BaseException: name it
        reason = "timeout"
    except Exception:  # noqa: BLE001 - the one boundary with untrusted text: sympy can fail in any way
        reason = "parse_error"
    return Verdict(1.0 if reason == "correct" else 0.0, reason)


def score_batch(responses: Sequence[str], golds: Sequence[str]) -> tuple[list[float], dict[str, int]]:
    """Rewards [B] and the count of each reason (every key of REASONS present, zeros included)."""
    if len(responses) != len(golds):
        raise ValueError(
            f"score_batch got {len(responses)} responses but {len(golds)} gold answers; "
            "pass one gold answer per response (repeat each prompt's gold n times)"
        )
    counts = dict.fromkeys(REASONS, 0)
    rewards = []
    for response, gold in zip(responses, golds):
        verdict = verify_response(response, gold)
        counts[verdict.reason] += 1
        rewards.append(verdict.reward)
    return rewards, counts
