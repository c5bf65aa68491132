"""The persistent compilation cache (config.compilation_cache, on by default): a run
writes its compiled programs there, so a restarted run loads them instead of compiling."""

import os

import jax
import jax.numpy as jnp
import pytest
from jax._src import compilation_cache as jax_cache

from dllm_rl.train import modes as run
from dllm_rl.config import base_config


@pytest.fixture
def fresh_cache():
  saved = (jax.config.jax_compilation_cache_dir,
           jax.config.jax_persistent_cache_min_compile_time_secs)
  jax_cache.reset_cache()
  yield
  jax.config.update("jax_compilation_cache_dir", saved[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])
  jax_cache.reset_cache()


def test_on_by_default_outside_the_repo():
  path = os.path.expanduser(base_config().compilation_cache)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  assert path and not os.path.abspath(path).startswith(repo)


def test_compiled_programs_land_in_the_cache(tmp_path, fresh_cache):
  assert run.enable_compilation_cache("") is None
  directory = run.enable_compilation_cache(str(tmp_path / "xla"))
  assert directory == str(tmp_path / "xla")
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # cache even tiny ones
  jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.ones(7)).block_until_ready()
  assert os.listdir(directory), "nothing was written to the compilation cache"


def test_a_cache_set_through_jax_wins_over_the_default_only(tmp_path, fresh_cache):
  from dllm_rl.config.schema import DEFAULT_COMPILATION_CACHE
  assert base_config().compilation_cache == DEFAULT_COMPILATION_CACHE
  users = str(tmp_path / "users")
  jax.config.update("jax_compilation_cache_dir", users)  # as JAX_COMPILATION_CACHE_DIR does
  assert run.enable_compilation_cache(DEFAULT_COMPILATION_CACHE) == users
  assert jax.config.jax_compilation_cache_dir == users
  ours = str(tmp_path / "ours")  # set in the config: the config wins
  assert run.enable_compilation_cache(ours) == ours
  assert jax.config.jax_compilation_cache_dir == ours
  jax.config.update("jax_compilation_cache_dir", None)  # none set through JAX: the default
  assert run.enable_compilation_cache(DEFAULT_COMPILATION_CACHE) == os.path.expanduser(
      DEFAULT_COMPILATION_CACHE)


def test_a_cache_path_that_is_a_file_names_the_key(tmp_path, fresh_cache):
  """JAX takes a file as its cache folder with a warning and compiles without the cache."""
  from dllm_rl.errors import ConfigError
  (tmp_path / "a_file").write_text("")
  with pytest.raises(ConfigError, match=r"^config\.compilation_cache: .*a_file is a file, not a"
                                        r" folder"):
    run.enable_compilation_cache(str(tmp_path / "a_file"))
