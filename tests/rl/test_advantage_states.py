"""StepRS state bookkeeping: progress u = s/(S − 1) maps back to state s exactly."""

import numpy as np
import pytest

from dllm_rl.rl import advantages as adv


@pytest.mark.parametrize("num_states", [2, 4, 26, 42, 64, 128])
def test_state_of_progress_inverts_progress_from_unmask_step(num_states):
  """The per-state controls (``control_per_state``) group tokens by round(u·(S − 1)); u is a
  float32 s/(S − 1), so u·(S − 1) can fall just below s (S = 26: s = 5, 10, 15, …), and
  truncating it would file those tokens under state s − 1."""
  s = np.arange(num_states)
  u = adv.progress_from_unmask_step(s, num_states)
  np.testing.assert_array_equal(np.asarray(adv.state_of_progress(u, num_states)), s)
