"""Tiny CPU config: the embedded default (dllm_rl/config/defaults.py), as a file to copy.

Masked-diffusion SFT of a 0.1M-parameter model on 3-digit addition. Run
(2 CPU cores, about a minute):

    python -m dllm_rl.main --config=configs/tiny_cpu.py --workdir=/tmp/dllm_tiny

What you should see: a progress bar for SFT, validation accuracy every
``sft.eval_every`` steps in metrics.jsonl, and a final line like
``[sft] done in 45s | step 2000 | test_accuracy 0.97 | step_ms 18``;
``/tmp/dllm_tiny`` then holds metrics.jsonl, tb/ (TensorBoard), checkpoints/sft/
and summary.json. Re-running the same command resumes (and finishes at once
when done). Overrides: ``--config.sft.steps=500 --config.sft.lr=1e-3``.
"""

from dllm_rl.config.defaults import get_config  # noqa: F401
