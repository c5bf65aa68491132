"""The study's statistics: t-interval, grad-norm spikes, collapse detection."""

import math

import numpy as np
import pytest

from dllm_rl.study import stats


def test_t_interval_matches_the_t_quantile_by_hand():
  x = [0.2, 0.4, 0.3]
  iv = stats.t_interval(x)
  s = np.std(x, ddof=1)
  # t_{0.975, 2} = 4.302652729...
  assert iv["mean"] == pytest.approx(0.3)
  assert iv["half_width"] == pytest.approx(4.302652729911275 * s / math.sqrt(3), rel=1e-9)
  assert iv["n"] == 3
  # wider with fewer seeds at the same spread, narrower with more
  assert stats.t_interval([0.2, 0.4])["half_width"] > iv["half_width"]


def test_t_interval_with_one_or_no_value_has_no_width():
  assert stats.t_interval([0.5]) == {"mean": 0.5, "half_width": None, "n": 1}
  assert stats.t_interval([None, 0.5])["n"] == 1
  assert stats.t_interval([])["mean"] is None


def test_spike_ratio_and_count_use_the_median_of_nonzero_norms():
  g = [1.0, 1.0, 2.0, 1.0, 12.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # zeros: steps without signal
  assert stats.spike_ratio(g) == pytest.approx(12.0)  # median of non-zero = 1
  assert stats.count_spikes(g) == 1                    # 12 > 5 × 1; 2 is not
  assert stats.count_spikes(g, factor=1.5) == 2
  assert stats.count_spikes([1.0, float("nan"), 1.0]) == 1  # a non-finite norm is a spike
  assert stats.spike_ratio([0.0, 0.0]) is None
  assert stats.count_spikes([0.0, 0.0]) == 0


def test_collapse_needs_accuracy_to_stay_below_the_start():
  steps = [0, 10, 20, 30, 40]
  assert stats.collapse_step(steps, [0.3, 0.2, 0.1, 0.0, 0.0], start=0.3) == 10
  # recovers above the start: the dip is not a collapse
  assert stats.collapse_step(steps, [0.3, 0.1, 0.0, 0.35, 0.4], start=0.3) is None
  # dips, recovers, then falls for good: collapse from the last fall
  assert stats.collapse_step(steps, [0.3, 0.1, 0.4, 0.2, 0.1], start=0.3) == 30
  # one low final evaluation is noise, not a collapse
  assert stats.collapse_step(steps, [0.3, 0.4, 0.4, 0.4, 0.2], start=0.3) is None
  assert stats.collapse_step(steps, [0.3, 0.4, 0.4, 0.4, 0.2], start=0.3, min_evals=1) == 40
  # the margin tolerates evaluation noise
  assert stats.collapse_step(steps, [0.3, 0.29, 0.28, 0.29, 0.28], start=0.3, margin=0.03) is None


def test_binomial_margin_is_z_standard_errors():
  assert stats.binomial_margin(0.3, 256) == pytest.approx(2 * math.sqrt(0.21 / 256))
  assert stats.binomial_margin(0.0, 256) == 0.0
  assert stats.binomial_margin(0.3, 256, z=1.0) < stats.binomial_margin(0.3, 64, z=1.0)


def _study(collapses: dict, seeds: int = 3):
  """A synthetic stability study: {arm: [collapsed per seed]}."""
  runs = [{"arm": arm, "seed": s, "summary": {"rl_accuracy": 0.1},
           "stats": {"collapsed": c, "grad_spikes": 0}}
          for arm, cs in collapses.items() for s, c in enumerate(cs)]
  return {"seeds": seeds, "arms": [{"name": a} for a in collapses], "runs": runs}


def test_stability_verdict_rules():
  from dllm_rl.study.report import stability_verdict
  v = lambda c, seeds=3: stability_verdict(_study(c, seeds))[0]
  assert v({"grpo@a": [1, 1, 0], "stabledrl@a": [0, 0, 0]}).startswith("reproduced")
  assert v({"grpo@a": [1, 0, 0], "stabledrl@a": [0, 0, 0]}).startswith("inconclusive")
  assert v({"grpo@a": [0, 0, 0], "stabledrl@a": [0, 0, 0],
            "grpo@b": [1, 1, 1], "stabledrl@b": [1, 1, 1]}).startswith("not reproduced")
  assert v({"grpo@a": [1, 1, 1], "stabledrl@a": [1, 1, 1]}).startswith("not testable")
  one = v({"grpo@a": [1], "stabledrl@a": [0]}, seeds=1)
  assert one.startswith("not established") and "indicative" in one
