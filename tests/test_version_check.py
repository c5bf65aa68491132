"""The jax / flax pair check that ``import dllm_rl`` runs (dllm_rl/__init__.py)."""

import dllm_rl


def test_old_flax_on_jax_011_is_named_with_the_fix():
  msg = dllm_rl.version_problem("0.11.2", "0.12.8")
  assert msg is not None and "flax 0.12.8" in msg and "jax 0.11.2" in msg
  assert "flax>=0.12.10" in msg


def test_the_pinned_and_the_gpu_machine_pairs_pass():
  assert dllm_rl.version_problem("0.10.2", "0.12.8") is None    # requirements.txt (Python 3.11)
  assert dllm_rl.version_problem("0.11.2", "0.12.10") is None   # the lent H200, 2026-12-04
  assert dllm_rl.version_problem("0.11.2", "0.13.0") is None
  assert dllm_rl.version_problem("0.11.0rc1", "0.12.9") is not None
