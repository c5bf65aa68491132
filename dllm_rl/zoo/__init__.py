"""The public model-loading API: ``dllm_rl.load_pretrained(path) -> Pretrained``
(:mod:`dllm_rl.zoo.pretrained`) and each family's official generator, called with
the official keyword names (:mod:`dllm_rl.zoo.generators`)."""
