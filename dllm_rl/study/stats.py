"""Pure statistics of the studies: t-intervals across seeds, grad-norm spikes, collapse.

Every function takes plain sequences of floats and returns plain Python values.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

SPIKE_FACTOR = 5.0  # a step is a grad-norm spike when its max grad norm > this × the run's median


def t_interval(values: Sequence[float], level: float = 0.95) -> dict:
  """Mean and half-width of the two-sided Student-t interval for the mean:
  mean ± t_{(1+level)/2, n−1} · s/√n (s: sample standard deviation, ddof = 1).

  With n = 1 (or no values) the half-width is None: one seed has no interval.
  """
  x = np.asarray([v for v in values if v is not None], np.float64)
  n = int(x.size)
  if n == 0:
    return {"mean": None, "half_width": None, "n": 0}
  mean = float(x.mean())
  if n == 1:
    return {"mean": mean, "half_width": None, "n": 1}
  from scipy import stats  # a jax dependency
  t = float(stats.t.ppf(0.5 + level / 2, df=n - 1))
  return {"mean": mean, "half_width": t * float(x.std(ddof=1)) / math.sqrt(n), "n": n}


def _median_of_signal(x: np.ndarray) -> float:
  """Median of the finite, non-zero norms: a zero grad norm is a step without learning
  signal (every group's rewards equal, so every advantage is 0), not a small gradient."""
  x = x[np.isfinite(x) & (x > 0)]
  return float(np.median(x)) if x.size else 0.0


def spike_ratio(grad_norms: Sequence[float]) -> float | None:
  """max / median of a run's per-step grad norms (median over the steps with a
  non-zero norm; None when there is none)."""
  x = np.asarray(grad_norms, np.float64)
  med = _median_of_signal(x)
  if med == 0.0:
    return None
  return float(np.max(x[np.isfinite(x)], initial=0.0)) / med


def count_spikes(grad_norms: Sequence[float], factor: float = SPIKE_FACTOR) -> int:
  """Steps whose grad norm exceeds ``factor`` × the run's median (median over non-zero
  norms); non-finite norms count as spikes."""
  x = np.asarray(grad_norms, np.float64)
  med = _median_of_signal(x)
  return int(np.sum(~np.isfinite(x) | ((med > 0) & (x > factor * med))))


def binomial_margin(p: float, n: int, z: float = 2.0) -> float:
  """z standard errors of an accuracy p measured on n prompts: z·sqrt(p(1 − p)/n).
  The collapse margin: a fall smaller than this is evaluation noise."""
  return z * math.sqrt(max(p * (1.0 - p), 0.0) / n)


def step_grad_norms(records: Sequence[dict]) -> list[float | None]:
  """Each per-step record's gradient norm: the largest over its inner steps
  (``grad_norm_max``) where recorded, else ``grad_norm``; None where neither is."""
  return [r.get("grad_norm_max", r.get("grad_norm")) for r in records]


def signal_lost_step(steps: Sequence[int], grad_norms: Sequence[float],
                     min_fraction: float = 0.1) -> int | None:
  """The first step of the run's last stretch of zero gradient norms, when that stretch runs
  to the end and spans at least ``min_fraction`` of the steps; else None.

  A step has zero gradient when every rollout group's rewards are equal: group-relative
  advantages (GRPO, Eq. 2 of Shao et al. 2024, and every variant here) are then 0, and without
  a KL term nothing moves the policy. A policy whose rollouts all score 0 stays there: an
  absorbing state, the end of a format collapse on a task whose malformed outputs score as
  wrong answers. A short stretch at the end (every group solved) is not one.
  """
  if len(steps) != len(grad_norms):
    raise ValueError(f"{len(steps)} steps but {len(grad_norms)} gradient norms")
  n = 0
  while n < len(grad_norms) and grad_norms[len(grad_norms) - 1 - n] == 0:
    n += 1
  return steps[len(steps) - n] if n and n >= min_fraction * len(steps) else None


def all_wrong_from(records: Sequence[dict], min_fraction: float = 0.1) -> int | None:
  """The step from which every per-step record (``step``, ``accuracy``: the share of correct
  rollouts, ``grad_norm_max`` or ``grad_norm``) to the end had no correct rollout and gradient
  0 (:func:`signal_lost_step`): the absorbing state of a run whose rollouts all fail. None
  when the records do not end there or lack those metrics."""
  grads = step_grad_norms(records)
  if not records or any(g is None for g in grads):
    return None
  at = signal_lost_step([r["step"] for r in records], grads, min_fraction)
  tail = [r for r in records if at is not None and r["step"] >= at]
  return at if tail and all(r.get("accuracy") == 0 for r in tail) else None


def collapse_step(eval_steps: Sequence[int], accuracies: Sequence[float], start: float,
                  margin: float = 0.0, min_evals: int = 2) -> int | None:
  """The first evaluation step from which held-out accuracy stays below the start.

  Collapse = accuracy < ``start − margin`` at that evaluation and at every later
  one, for at least ``min_evals`` evaluations (so one noisy last evaluation is
  not a collapse). Evaluations at step 0 (the start itself) are ignored.
  Returns None when the run did not collapse.
  """
  pts = [(s, a) for s, a in zip(eval_steps, accuracies) if s > 0]
  first = None
  for s, a in pts:
    if a < start - margin:
      if first is None:
        first = s
    else:
      first = None
  if first is None:
    return None
  tail = [s for s, _ in pts if s >= first]
  return first if len(tail) >= min_evals else None


def paired(a_by_seed: dict, b_by_seed: dict, level: float = 0.95) -> dict:
  """Paired comparison of two arms that share each seed's SFT start and rollout keys:
  the per-seed differences d_s = a_s − b_s (seeds present in both, values not None), their
  mean ± Student-t half-width, and the sign count (wins: d > 0, losses: d < 0, ties)."""
  seeds = sorted(s for s in a_by_seed if s in b_by_seed
                 and a_by_seed[s] is not None and b_by_seed[s] is not None)
  diffs = [float(a_by_seed[s]) - float(b_by_seed[s]) for s in seeds]
  iv = t_interval(diffs, level)
  return {**iv, "seeds": seeds, "diffs": diffs,
          "sd": float(np.std(diffs, ddof=1)) if len(diffs) > 1 else None,
          "wins": sum(d > 0 for d in diffs), "losses": sum(d < 0 for d in diffs),
          "ties": sum(d == 0 for d in diffs)}


def quantiles(values: Sequence[float], qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict:
  """{"p50": …, "p90": …, "p99": …, "max": …} of the finite values (linear interpolation,
  numpy's default); every entry None when there is none."""
  x = np.asarray([v for v in values if v is not None], np.float64)
  x = x[np.isfinite(x)]
  keys = [f"p{round(100 * q):d}" for q in qs] + ["max"]
  if x.size == 0:
    return dict.fromkeys(keys)
  return {**{k: float(np.quantile(x, q)) for k, q in zip(keys, qs)}, "max": float(x.max())}


def seeds_to_decide(sd: float | None, effect: float, level: float = 0.95) -> int | None:
  """Seeds n for which the paired t-interval of a difference with standard deviation ``sd``
  would exclude 0 if the true difference were ``effect``: the least n ≥ 2 with
  t_{(1+level)/2, n−1}·sd/√n < |effect|. None when sd or effect is missing or effect is 0;
  more than 1000 is reported as 1001 (the effect is too small to resolve by seeds). At that n
  a study of the true ``effect`` and ``sd`` resolves it about half the time (the interval's
  centre falls on either side of the effect); ~2n seeds give ~80% (power ≈ 0.8 needs
  (t_{0.975} + t_{0.8})² ≈ 2.0 × t_{0.975}²)."""
  if sd is None or not effect:
    return None
  if sd == 0:
    return 2
  from scipy import stats
  for n in range(2, 1001):
    if float(stats.t.ppf(0.5 + level / 2, df=n - 1)) * sd / math.sqrt(n) < abs(effect):
      return n
  return 1001


def one_sided_p(comparison: dict) -> float | None:
  """The one-sided p-value of a :func:`paired` comparison's claim "the first arm is higher":
  P(T_{n−1} ≥ mean / (sd/√n)) under a true mean difference of 0 (Student t, ddof = 1), so
  p < 0.025 exactly when the 95% two-sided interval lies above 0 (:func:`verdict`'s
  "reproduced"). None with fewer than 2 seeds; with sd = 0, 0.0 above 0, 1.0 otherwise."""
  n, mean, sd = comparison["n"], comparison["mean"], comparison.get("sd")
  if n < 2 or sd is None:
    return None
  if sd == 0:
    return 0.0 if mean > 0 else 1.0
  from scipy import stats
  return float(stats.t.sf(mean / (sd / math.sqrt(n)), df=n - 1))


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
  """Holm's step-down rule (Holm 1979) at family-wise error ``alpha``: which hypotheses it
  rejects. With the m p-values sorted ascending, the i-th (i = 1..m) is rejected while
  p_(i) ≤ alpha / (m − i + 1); the first that is not stops it, and every later one stands.
  A NaN p-value counts in m, sorts last and is never rejected (it compares false with any
  threshold, and as a sort key it would scramble the order of the others)."""
  m = len(p_values)
  rejected = [False] * m
  order = sorted(range(m), key=lambda i: (math.isnan(p_values[i]), p_values[i]))
  for rank, i in enumerate(order):
    if not p_values[i] <= alpha / (m - rank):
      break
    rejected[i] = True
  return rejected


class Verdict(str):
  """A :func:`verdict` string that keeps its comparison's :func:`one_sided_p`
  (``p_one_sided``), for a family-wise rule over a report section's verdicts."""

  p_one_sided: float | None

  def __new__(cls, text: str, p_one_sided: float | None):
    obj = super().__new__(cls, text)
    obj.p_one_sided = p_one_sided
    return obj


def verdict(comparison: dict, min_effect: float, what: str) -> Verdict:
  """The verdict on the claim "``what`` is larger" from a :func:`paired` comparison.

  * fewer than 2 paired seeds: "not established (n seed(s))";
  * the interval lies above 0: "reproduced";
  * the interval lies below 0: "not reproduced (the opposite holds)";
  * the interval lies inside (−min_effect, min_effect): "not reproduced (no difference as
    large as min_effect)" — an equivalence result, not a lack of data;
  * otherwise "inconclusive (the interval includes 0)", with the seeds that would decide an
    effect the size of the observed mean (or of min_effect, whichever is larger).

  Returned as a :class:`Verdict`: the text, and the comparison's :func:`one_sided_p`.
  """
  return Verdict(_verdict_text(comparison, min_effect, what), one_sided_p(comparison))


def _verdict_text(comparison: dict, min_effect: float, what: str) -> str:
  """:func:`verdict`'s text."""
  n, mean, hw = comparison["n"], comparison["mean"], comparison["half_width"]
  if n < 2 or hw is None:
    return f"not established ({n} seed(s); a paired interval needs ≥ 2)"
  lo, hi = mean - hw, mean + hw
  if lo > 0:
    return "reproduced"
  if hi < 0:
    return f"not reproduced (the opposite holds: {what} is lower)"
  if -min_effect < lo and hi < min_effect:
    return (f"not reproduced (no difference as large as {min_effect:g}: the interval lies"
            f" inside ±{min_effect:g})")
  need = seeds_to_decide(comparison["sd"], max(abs(mean), min_effect))
  about = "more than 1000" if need > 1000 else f"about {need}"  # 1001: none up to 1000 does
  return (f"inconclusive (the interval includes 0; {about} seeds would resolve a difference"
          f" of {max(abs(mean), min_effect):.3g})")
