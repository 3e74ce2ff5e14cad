"""The math-verify reward: literal responses with exact expected verdicts."""

import threading

import pytest
from math_verify.errors import TimeoutException

from trainables.rewards import verify as verify_module
from trainables.rewards.verify import REASONS, Verdict, answer_part, score_batch, verify_response


@pytest.mark.parametrize(
    "response, gold, reason",
    [
        ("<think>3 of 4</think>\\boxed{3/4}", "0.75", "correct"),
        ("<think>3 of 4</think>\\boxed{\\frac{3}{4}}", "3/4", "correct"),
        ("<think>x</think>The answer is \\boxed{-12}.", "-12", "correct"),
        ("<think>17+25=42</think>\\boxed{42}", "42", "correct"),
        ("<think>a</think><think>b</think>So \\boxed{5}.", "5", "correct"),
        ("\\boxed{7}", "7", "no_think"),
        ("</think>\\boxed{7}", "7", "no_think"),
        ("<think>7 \\boxed{7}", "7", "no_think"),  # never closed
        ("</think><think>\\boxed{7}", "7", "no_think"),  # closed before it opened
        ("<think>7</think>so 7", "7", "no_boxed"),
        ("<think>\\boxed{7}</think>", "7", "no_boxed"),  # the answer must come after </think>
        ("<think>\\boxed{7}</think>so 7", "7", "no_boxed"),
        ("<think>x</think>\\boxed{8}", "7", "wrong"),
        ("<think>x</think>\\boxed{8} or \\boxed{7}", "7", "wrong"),  # hedging is not an answer
        ("<think>x</think>\\boxed{\\frac{", "7", "parse_error"),
        ("<think>x</think>\\boxed{}", "7", "parse_error"),
    ],
)
def test_verifier_cases(response, gold, reason):
    assert verify_response(response, gold) == Verdict(1.0 if reason == "correct" else 0.0, reason)


@pytest.mark.parametrize(
    "garbage",
    [
        "<think>x</think>\\boxed{\\frac{",
        "<think>x</think>\\boxed{{{{}",
        "<think></think>\\boxed{\\sqrt[}{}^^}",
        "<think>x</think>\\boxed{1/0}",
        "<think>x</think>\\boxed{\\begin{pmatrix}1&\\end{}}",
        "<think>x</think>\\boxed{" + "(" * 500,
    ],
)
def test_garbage_never_raises(garbage):
    verdict = verify_response(garbage, "7")
    assert verdict.reward == 0.0 and verdict.reason in ("parse_error", "wrong")


def test_answer_part_is_after_the_last_close():
    assert answer_part("<think>a</think>b</think>c") == "c"
    assert answer_part("no tags") is None


def test_timeout_is_its_own_reason(monkeypatch):
    def slow(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    monkeypatch.setattr(verify_module, "verify", slow)
    assert verify_response("<think>x</think>\\boxed{5}", "5") == Verdict(0.0, "timeout")


def test_sympy_crash_is_a_parse_error(monkeypatch):
    def crash(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(verify_module, "parse", crash)
    assert verify_response("<think>x</think>\\boxed{5}", "5") == Verdict(0.0, "parse_error")


def test_main_thread_uses_timeouts_other_threads_none():
    assert verify_module.time_limit() == verify_module.TIMEOUT_SECONDS
    seen = []
    thread = threading.Thread(target=lambda: seen.append(verify_module.time_limit()))
    thread.start()
    thread.join()
    assert seen == [None]


def test_verifier_works_off_the_main_thread():
    # signal.alarm raises ValueError off the main thread unless both timeouts are None.
    cases = [
        ("<think>a</think>\\boxed{5}", "5"),
        ("<think>a</think>\\boxed{3/4}", "0.75"),
        ("<think>a</think>\\boxed{6}", "5"),
        ("<think>a</think>\\boxed{\\frac{", "5"),
    ]
    results, errors = [], []

    def work():
        try:
            results.extend(verify_response(r, g) for r, g in cases)
        except BaseException as e:  # surfaced to the test below, not swallowed
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)
    assert not errors and [v.reason for v in results] == ["correct", "correct", "wrong", "parse_error"]


def test_score_batch_counts_every_reason():
    responses = ["<think>a</think>\\boxed{1}", "nothing", "<think>a</think>1", "<think>a</think>\\boxed{2}"]
    rewards, counts = score_batch(responses, ["1", "1", "1", "1"])
    assert rewards == [1.0, 0.0, 0.0, 0.0]
    assert counts == {"correct": 1, "wrong": 1, "no_think": 1, "no_boxed": 1, "parse_error": 0, "timeout": 0}
    assert tuple(counts) == REASONS
    assert score_batch([], []) == ([], dict.fromkeys(REASONS, 0))


def test_score_batch_length_mismatch_says_the_fix():
    with pytest.raises(ValueError, match="one gold answer per response"):
        score_batch(["a"], [])


def test_verifier_actor_keeps_math_verify_timeouts(ray_cluster):
    from orchestrator.launch import start_verifier

    verifier = start_verifier()
    assert ray_cluster.get(verifier.health.remote())["timeouts"]  # methods on the main thread
    rewards, reasons = ray_cluster.get(
        verifier.score.remote(["<think>2+2</think> \\boxed{4}", "<think>x</think> \\boxed{5}"], ["4", "4"])
    )
    assert rewards == [1.0, 0.0] and reasons["correct"] == 1 and reasons["wrong"] == 1
    ray_cluster.kill(verifier)


def test_offline_teachers_scored_in_tunes_thread_keep_the_time_limit(ray_cluster, tiny_model_path, monkeypatch):
    """A sweep's trial loads its teachers in Tune's runner thread, where math-verify would run without a
    time limit: there the verifier actor scores them, and the store is the one the main thread builds."""
    from orchestrator import launch
    from orchestrator.spec import load_trial_spec

    cfg = load_trial_spec("search_spaces/ead.yaml", ["algorithm.name=luffy"])
    scorers = []
    real = launch.load_offline_store

    def recording(cfg, tokenizer, train, score):
        scorers.append(score)
        return real(cfg, tokenizer, train, score=score)

    monkeypatch.setattr(launch, "load_offline_store", recording)
    stores = [launch.load_offline(cfg, tiny_model_path)]
    thread = threading.Thread(target=lambda: stores.append(launch.load_offline(cfg, tiny_model_path)))
    thread.start()
    thread.join()
    assert scorers[0] is score_batch and scorers[1] is not score_batch
    assert [len(s) for s in stores] == [len(stores[0])] * 2 and stores[0].format_table() == stores[1].format_table()
