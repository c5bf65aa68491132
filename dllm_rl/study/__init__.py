"""Small-scale reproduction studies of the papers' claims (``python -m dllm_rl.study``).

``arms.py`` (what each study runs), ``stats.py`` (pure statistics), ``runner.py``
(SFT once per seed, then every arm from that checkpoint through ``dllm_rl.train.modes``),
``plots.py`` (PNG curves with seed bands, grad-norm spikes), ``report.py``
(docs/results.md from the study JSON; its tables: ``report_tables.py``), ``__main__.py``
(the command).
"""
