"""Masked-diffusion process, SFT loss and likelihood estimators.

Importing the package registers every estimator (``elbo``, ``mean_field``,
``spg_block`` and ``block_elbo``) in ``estimators.ESTIMATORS``.
"""

from dllm_rl.diffusion import block, estimators, spg_block  # noqa: F401  (registration)
