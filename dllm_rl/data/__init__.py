"""``dllm-rl-data`` (``python -m dllm_rl.data``): data sets and weights in.

* ``prepare NAME --out DIR|gs://...``: a named data set (``recipes.RECIPES``: gsm8k, math,
  math500, countdown, sudoku) from its official source through the Hugging Face ``datasets``
  library, written as the JSONL files the trainer's file-backed tasks read (``prepare.py``);
* ``weights SPEC``: fetch a checkpoint (hub id or gs:// folder) into the local cache so a run
  finds it offline (``dllm_rl.infra.weights``); on a TPU pod, ``launch/tpu_pod.sh
  --stage-weights SPEC`` runs it on every worker;
* ``list``: the recipes and their sources.
"""
