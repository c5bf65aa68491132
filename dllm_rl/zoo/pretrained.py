"""``load_pretrained(path) -> Pretrained``: any supported checkpoint, one stable API.

    import dllm_rl
    # an HF folder, `convert import` output, gs:// folder or hub id
    model = dllm_rl.load_pretrained("path/to/LLaDA-8B-Instruct")
    model.family, model.config, model.token_ids.mask_id
    logits_BLV = model.logits(input_ids_BL)  # what the official forward returns
    # the official generator's keywords
    out_BN = model.generate(prompt_BP, gen_length=128, steps=128, block_length=32)
    tok = model.tokenizer                    # the folder's tokenizer
    prompt_BP = np.array([tok.encode(tok.format_prompt("What is 2 + 3?"))])
    print(tok.decode(out_BN[0, prompt_BP.shape[1]:]))

The family (LLaDA, SDAR, ...) is detected from config.json
(:data:`dllm_rl.models.hf.FAMILIES`); an unsupported one is an error listing the
supported architectures. Parameters are placed on ``mesh`` (default: one
device). ``generate`` takes the official generator's own keywords
(:mod:`dllm_rl.zoo.generators`). On TPU/GPU wrap calls in
``jax.default_matmul_precision("highest")`` to compare with float32 references.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dllm_rl.infra import weights
from dllm_rl.models import convert, hf, transformer
from dllm_rl.tasks.hf_tokenizer import HFTokenizer
from dllm_rl.zoo.generators import FAMILY_GENERATORS, GENERATORS, default_generator

ATTENTIONS = ("bidirectional", "block_causal")


@functools.partial(jax.jit, static_argnums=0, static_argnames=("block_size",))
def _forward(graphdef, params, ids_BL, valid_BL, *, block_size):
  """float32 logits under key padding (and absolute block-causal blocks), positions arange."""
  b, n = ids_BL.shape
  mask_BNN = jnp.broadcast_to(valid_BL[:, None, :], (b, n, n))
  if block_size:
    blk_N = jnp.arange(n) // block_size
    mask_BNN = mask_BNN & (blk_N[None, :] <= blk_N[:, None])[None]
  positions_BL = jnp.broadcast_to(jnp.arange(n), (b, n))
  # apply_raw: Dream's official forward returns its rows unshifted (row i scores token i + 1).
  return transformer.apply_raw(graphdef, params, ids_BL, positions_BL,
                               mask_BNN).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """A loaded checkpoint. ``config``: the framework's ModelConfig; ``hf_config``: the
  source config.json; ``token_ids``: mask_id, eos_id, pad_id (and bos_id, block_size)."""

  family: str
  config: transformer.ModelConfig
  token_ids: hf.TokenIds
  hf_config: dict
  graphdef: Any
  params: Any
  path: str
  generator: str  # the official generator ``generate`` follows (a key of zoo.generators.GENERATORS)

  @functools.cached_property
  def tokenizer(self) -> HFTokenizer:
    """The checkpoint's own tokenizer (``tokenizer.json`` or ``vocab.json`` + ``merges.txt``,
    and ``tokenizer_config.json``'s chat template) with its mask / EOS / pad ids, read on
    first use (:func:`dllm_rl.models.convert.load_tokenizer`): ``format_prompt(text,
    system)`` (one user turn of the chat template), ``encode(text)``, ``decode(ids)`` (stops
    at the first EOS). FileNotFoundError naming the folder when it has no tokenizer files."""
    return convert.load_tokenizer(self.path, self.token_ids)

  def logits(self, input_ids_BL, *, attention_mask_BL=None, attention: str = "bidirectional",
             block_size: int | None = None) -> jax.Array:
    """float32 [B, L, V]: the model's raw output for ``input_ids_BL``, as the official
    ``forward`` returns it for the same inputs. ``attention_mask_BL`` (1 = token, 0 =
    padding): padding keys are never attended (rows of padding queries are not
    meaningful). ``attention="block_causal"`` with ``block_size``: query i sees key j iff
    j // block_size <= i // block_size (blocks from position 0, as SDAR / LLaDA2 generate
    build it). Positions are ``arange(L)`` as the official forwards use."""
    if attention not in ATTENTIONS:
      raise ValueError(f"attention={attention!r}; supported: {', '.join(ATTENTIONS)}")
    if attention == "block_causal":
      if not block_size or block_size < 1:
        raise ValueError("attention='block_causal' needs block_size >= 1")
    elif block_size is not None:
      raise ValueError("block_size is only used with attention='block_causal'")
    ids_BL = _as_ids(input_ids_BL, "input_ids_BL", self.config.vocab_size)
    valid_BL = _as_valid(attention_mask_BL, ids_BL.shape, "attention_mask_BL")
    self._warn_past_max_length(ids_BL.shape[1], "input_ids_BL")
    return _forward(self.graphdef, self.params, ids_BL, valid_BL,
                    block_size=int(block_size) if attention == "block_causal" else 0)

  def generate(self, prompt_ids_BP, *, attention_mask_BP=None, key: jax.Array | None = None,
               **kwargs) -> jax.Array:
    """int [B, ...]: the family's official generator (prompt included), called with its
    own keyword names (:mod:`dllm_rl.zoo.generators` lists them and what each returns).
    ``key``: randomness for temperature > 0 (default ``jax.random.key(0)``)."""
    gen = GENERATORS[self.generator]
    bound = gen.bind(self.generator, kwargs)
    for name in ("mask_id", "mask_token_id", "eos_id"):  # out of range: NaN embedding rows
      value = bound.get(name)
      if value is not None and not 0 <= int(value) < self.config.vocab_size:
        raise ValueError(f"{self.generator} generate: {name}={value} is outside the vocabulary"
                         f" [0, {self.config.vocab_size}) of this checkpoint")
    prompt_BP = _as_ids(prompt_ids_BP, "prompt_ids_BP", self.config.vocab_size)
    valid_BP = _as_valid(attention_mask_BP, prompt_BP.shape, "attention_mask_BP")
    key = jax.random.key(0) if key is None else key
    out = gen.run(self, prompt_BP, valid_BP, key, **bound)
    self._warn_past_max_length(out.shape[1], "the generated sequences")
    return out

  def _warn_past_max_length(self, length: int, what: str) -> None:
    """A warning when ``length`` tokens run past the longest sequence the checkpoint was
    made for (:func:`dllm_rl.models.hf.max_length`): RoPE runs on, untrained."""
    limit = hf.max_length(self.hf_config)
    if limit is not None and length > limit[1]:
      warnings.warn(f"{what}: {length} tokens, longer than the checkpoint's maximum sequence"
                    f" length {limit[1]} ({limit[0]} in its config.json): RoPE runs past it,"
                    " but the model was never trained there", stacklevel=3)


def _as_ids(x, name: str, vocab_size: int) -> jax.Array:
  """int32 ids from an integer array [batch, length] (neither dimension 0), every id in
  [0, vocab_size): checked before the cast, which would wrap an id of 2**31 or more."""
  arr = np.asarray(x)
  if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"{name}: expected an integer array [batch, length], got "
                     f"{arr.dtype}{list(arr.shape)}")
  if arr.size == 0:
    raise ValueError(f"{name}: empty ({list(arr.shape)}): give at least one token per row")
  lo, hi = int(arr.min()), int(arr.max())
  if lo < 0 or hi >= vocab_size:
    raise ValueError(f"{name}: token ids must lie in [0, {vocab_size}), got [{lo}, {hi}]")
  return jnp.asarray(arr, jnp.int32)


def _as_valid(mask, shape, name: str) -> jax.Array:
  if mask is None:
    return jnp.ones(shape, bool)
  arr = np.asarray(mask)
  if arr.shape != tuple(shape):
    raise ValueError(f"{name}: shape {list(arr.shape)} does not match the ids {list(shape)}")
  return jnp.asarray(arr != 0)


def _modeling_files(folder: str) -> dict[str, str]:
  """name → text of the ``modeling_*.py`` files an HF folder ships (trust_remote_code)."""
  out = {}
  if os.path.isdir(folder):
    for name in sorted(os.listdir(folder)):
      if name.startswith("modeling_") and name.endswith(".py"):
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
          out[name] = f.read()
  return out


def load_pretrained(path: str, *, dtype: str = "float32", param_dtype: str | None = None,
                    mesh: jax.sharding.Mesh | None = None,
                    generator: str | None = None) -> Pretrained:
  """An HF checkpoint folder (config.json + safetensors) or a ``python -m dllm_rl.convert
  import`` folder → :class:`Pretrained`; ``path`` may also be a gs:// folder or a hub id
  (``GSAI-ML/LLaDA-8B-Instruct``), fetched by :func:`dllm_rl.infra.weights.resolve_checkpoint`
  (:class:`~dllm_rl.infra.weights.WeightsUnavailable`, a FileNotFoundError, says how when it
  cannot be). ``dtype``: compute dtype; ``param_dtype``:
  storage dtype (default ``dtype``; an imported folder keeps its own unless given).
  ``generator``: which official generator ``generate`` follows, for families with more
  than one (LLaDA2: "llada2.0" | "llada2.1"); default: detected from the folder
  (:func:`dllm_rl.zoo.generators.default_generator`)."""
  path = weights.resolve_checkpoint(path)  # a local folder, gs:// (staged) or a hub id
  imported = convert.is_imported(path)
  family = (convert.read_meta(path)["family"] if imported
            else hf.detect_family(hf.read_hf_config(path)))
  if generator is not None and generator not in FAMILY_GENERATORS[family]:
    raise ValueError(f"generator={generator!r} does not fit a {family} checkpoint; "
                     f"supported: {', '.join(FAMILY_GENERATORS[family])}")
  if imported:
    m = convert.load_imported(path, mesh=mesh, param_dtype=param_dtype)
    cfg = dataclasses.replace(m.model_cfg, dtype=jnp.dtype(dtype).type)
    graphdef, _ = transformer.abstract_model(cfg)  # the compute dtype lives in the graph
    ids, hf_config, params = m.token_ids, m.hf_config, m.params
  else:
    hf_config = hf.read_hf_config(path)
    m = hf.load_checkpoint(path, mesh=mesh, dtype=dtype, param_dtype=param_dtype)
    cfg, ids, graphdef, params = m.model_cfg, m.token_ids, m.graphdef, m.params
  if generator is None:
    generator = default_generator(family, _modeling_files(convert.files_dir(path)))
  return Pretrained(family, cfg, ids, hf_config, graphdef, params, path, generator)
