"""Tiny CPU config: the embedded default (dllm_rl/config/defaults.py), as a file to copy.

The whole pipeline on a 0.1M-parameter masked-diffusion model and 3-digit addition: SFT
warm-up (stopped when validation accuracy reaches 0.3), 600 StableDRL rollout batches, then
the held-out test. Run (2 CPU cores, about 2 minutes):

    python -m dllm_rl.main --config=configs/tiny_cpu.py --workdir=/tmp/dllm_tiny

What you should see: progress bars for SFT and RL, then lines like
``[sft] done in 15s | step 550 | test_accuracy 0.43 ...`` and ``[rl] done in ...`` and the
summary JSON (``sft_accuracy``, ``rl_accuracy``, ``rl_gain``, ...). ``/tmp/dllm_tiny`` then
holds metrics.jsonl, tb/ (TensorBoard), checkpoints/sft/ and checkpoints/rl/, the curves and
summary.json. Re-running the same command resumes (and finishes at once when done). One phase
alone: ``--config.mode=sft``; overrides such as ``--config.rl.steps=300 --config.rl.lr=1e-4``.
Why these settings: the docstring of dllm_rl/config/defaults.py.
"""

from dllm_rl.config.defaults import get_config  # noqa: F401
