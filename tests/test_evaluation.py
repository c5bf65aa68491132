"""Evaluation metrics: unbiased pass@k against a brute-force count."""

import itertools

import numpy as np
import pytest

from dllm_rl.train import evaluation
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


def test_verify_groups_marks_malformed_completions_which_score_as_wrong_answers():
  """A completion the verifier cannot parse gets reward 0, as a wrong answer does: the mask
  (and the RL step's ``malformed_fraction``) is what tells a format collapse from learning."""
  from dllm_rl.tasks import CharTokenizer, make_task
  from dllm_rl.train.evaluation import verify_groups
  task, tok = make_task("sum_split", num_digits=2), CharTokenizer()
  ex = next(e for e in task.generate("train", 2000, 0) if e.meta["target"] == 46)
  texts = [["32+32", "33+41", "60098", "11++5"]]  # correct, wrong sum, no "+", two "+"
  width = max(len(t) for t in texts[0]) + 1
  completions = np.full((1, 4, width), tok.eos_id, np.int32)
  for j, t in enumerate(texts[0]):
    completions[0, j, :len(t)] = tok.encode(t)
  graded = verify_groups(task, tok, [ex], completions)
  np.testing.assert_array_equal(graded.correct_BG, [[True, False, False, False]])
  np.testing.assert_array_equal(graded.rewards_BG, [[1.0, 0.0, 0.0, 0.0]])
  np.testing.assert_array_equal(graded.malformed_BG, [[False, False, True, True]])
  assert graded.parsed[0][:2] == ["23+23", "33+14"] and graded.parsed[0][2:] == texts[0][2:]



@pytest.mark.parametrize("parallel", [False, True])
def test_a_verifier_that_returns_no_verify_result_is_named(parallel):
  """A new task's verify returning a bool is named at the first verification, with its class
  and module, not as an AttributeError of the code that reads the result."""
  from dllm_rl.tasks import make_task

  class BoolVerifier(type(make_task("sum_split"))):
    parallel_verify = parallel

    def verify(self, example, completion):
      return completion == example.answer

  task = BoolVerifier(num_digits=2)
  ex = task.generate("train", 1, 0)[0]
  with pytest.raises(TypeError, match=r"task.name='sum_split': BoolVerifier.verify \(tests\."
                     r"test_evaluation\) returned bool; .*VerifyResult"):
    evaluation.verify_all(task, [(ex, ex.answer), (ex, "")])

def test_greedy_completions_do_not_depend_on_the_batch_size_unless_the_order_is_random():
  """docs/models.md "Evaluate": greedy figures do not depend on eval.batch_size (padded last batch
  included); with sampler.remasking=random the order is drawn from each batch's key, so they
  may (docs/models.md says so)."""
  import jax

  from dllm_rl.models import transformer as T
  from dllm_rl.sampling import sampler as S
  from tests.helpers import small_model

  g, params = T.init_model(small_model(vocab_size=24, n_layers=1),
                           jax.random.key(0))
  prompts = np.asarray(jax.random.randint(jax.random.key(7), (5, 6), 3, 24), np.int32)
  valid = np.ones((5, 6), bool)
  valid[0, :2] = False

  def run(remasking):
    cfg = S.SamplerConfig(completion_len=4, steps=2, block_len=4, remasking=remasking)
    fn = evaluation.make_sample_fn(g, cfg, mask_id=2, eos_id=1)
    return [evaluation.generate(fn, params, prompts, valid, jax.random.key(0), batch_size)
            for batch_size in (2, 5)]

  np.testing.assert_array_equal(*run("low_confidence"))
  assert not np.array_equal(*run("random"))
