"""A LoRA run prints no deprecation warning (issue 40): peft 0.21 reads transformers 5's
deprecated ``is_gradient_checkpointing`` whenever it wraps a model or loads an adapter, a
FutureWarning on every LoRA run that the user can do nothing about."""

from __future__ import annotations

import warnings
from pathlib import Path

from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.lora import apply_lora, merge_adapter


def _deprecations(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_wrapping_and_merging_a_lora_print_no_deprecation_warning(
    tiny_lm: str, tmp_path: Path
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = apply_lora(load_causal_lm(tiny_lm), r=4)
        model.save_pretrained(tmp_path / "adapter")
        merged = merge_adapter(load_causal_lm(tiny_lm), str(tmp_path / "adapter"))
    assert _deprecations(caught) == []
    assert merged.name_or_path == str(tmp_path / "adapter")  # the merge did run


def test_the_lora_still_wraps_and_is_recognised(tiny_lm: str) -> None:
    from proxrl.models.lora import is_peft_model

    base = load_causal_lm(tiny_lm)
    assert not is_peft_model(base)
    assert is_peft_model(apply_lora(base, r=4))
