"""Training curves from a metrics.jsonl: one panel per metric (or group of metrics) vs step.

A panel is a metric key, or a :class:`Panel` of several keys on one axis, optionally
logarithmic (the importance ratios of an RL run span 1 to 1e12). Keys a run did not log are
left out; non-finite values (and, on a log axis, values <= 0) are not drawn.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

from dllm_rl import paths
from dllm_rl.infra.observability import read_metrics


@dataclasses.dataclass(frozen=True)
class Panel:
  """Metric keys drawn on one axis; ``log``: a logarithmic y axis."""

  keys: tuple[str, ...]
  log: bool = False

  @classmethod
  def of(cls, spec: str | Panel) -> Panel:
    return spec if isinstance(spec, Panel) else cls((spec,))


def _points(records, key: str, phase: str, log: bool) -> list[tuple[int, float]]:
  """(step, value) of ``key`` in ``phase``'s records that a (log) axis can draw."""
  out = []
  for r in records:
    v = r.get(key)
    if r.get("phase", "") != phase or isinstance(v, bool) or not isinstance(v, (int, float)):
      continue
    if math.isfinite(v) and (v > 0 or not log):
      out.append((r["step"], v))
  return out


def curves_figure(records, panels: Sequence[str | Panel], *, phase: str | None = None):
  """A matplotlib figure of ``records`` (read_metrics'), one subplot per panel that has data
  (``phase``: the records are of that phase only, so the legend names keys alone)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  present = [p for p in map(Panel.of, panels) if any(k in r for r in records for k in p.keys)]
  n = max(len(present), 1)
  fig, axes = plt.subplots(n, 1, figsize=(_WIDTH_IN, _PANEL_IN * n), squeeze=False)
  for ax, panel in zip(axes[:, 0], present):
    lines = 0
    for key in panel.keys:
      for ph in sorted({r.get("phase", "") for r in records if key in r}):
        pts = _points(records, key, ph, panel.log)
        if pts:
          steps, values = zip(*pts)
          label = " ".join(x for x in (ph if phase is None else "", key) if x)
          ax.plot(steps, values, label=label, marker="." if len(pts) < 50 else None)
          lines += 1
    if panel.log:
      ax.set_yscale("log")
    ax.set_ylabel(" / ".join(panel.keys) + (" (log)" if panel.log else ""), fontsize="small")
    ax.grid(alpha=0.3)
    if lines > 1:
      ax.legend(fontsize="small")
  if not present:
    axes[0, 0].text(0.5, 0.5, f"no data for {[p.keys for p in map(Panel.of, panels)]}",
                    ha="center", va="center")
  axes[-1, 0].set_xlabel("step")
  fixed_margins(fig, n, 1, left=_LEFT_IN, right=_RIGHT_IN, top=_TOP_IN, bottom=_BOTTOM_IN,
                hgap=_GAP_IN)
  return fig


_WIDTH_IN, _PANEL_IN = 6.0, 2.2  # figure width; height per panel (inches)
_LEFT_IN, _RIGHT_IN, _TOP_IN, _BOTTOM_IN, _GAP_IN = 1.0, 0.15, 0.15, 0.55, 0.4


def fixed_margins(fig, rows: int, cols: int, *, left: float, top: float, bottom: float,
                  hgap: float, wgap: float = 0.0, right: float = 0.2) -> None:
  """The figure's margins and the gaps between its ``rows`` × ``cols`` panels in inches (room
  for tick labels, axis labels, panel titles and a suptitle): the same page as
  ``tight_layout``, which measures every text box and took ~40% of a plot's time."""
  width, height = fig.get_size_inches()
  axes_h = (height - top - bottom - (rows - 1) * hgap) / rows
  axes_w = (width - left - right - (cols - 1) * wgap) / cols
  fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                      top=1 - top / height, hspace=hgap / axes_h, wspace=wgap / axes_w)


def plot_metrics(metrics_path: str, out_png: str, panels: Sequence[str | Panel], *,
                 phase: str | None = None) -> str:
  """:func:`curves_figure` of a metrics.jsonl (or its workdir), of one ``phase`` or all (one
  line per phase and key), as a PNG; returns ``out_png``."""
  fig = curves_figure(read_metrics(metrics_path, phase=phase), panels, phase=phase)
  import matplotlib.pyplot as plt  # after curves_figure chose the Agg backend
  out = paths.resolve(out_png)
  out.parent.mkdir(parents=True, exist_ok=True)
  with out.open("wb") as fh:
    fig.savefig(fh, dpi=100, format="png")
  plt.close(fig)
  return os.fspath(out_png)
