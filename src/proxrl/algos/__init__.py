"""The language-model trainers: the online family (rollouts, ``online/``) and the offline family
(fixed data sets, ``offline/``), each a config dataclass and ``train(cfg)`` in numbered steps."""
