"""PNG plots of a study: curves per arm with seed bands, and grad-norm spikes."""

from __future__ import annotations

import os

import numpy as np

from dllm_rl.infra.plots import fixed_margins
from dllm_rl.study import stats


def _plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _series(runs: list[dict], arm: str, key: str, source: str = "steps"):
  """(steps, values [seeds, steps]) of one arm over the steps every seed has."""
  per_seed = []
  for run in runs:
    if run["arm"] == arm:
      per_seed.append({r["step"]: r[key] for r in run[source] if r.get(key) is not None})
  if not per_seed:
    return np.zeros(0), np.zeros((0, 0))
  common = sorted(set.intersection(*(set(s) for s in per_seed)))
  return np.asarray(common), np.asarray([[s[t] for t in common] for s in per_seed], np.float64)


def _band(ax, steps, values, label, log: bool = False):
  """Mean line with a 95% t-interval band across seeds (no band with one seed), each step's
  over its seeds' finite values: a skipped update's non-finite grad norm (counted as a spike
  by the report) would make the step's mean and band NaN. ``log``: the mean and band of
  log10 of the positive values, drawn back on a log axis (a geometric mean): for quantities
  spanning decades across seeds (grad norms, ratio maxima), whose arithmetic band runs below
  zero and fills a symlog axis with ±10^10."""
  if values.size == 0:
    return
  if log:
    with np.errstate(divide="ignore", invalid="ignore"):
      values = np.where(values > 0, np.log10(values), np.nan)
  per_step = [stats.t_interval(v[np.isfinite(v)]) for v in values.T]
  mean = np.asarray([np.nan if s["mean"] is None else s["mean"] for s in per_step])
  back = (lambda x: 10.0 ** x) if log else (lambda x: x)
  line, = ax.plot(steps, back(mean), label=label)
  if values.shape[0] > 1:
    half = np.asarray([np.nan if s["half_width"] is None else s["half_width"] for s in per_step])
    ax.fill_between(steps, back(mean - half), back(mean + half), color=line.get_color(),
                    alpha=0.2)


def _suptitle(fig, text: str) -> None:
  """``text`` over the panels, 0.1 in below the figure's top edge (``fixed_margins``' ``top``
  leaves it room at any height)."""
  fig.suptitle(text, y=1 - 0.1 / fig.get_size_inches()[1], va="top")


# Positive quantities that span decades across seeds and steps: plotted on a log axis.
LOG_PANELS = ("grad_norm_max", "ratio_max")


def curves(study: dict, out_png: str,
           panels=(("val_accuracy", "evals"), ("reward_mean", "steps"),
                   ("grad_norm_max", "steps"), ("ratio_max", "steps"),
                   ("bypass_fraction", "steps"))) -> str:
  """One panel per metric, one line per arm (mean over seeds) with its 95% band; the
  :data:`LOG_PANELS` on a log axis, as geometric means (:func:`_band`)."""
  plt = _plt()
  arms = [a["name"] for a in study["arms"]]
  fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels)), squeeze=False)
  for ax, (key, source) in zip(axes[:, 0], panels):
    series = [(arm, *_series(study["runs"], arm, key, source)) for arm in arms]
    # every value 0 (no run had a gradient): nothing to draw on a log axis, so a linear one
    log = key in LOG_PANELS and any(bool(np.any(values > 0)) for _, _, values in series)
    for arm, steps, values in series:
      _band(ax, steps, values, arm, log=log)
    ax.set_ylabel(f"{key} (geometric mean)" if log else key)
    if log:
      ax.set_yscale("log")
    ax.grid(alpha=0.3)
  axes[0, 0].legend(fontsize="x-small", ncol=2)
  axes[-1, 0].set_xlabel("RL step")
  _suptitle(fig, f"{study['study']}: mean over {study['seeds']} seed(s), 95% t-band")
  fixed_margins(fig, len(panels), 1, left=1.0, top=0.5, bottom=0.55, hgap=0.4)
  os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
  fig.savefig(out_png, dpi=72)
  plt.close(fig)
  return out_png


def spikes(study: dict, out_png: str) -> str:
  """Per-step max grad norm / the run's median, every run, one panel per arm; the
  dashed line is the spike threshold."""
  plt = _plt()
  arms = [a["name"] for a in study["arms"]]
  cols = 2
  rows = (len(arms) + cols - 1) // cols
  fig, axes = plt.subplots(rows, cols, figsize=(10, 2.2 * rows), squeeze=False, sharey=True)
  for i, arm in enumerate(arms):
    ax = axes[i // cols, i % cols]
    for run in study["runs"]:
      if run["arm"] != arm:
        continue
      g = np.asarray([r.get("grad_norm_max", np.nan) for r in run["steps"]], np.float64)
      pos = g[np.isfinite(g) & (g > 0)]
      med = float(np.median(pos)) if pos.size else 1.0
      g = np.where(g > 0, g, np.nan)  # a zero norm (no signal) has no place on a log axis
      ax.plot([r["step"] for r in run["steps"]], g / med, lw=0.8, label=f"seed {run['seed']}")
    ax.axhline(stats.SPIKE_FACTOR, ls="--", color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_title(arm, fontsize="small")
    ax.grid(alpha=0.3)
  for j in range(len(arms), rows * cols):
    axes[j // cols, j % cols].axis("off")
  _suptitle(fig, "grad norm (pre-clip, max over inner steps) / run median; dashed: spike"
            " threshold")
  fixed_margins(fig, rows, cols, left=0.7, top=0.65, bottom=0.35, hgap=0.55, wgap=0.3)
  fig.savefig(out_png, dpi=72)
  plt.close(fig)
  return out_png
