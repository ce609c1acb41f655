"""``proxrl demo``: the whole RLHF pipeline on a tiny model, on a CPU, in minutes (``pipeline``);
the synthetic task with an exact measure of quality (``task``); held-out evaluation
(``evaluate``)."""

from proxrl.demo.pipeline import Config, train

__all__ = ["Config", "train"]
