"""Sample completions in the workdir: ``samples.jsonl`` lines and their TensorBoard text.

Every ``log.samples_every`` steps a training phase logs a few completions
(`MetricsLogger.log_samples`), one JSON object per completion::

  {"phase": "rl", "step": 40, "time": 1718000000.1, "index": 1234, "prompt": "...",
   "answer": "42", "completion": "...", "parsed": "42", "reward": 1.0, "correct": true}

``index`` is the example's row in its split (the training split for RL rollouts, the validation
split for SFT). A resumed phase drops its lines of steps after the checkpoint it restored
(:func:`keep_until`), as metrics.jsonl does. Pure functions; the file itself is written by
dllm_rl.infra.observability.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

SAMPLES_FILE = "samples.jsonl"
_ORDER = ("index", "prompt", "answer", "completion", "parsed", "reward", "correct")


def _plain(value: Any) -> Any:
  """A JSON-ready value: non-finite floats as "nan"/"inf"/"-inf" (strict JSON)."""
  if isinstance(value, float) and not math.isfinite(value):
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
  return value


def sample_lines(phase: str, step: int, records: Sequence[Mapping[str, Any]],
                 now: float) -> list[str]:
  """One samples.jsonl line per record, each led by phase, step and time."""
  return [json.dumps({"phase": phase, "step": int(step), "time": now,
                      **{k: _plain(v) for k, v in r.items()}}, allow_nan=False)
          for r in records]


def columns(records: Sequence[Mapping[str, Any]]) -> list[str]:
  """The records' fields: the usual ones first, then any others in first-seen order."""
  seen = list(dict.fromkeys(k for r in records for k in r))
  return [k for k in _ORDER if k in seen] + [k for k in seen if k not in _ORDER]


def _block(text: Any) -> str:
  """``text`` as a markdown code block (indented: whatever the text holds, no fence to break)."""
  return "\n".join("    " + line for line in str(text).splitlines() or [""])


def markdown(records: Sequence[Mapping[str, Any]]) -> str:
  """The records as markdown (TensorBoard's text tab): a header line per record with its
  index, reward, correctness and answers, then the prompt and completion verbatim."""
  parts = []
  for r in records:
    head = [f"**#{r.get('index', '?')}**", f"reward {r.get('reward')}",
            "correct" if r.get("correct") else "wrong"]
    head += [f"{k} `{r[k]}`" for k in ("answer", "parsed") if r.get(k) is not None]
    head += [f"{k} {r[k]}" for k in columns([r]) if k not in _ORDER]
    parts.append(" · ".join(head) + "\n\nprompt:\n\n" + _block(r.get("prompt", ""))
                 + "\n\ncompletion:\n\n" + _block(r.get("completion", "")))
  return "\n\n---\n\n".join(parts)


def keep_until(lines: Sequence[str], phase: str, step: int) -> list[str]:
  """The samples.jsonl ``lines`` a phase resumed at ``step`` keeps: all but its lines of later
  steps (about to be redone) and lines cut short by a crash."""
  kept = []
  for line in lines:
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if not (record.get("phase") == phase and record.get("step", 0) > step):
      kept.append(line)
  return kept


def read_samples(text: str, phase: str | None = None) -> list[dict[str, Any]]:
  """The records of a samples.jsonl's ``text`` (optionally one phase); a cut line is skipped."""
  out = []
  for line in text.splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if phase is None or record.get("phase") == phase:
      out.append(record)
  return out
