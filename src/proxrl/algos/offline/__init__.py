"""The offline family on one loop: SFT (``sft``), reward models (``reward``) and the DPO family
(``dpo``).

Where a change goes: a config field they all share, or a model/data set-up helper, in
``config``; the optimizer loop (accumulation, evaluation, checkpoints, metrics) in ``loop``; a
trainer's own data encoding and loss in its file as a ``Task``.
"""
