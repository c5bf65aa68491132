"""Evaluation metrics: unbiased pass@k against a brute-force count."""

import itertools

import numpy as np
import pytest

from dllm_rl.train.evaluation import pass_at_k


@pytest.mark.parametrize("n", [1, 3, 6])
def test_pass_at_k_equals_brute_force_over_all_k_subsets(n):
  for c in range(n + 1):
    outcomes = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
      subsets = list(itertools.combinations(outcomes, k))
      brute = np.mean([any(s) for s in subsets])
      assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_1_is_the_success_rate_and_bad_input_is_rejected():
  assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
  with pytest.raises(ValueError):
    pass_at_k(4, 2, 5)
  with pytest.raises(ValueError):
    pass_at_k(4, 5, 1)


def test_distinct_correct_counts_distinct_correct_answers_per_prompt():
  from dllm_rl.train.evaluation import distinct_correct
  parsed = [["1+2*3", "2*3+1", "1+2*3", "7"], ["9", "x", "9", "9"]]
  correct = [[True, True, True, False], [False, False, False, False]]
  assert distinct_correct(parsed, correct) == pytest.approx((2 + 0) / 2)
  assert distinct_correct([["a", "b"]], [[True, True]]) == 2.0
