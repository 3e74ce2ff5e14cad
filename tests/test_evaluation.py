"""Benchmark metrics: hand-worked cases, a brute-force reference for pass@k, and the table row's keys."""

import itertools
import math
import threading

import pytest

from trainables.evaluation import (
    answers_equal,
    avg_at_k,
    extract_answer,
    judge,
    macro_average,
    majority_answer,
    majority_at_n,
    mean_pass_at_k,
    mean_worst_at_k,
    metric_key,
    pass_at_k,
    summarize,
    summary_keys,
    worst_at_k,
)

# --- pass@k / worst@k -------------------------------------------------------------------------------


def test_pass_at_k_edges():
    assert pass_at_k(8, 0, 4) == 0.0
    assert pass_at_k(8, 8, 4) == 1.0
    assert pass_at_k(5, 1, 5) == 1.0  # k = n: the one correct sample is always drawn
    assert pass_at_k(5, 0, 5) == 0.0


def test_pass_at_k_hand_worked():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n


def _brute_force_pass(n, c, k):
    """The fraction of k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def _brute_force_worst(n, c, k):
    subsets = list(itertools.combinations(range(n), k))
    return sum(all(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n, c, k", [(4, 1, 2), (6, 2, 3), (7, 3, 2), (8, 5, 4), (9, 0, 3), (9, 9, 9), (6, 1, 6)])
def test_pass_and_worst_match_enumeration(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(_brute_force_pass(n, c, k))
    assert worst_at_k(n, c, k) == pytest.approx(_brute_force_worst(n, c, k))


def test_pass_at_k_is_stable_for_large_n():
    value = pass_at_k(256, 3, 128)
    assert value == pytest.approx(1 - math.comb(253, 128) / math.comb(256, 128))
    assert 0.0 < value < 1.0


def test_worst_at_k_hand_worked():
    assert worst_at_k(5, 2, 2) == pytest.approx(1 / 10)  # C(2,2)/C(5,2)
    assert worst_at_k(5, 3, 2) == pytest.approx(math.comb(3, 2) / math.comb(5, 2))  # 0.3
    assert worst_at_k(5, 1, 2) == 0.0  # c < k
    assert worst_at_k(4, 4, 4) == 1.0
    assert worst_at_k(10, 7, 1) == pytest.approx(0.7)  # worst@1 = pass@1 = c / n


@pytest.mark.parametrize(
    "args, name",
    [
        ((5, 6, 1), "c"),
        ((5, -1, 1), "c"),
        ((5, 2, 0), "k"),
        ((5, 2, 6), "k"),
    ],
)
def test_bad_counts_name_the_argument(args, name):
    for metric in (pass_at_k, worst_at_k):
        with pytest.raises(ValueError, match=rf"^{name} ") as error:
            metric(*args)
        assert "\n" not in str(error.value)


# --- dataset means ----------------------------------------------------------------------------------


def test_avg_at_k():
    correct = [[True, False, False, False], [True, True, True, True], [False, False, False, False]]
    assert avg_at_k(correct) == pytest.approx((0.25 + 1.0 + 0.0) / 3)
    assert avg_at_k([[True, False], [True, True, True, False]]) == pytest.approx((0.5 + 0.75) / 2)


def test_dataset_means_allow_own_n():
    correct = [[True, False, False, False, False], [True, True, False]]  # n = 5, c = 1 and n = 3, c = 2
    assert mean_pass_at_k(correct, 2) == pytest.approx((pass_at_k(5, 1, 2) + pass_at_k(3, 2, 2)) / 2)
    assert mean_pass_at_k(correct, 2) == pytest.approx((0.4 + 1.0) / 2)
    assert mean_worst_at_k(correct, 2) == pytest.approx((0.0 + 1 / 3) / 2)


def test_empty_problems_are_refused():
    with pytest.raises(ValueError, match="correct_per_problem"):
        avg_at_k([])
    with pytest.raises(ValueError, match=r"correct_per_problem\[1\]"):
        mean_pass_at_k([[True], []], 1)
    with pytest.raises(ValueError, match="per_benchmark"):
        macro_average({})


def test_macro_average_is_unweighted():
    assert macro_average({"aime24": 0.2, "math500": 0.8, "amc": 0.5}) == pytest.approx(0.5)


# --- answers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, answer",
    [
        ("<think>half</think>So \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("<think>x</think>\\boxed{\\sqrt{\\frac{a}{b}}} done", "\\sqrt{\\frac{a}{b}}"),
        ("<think>x</think>\\boxed{8} or \\boxed {7}", "7"),  # the last box
        ("<think>\\boxed{3}</think>final \\boxed{ 4 }", "4"),  # after the last </think>
        ("\\boxed{7}", None),  # no think block
        ("<think>\\boxed{7}</think>so 7", None),  # the box is only before </think>
        ("<think>x</think>no box", None),
        ("<think>x</think>\\boxed{\\frac{1}{2}", None),  # never closes
        ("<think>x</think>\\boxed{}", None),
    ],
)
def test_extract_answer(response, answer):
    assert extract_answer(response) == answer


@pytest.mark.parametrize(
    "a, b, equal",
    [
        ("1/2", "0.5", True),
        ("0.5", "\\frac{1}{2}", True),
        ("1/2", "1/3", False),
        ("x+1", "1+x", True),
        ("B", "b", True),
        ("B", "C", False),
        ("I", "i", True),  # a choice letter, not the imaginary unit
        ("E", "2.718281828", False),  # nor Euler's number
        ("\\frac{", "1/2", False),
        ("1/2", "\\frac{", False),
        ("", "1/2", False),
        ("{{{{}", "\\sqrt[}{}^^}", False),
    ],
)
def test_answers_equal(a, b, equal):
    assert answers_equal(a, b) is equal


def test_answers_equal_off_the_main_thread():
    results = []
    worker = threading.Thread(target=lambda: results.append(answers_equal("3/4", "0.75")))
    worker.start()
    worker.join()
    assert results == [True]  # no signal.alarm off the main thread, so no ValueError from math-verify


# --- majority vote ----------------------------------------------------------------------------------


def test_majority_groups_under_math_verify():
    # Three spellings of one half outvote two identical strings of one third.
    answers = ["1/3", "1/2", "1/3", "0.5", "\\frac{1}{2}"]
    assert majority_answer(answers) == "1/2"
    assert majority_answer(answers, equal=str.__eq__) == "1/3"  # plain equality sees 2 vs 1 vs 1 vs 1


def test_majority_ignores_none():
    assert majority_answer([None, None, "7", None, None]) == "7"
    assert majority_answer([None, None]) is None
    assert majority_answer([]) is None


def test_majority_tie_goes_to_the_first_group():
    assert majority_answer(["3", "4", "4", "3"]) == "3"
    assert majority_answer(["4", "3", "3", "4"]) == "4"


def test_majority_multiple_choice():
    assert majority_answer(["C", "b", "B", "c", "b"]) == "b"


def test_majority_at_n():
    answers = [["1/2", "0.5", "1/3", "1/3", "1/3"], [None, "6", None, "5", "5"], [None, None, None, None, None]]
    golds = ["\\frac{1}{2}", "6", "1"]
    assert majority_at_n(answers, golds) == 0.0  # 1/3 wins the first, 5 the second, no vote in the third
    assert majority_at_n(answers, golds, n=2) == pytest.approx(2 / 3)  # 1/2 and 6 win
    assert majority_at_n(answers, golds, n=4) == pytest.approx(2 / 3)  # 2-2 and 1-1 ties: the first group wins


def test_majority_at_n_bad_arguments():
    with pytest.raises(ValueError, match="^answers_per_problem "):
        majority_at_n([["1"]], ["1", "2"])
    with pytest.raises(ValueError, match="^n ") as error:
        majority_at_n([["1", "1"], ["2"]], ["1", "2"], n=2)
    assert "\n" not in str(error.value)


# --- table row --------------------------------------------------------------------------------------


def test_summarize_keys_and_values_for_eight_samples():
    correct = [[True] * 8, [True, False] * 4, [False] * 8]
    answers = [["5"] * 8, ["1/2", "2"] * 4, ["x"] * 8]
    golds = ["5", "0.5", "3"]
    row = summarize(correct, answers, golds)
    assert list(row) == ["avg@8", "pass@1", "pass@2", "pass@4", "pass@8", "maj@1", "maj@2", "maj@4", "maj@8", "worst@8"]
    assert row["avg@8"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert row["pass@1"] == pytest.approx(row["avg@8"])
    assert row["pass@2"] == pytest.approx((1 + pass_at_k(8, 4, 2) + 0) / 3)
    assert row["pass@8"] == pytest.approx(2 / 3)
    assert row["maj@8"] == pytest.approx(2 / 3)  # the 4-4 tie goes to "1/2", which is 0.5
    assert row["maj@1"] == row["maj@2"] == row["maj@4"] == pytest.approx(2 / 3)
    assert row["worst@8"] == pytest.approx(1 / 3)


def test_summarize_uses_the_fewest_samples():
    correct = [[True, False, True, True, False, False], [True, True, False, False, False, False, True]]
    answers = [["1"] * 6, ["2"] * 7]
    row = summarize(correct, answers, ["1", "2"])
    assert list(row) == ["avg@6", "pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4", "maj@6", "worst@6"]
    assert row["avg@6"] == pytest.approx((3 / 6 + 2 / 6) / 2)  # the first 6 of the 7 samples
    assert row["pass@1"] == pytest.approx((3 / 6 + 3 / 7) / 2)  # the unbiased estimator uses all 7


@pytest.mark.parametrize("k", [1, 2, 3, 6, 8, 16])
def test_summary_keys_name_the_row_before_it_is_computed(k):
    # Specs check their objective against these names before any trial runs.
    row = summarize([[True] * k, [False] * k], [["1"] * k, [None] * k], ["1", "2"])
    assert list(row) == summary_keys(k)
    assert metric_key(f"maj@{k}") == f"maj_at_{k}"


def test_judge_math_by_reward_and_choices_by_letter():
    math = ["<think>half</think> \\boxed{0.5}", "\\boxed{0.5}", "<think>x</think> \\boxed{2}"]
    assert judge(math, "\\frac{1}{2}", multiple_choice=False) == ([True, False, False], ["0.5", None, "2"])
    letters = ["<think>t</think> \\boxed{b}", "<think>t</think> \\boxed{C}"]
    assert judge(letters, "B", multiple_choice=True) == ([True, False], ["b", "C"])


def test_majority_grows_with_n_when_the_right_answer_is_the_mode_but_not_the_first():
    answers = [["3", "4", "4", "4"], ["9", "9", "7", "7"]]  # gold 4: wrong first, the mode of 4
    row = summarize([[a == g for a in per] for per, g in zip(answers, ["4", "7"])], answers, ["4", "7"])
    assert (row["maj@1"], row["maj@2"], row["maj@4"]) == (0.0, 0.0, 0.5)  # 3 / (3-4 tie: 3) / 4; 9-7 tie: 9


def test_answer_formats():
    trained = "<think>7+8</think> so \\boxed{15}"
    chat = "7 + 8 = 15\n\nThe final answer is 15."
    qwen = "7 + 8 = \\boxed{15}"
    assert [extract_answer(t, "think") for t in (trained, chat, qwen)] == ["15", None, None]
    assert [extract_answer(t, "boxed") for t in (trained, chat, qwen)] == ["15", None, "15"]
    assert [extract_answer(t, "last_number") for t in (trained, chat, qwen)] == ["15", "15", "15"]
    assert extract_answer("it is -1/2.", "last_number") == "-1/2"
    assert judge([chat, qwen], "15.0", multiple_choice=False, answer_format="last_number") == (
        [True, True],
        ["15", "15"],
    )
    assert judge([chat, qwen], "15", multiple_choice=False) == ([False, False], [None, None])
    with pytest.raises(ValueError, match="answer_format must be one of think, boxed, last_number"):
        extract_answer(chat, "loose")


def test_summarize_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="^correct_per_problem and answers_per_problem"):
        summarize([[True, False]], [["1"]], ["1"])
