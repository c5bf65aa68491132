"""The study's plots: curves with seed bands over runs that skipped non-finite updates."""

import warnings

import numpy as np

from dllm_rl.study import plots


def _run(arm, seed, grad_norms):
  return {"arm": arm, "seed": seed, "evals": [{"step": 0, "val_accuracy": 0.3}],
          "steps": [{"step": i + 1, "grad_norm_max": g, "reward_mean": 0.5, "ratio_max": 1.0,
                     "bypass_fraction": 0.0} for i, g in enumerate(grad_norms)]}


def test_band_skips_a_seeds_non_finite_grad_norm_without_a_numpy_warning(tmp_path):
  study = {"study": "stability", "seeds": 3, "arms": [{"name": "grpo"}],
           "runs": [_run("grpo", 0, [1.0, np.inf, 2.0]), _run("grpo", 1, [3.0, 1.0, 2.0]),
                    _run("grpo", 2, [2.0, 3.0, np.nan])]}
  with warnings.catch_warnings():
    warnings.simplefilter("error", RuntimeWarning)  # inf − inf in a std was the warning
    out = plots.curves(study, str(tmp_path / "c.png"))
  assert (tmp_path / "c.png").stat().st_size > 0 and out.endswith("c.png")


def test_band_mean_is_over_the_finite_seeds_of_each_step():
  lines = []

  class Ax:
    def plot(self, steps, mean, label):
      lines.append(np.asarray(mean))

      class Line:
        def get_color(self):
          return "k"
      return (Line(),)

    def fill_between(self, steps, lo, hi, **kw):
      lines.append(np.asarray(hi) - np.asarray(lo))

  values = np.asarray([[1.0, np.inf, 2.0], [3.0, 1.0, 2.0], [2.0, 3.0, np.nan]])
  plots._band(Ax(), np.arange(3), values, "grpo")
  np.testing.assert_allclose(lines[0], [2.0, 2.0, 2.0])
  assert np.all(np.isfinite(lines[1]))  # every step has ≥ 2 finite seeds: a finite band
