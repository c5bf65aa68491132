"""Configuration: schema (every key, documented), allowed values, command-line overrides,
the embedded default. No registry imports: this layer sits below every component.

Experiment files in ``configs/`` call :func:`base_config`, change values and return
:func:`locked` (a typo in a key fails where it is written). The whole config is validated
before anything compiles by ``dllm_rl.train.validate.validate`` (the composition root, which
reads the components' registries), reporting every problem at once as :class:`ConfigError`
naming the key.
"""

from dllm_rl.config.overrides import apply_overrides
from dllm_rl.config.schema import base_config, load_config_file, locked
from dllm_rl.errors import ConfigError, ConfigErrors

__all__ = ["ConfigError", "ConfigErrors", "apply_overrides", "base_config", "load_config_file",
           "locked"]
