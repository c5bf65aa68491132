"""Masked-diffusion process, SFT loss and likelihood estimators.

Importing the package registers every estimator (``elbo``, ``mean_field``,
``spg_block``, ``block_elbo`` and ``trajectory``) in ``estimators.ESTIMATORS``.
"""

from dllm_rl.diffusion import block, estimators, spg_block, trajectory  # noqa: F401  (registration)
