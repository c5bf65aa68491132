"""Masked-diffusion process, SFT loss and likelihood estimators.

Importing the package registers every estimator (``elbo``, ``mean_field`` and
``spg_block``) in ``estimators.ESTIMATORS``.
"""

from dllm_rl.diffusion import estimators, spg  # noqa: F401  (registration)
