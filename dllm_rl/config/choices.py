"""Allowed values owned by the config layer and the layers above it.

Each list is defined once and read both by validation and by the code that acts on it:
run modes (``dllm_rl.train.modes`` registers one runner per name) and learning-rate
schedules (``dllm_rl.train.optim``). Lists owned by a component below the config layer live
with that component (``rl.losses.CLIP_MODES``, ``rl.losses.KL_ESTIMATORS``,
``rl.advantages.BETA_SCHEDULES``, ``diffusion.estimators.REDUCTIONS``,
``kernels.staircase.ATTENTION_IMPLS``, ``parallel.distributed.INITIALIZE_MODES``,
``models.scan.REMAT_POLICIES``, ``types.DTYPES``) and validation imports them from there.
"""

RUN_MODES = ("sft", "rl", "pipeline", "eval")
SFT_MODES = ("sft", "pipeline")  # modes that train SFT
RL_MODES = ("rl", "pipeline")    # modes that train RL
LR_SCHEDULES = ("constant", "cosine", "linear")  # decay after the linear warm-up
# mode=eval's weights (config.eval.phase): the newest checkpoint | a phase's | the HF model's.
EVAL_PHASES = ("auto", "sft", "rl", "base")
