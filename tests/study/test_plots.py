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


class _Ax:
  """Records the mean line and the band's (lo, hi) that _band draws."""

  def __init__(self):
    self.lines = []

  def plot(self, steps, mean, label):
    self.lines.append(np.asarray(mean))

    class Line:
      def get_color(self):
        return "k"
    return (Line(),)

  def fill_between(self, steps, lo, hi, **kw):
    self.lines.append((np.asarray(lo), np.asarray(hi)))


def test_band_mean_is_over_the_finite_seeds_of_each_step():
  ax = _Ax()
  values = np.asarray([[1.0, np.inf, 2.0], [3.0, 1.0, 2.0], [2.0, 3.0, np.nan]])
  plots._band(ax, np.arange(3), values, "grpo")
  np.testing.assert_allclose(ax.lines[0], [2.0, 2.0, 2.0])
  lo, hi = ax.lines[1]
  assert np.all(np.isfinite(hi - lo))  # every step has ≥ 2 finite seeds: a finite band


def test_log_band_is_a_geometric_mean_whose_band_stays_positive():
  """Ratio maxima 1 and 10^10 across seeds: the arithmetic band runs far below 0 (it filled
  the symlog panel with ±10^10); the log band is 10^(mean ± t·sd of log10), above 0, around
  the geometric mean 10^5. A zero (no signal) is left out, as on the log axis."""
  values = np.asarray([[1.0, 1.0], [1e10, 1e10], [0.0, 1e5]])
  ax = _Ax()
  plots._band(ax, np.arange(2), values, "grpo")
  assert ax.lines[1][0].min() < -1e9
  ax = _Ax()
  plots._band(ax, np.arange(2), values, "grpo", log=True)
  np.testing.assert_allclose(ax.lines[0], [1e5, 1e5])
  lo, hi = ax.lines[1]
  assert np.all(lo > 0) and np.all(lo < 1e5) and np.all(hi > 1e5)
  np.testing.assert_allclose(lo * hi, [1e10, 1e10])  # symmetric in log10 around 10^5


def test_curves_of_runs_without_any_gradient_draw_a_linear_axis(tmp_path):
  """Every grad norm 0 (every group's rewards equal, e.g. all wrong from the start): nothing
  can be drawn on the log axis, which raised in matplotlib's layout and lost the report."""
  study = {"study": "stability", "seeds": 2, "arms": [{"name": "grpo"}],
           "runs": [_run("grpo", 0, [0.0, 0.0]), _run("grpo", 1, [0.0, 0.0])]}
  plots.curves(study, str(tmp_path / "c.png"))
  assert (tmp_path / "c.png").stat().st_size > 0


def test_spikes_title_clears_the_panel_titles_of_every_stability_arm(tmp_path, monkeypatch):
  """The spikes figure of the stability study's arms (10 rows of 2): its title stays above
  the first row's panel titles (under ``tight_layout`` it sat at 98% of the figure's height,
  over them, in every full stability report)."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  from dllm_rl.config.defaults import get_config
  from dllm_rl.study import arms as arms_lib
  arms = [a.name for a in arms_lib.STUDIES.get("stability")(get_config())]
  assert len(arms) >= 19  # 10 rows
  saved, save = [], Figure.savefig
  monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: saved.append(fig) or save(
      fig, *a, **k))
  study = {"study": "stability", "seeds": 1, "arms": [{"name": a} for a in arms],
           "runs": [_run(a, 0, [1.0, 2.0]) for a in arms]}
  plots.spikes(study, str(tmp_path / "s.png"))
  (fig,) = saved
  renderer = FigureCanvasAgg(fig).get_renderer()
  titles = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
  assert len(titles) == len(arms)
  assert fig._suptitle.get_window_extent(renderer).y0 > max(t.y1 for t in titles)
