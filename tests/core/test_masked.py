import math

import pytest
import torch

from proxrl.core import (
    aggregate_loss,
    explained_variance,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from tests.core.helpers import close, t

X = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = t([[1, 1, 0], [1, 0, 0]])


def test_masked_sum_and_mean_by_hand():
    """Valid entries 1, 2, 4: sum 7, mean 7/3; rows: (1+2)/2 = 1.5 and 4/1 = 4."""
    close(masked_sum(X, MASK), 7.0)
    close(masked_mean(X, MASK), 7 / 3)
    close(masked_sum(X, MASK, dim=-1), [3.0, 4.0])
    close(masked_mean(X, MASK, dim=-1), [1.5, 4.0])


def test_masked_mean_of_an_empty_row_is_zero():
    close(masked_mean(X, t([[1, 0, 0], [0, 0, 0]]), dim=1), [1.0, 0.0])


def test_masked_var_by_hand():
    """1, 2, 4: mean 7/3, squared deviations 16/9 + 1/9 + 25/9 = 14/3;
    biased 14/9, unbiased 14/6 = 7/3."""
    close(masked_var(X, MASK, unbiased=False), 14 / 9)
    close(masked_var(X, MASK), 7 / 3)


def test_masked_var_needs_two_entries():
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(X, t([[1, 0, 0], [0, 0, 0]]))


def test_masked_whiten_by_hand():
    """(x − 7/3)/sqrt(7/3 + 1e-8) at valid entries, 0 elsewhere; without the shift the mean
    7/3 is added back."""
    scale = 1 / math.sqrt(7 / 3 + 1e-8)
    expected = t([[(1 - 7 / 3) * scale, (2 - 7 / 3) * scale, 0], [(4 - 7 / 3) * scale, 0, 0]])
    close(masked_whiten(X, MASK), expected)
    close(masked_whiten(X, MASK, shift_mean=False), (expected + 7 / 3) * MASK)


LOSS = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
RAGGED = t([[1, 1, 1], [1, 0, 0]])


AGGREGATION_CASES = {  # mode → (expected, the arithmetic)
    "token-mean": (2.5, "(1+2+3+4)/4"),
    "seq-mean-token-mean": (3.0, "(6/3 + 4/1)/2"),
    "seq-mean-token-sum": (5.0, "(6 + 4)/2"),
    "seq-mean-token-sum-norm": (5 / 3, "(6/3 + 4/3)/2 with horizon T = 3"),
}


def test_every_aggregation_has_a_case():
    from proxrl.core import AGGREGATIONS

    assert set(AGGREGATION_CASES) == set(AGGREGATIONS)


@pytest.mark.parametrize("mode", sorted(AGGREGATION_CASES))
def test_aggregate_loss_modes_on_a_ragged_mask(mode):
    close(aggregate_loss(LOSS, RAGGED, mode), AGGREGATION_CASES[mode][0])


def test_aggregate_loss_constant_horizon():
    """Dr. GRPO's normaliser is a constant, not the batch's width: (6/5 + 4/5)/2 = 1."""
    close(aggregate_loss(LOSS, RAGGED, "seq-mean-token-sum-norm", horizon=5), 1.0)


def test_seq_mean_token_mean_skips_empty_sequences():
    """Row 2 has no token: the mean is over row 1 only, (1+2)/2 = 1.5."""
    close(aggregate_loss(LOSS, t([[1, 1, 0], [0, 0, 0]]), "seq-mean-token-mean"), 1.5)


def test_aggregate_loss_rejects_unknown_mode():
    with pytest.raises(ValueError, match="unknown aggregation mode 'sum'"):
        aggregate_loss(LOSS, RAGGED, "sum")


def test_explained_variance_by_hand():
    """Perfect critic → 1; constant prediction at the mean → 1 − Var(R − 2)/Var(R) = 0;
    V = 2R − 2 (residual −(R − 2)) → 0 as well; V = −R → 1 − Var(2R)/Var(R) = −3."""
    returns, mask = t([1.0, 2.0, 3.0]), t([1, 1, 1])
    close(explained_variance(returns, returns, mask), 1.0)
    close(explained_variance(t([2.0, 2.0, 2.0]), returns, mask), 0.0)
    close(explained_variance(-returns, returns, mask), -3.0)


def test_masked_positions_never_influence_results():
    """Fill every masked position with NaN, Inf or huge numbers: each output at valid
    positions, and every reduction, stays bit-identical."""
    x = torch.randn(4, 6, dtype=torch.float64)
    mask = (torch.rand(4, 6) < 0.6).to(torch.float64)
    mask[:, 0] = 1
    for poison in (float("nan"), float("inf"), 1e30):
        poisoned = torch.where(mask.bool(), x, poison)
        assert torch.equal(masked_sum(poisoned, mask), masked_sum(x, mask))
        assert torch.equal(masked_mean(poisoned, mask, dim=1), masked_mean(x, mask, dim=1))
        assert torch.equal(masked_var(poisoned, mask), masked_var(x, mask))
        assert torch.equal(masked_whiten(poisoned, mask), masked_whiten(x, mask))
        for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
            assert torch.equal(aggregate_loss(poisoned, mask, mode), aggregate_loss(x, mask, mode))


def test_inputs_are_not_mutated():
    x, mask = X.clone(), MASK.clone()
    masked_whiten(x, mask)
    aggregate_loss(x, mask, "seq-mean-token-mean")
    assert torch.equal(x, X) and torch.equal(mask, MASK)


def test_units_of_each_aggregation_by_hand():
    """RAGGED has 4 valid tokens in 2 rows: tokens 4, non-empty rows 2, rows 2, rows × H = 10."""
    from proxrl.core import aggregation

    assert float(aggregation("token-mean").units(RAGGED)) == 4.0
    assert float(aggregation("seq-mean-token-mean").units(t([[1, 1, 0], [0, 0, 0]]))) == 1.0
    assert float(aggregation("seq-mean-token-sum").units(RAGGED)) == 2.0
    assert float(aggregation("seq-mean-token-sum-norm", horizon=5).units(RAGGED)) == 10.0


def test_trl_spellings_are_not_core_names():
    """dapo, bnpo, grpo, dr_grpo are the config's aliases (online/config.py), not core's."""
    for alias in ("dapo", "bnpo", "grpo", "dr_grpo"):
        with pytest.raises(ValueError, match="unknown aggregation mode"):
            aggregate_loss(LOSS, RAGGED, alias)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_micro_batch_shares_add_up_to_the_whole_batch(mode):
    """Lengths 6, 1, 2, 2 split as {6, 1} + {2, 2} (the second trimmed to width 2): each
    micro-batch's loss × its units / the whole batch's units sums to the whole batch's loss.
    With the micro-batch's trimmed width as Dr. GRPO's horizon it would not (the issue's bug)."""
    from proxrl.core import aggregation
    from tests.core.helpers import prefix_mask

    loss = torch.randn(4, 6, dtype=torch.float64)
    mask = prefix_mask([6, 1, 2, 2], 6)
    agg = aggregation(mode, horizon=8)
    total = agg.units(mask)
    parts = [(loss[:2], mask[:2]), (loss[2:, :2], mask[2:, :2])]
    split = sum(agg(part, m) * agg.units(m) / total for part, m in parts)
    close(split, agg(loss, mask), rtol=1e-12)
