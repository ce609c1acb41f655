import math

import pytest
import torch

from proxrl.core import (
    combine_correction_stats,
    correction_stats,
    icepop_weights,
    mis_weights,
    mismatch_stats,
    seq_mis_weights,
    seq_tis_weights,
    tis_weights,
)
from tests.core.helpers import close, t

# Two responses; ρ_t = π_old / π_sampler per token, the last token of row 1 is padding.
# Row 0: ρ = (0.4, 1.0, 3.0)  → Π = 1.2
# Row 1: ρ = (1.5, 2.5, pad)  → Π = 3.75
RATIOS = [[0.4, 1.0, 3.0], [1.5, 2.5, 7.0]]
MASK = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
LOG_RATIO = t([[math.log(r) for r in row] for row in RATIOS])


def test_tis_by_hand():
    """min(ρ_t, 2) per token; 0 at padding."""
    close(tis_weights(LOG_RATIO, MASK, 2.0), [[0.4, 1.0, 2.0], [1.5, 2.0, 0.0]])


def test_seq_tis_by_hand():
    """min(Π ρ, 2) broadcast: row 0 → 1.2, row 1 → min(3.75, 2) = 2."""
    close(seq_tis_weights(LOG_RATIO, MASK, 2.0), [[1.2, 1.2, 1.2], [2.0, 2.0, 0.0]])


def test_mis_by_hand():
    """ρ_t, or 0 above 2: the 3.0 and the 2.5 are dropped."""
    close(mis_weights(LOG_RATIO, MASK, 2.0), [[0.4, 1.0, 0.0], [1.5, 0.0, 0.0]])


def test_seq_mis_by_hand():
    """Π ρ, or 0 above 2: row 0 keeps 1.2, row 1 (3.75) is dropped whole."""
    close(seq_mis_weights(LOG_RATIO, MASK, 2.0), [[1.2, 1.2, 1.2], [0.0, 0.0, 0.0]])


def test_icepop_by_hand():
    """ρ_t inside [0.5, 2.0], else 0: 0.4 (below), 3.0 and 2.5 (above) are dropped; the bounds
    themselves are kept (cap 2.5 keeps the 2.5)."""
    close(icepop_weights(LOG_RATIO, MASK, 0.5, 2.0), [[0.0, 1.0, 0.0], [1.5, 0.0, 0.0]])
    close(icepop_weights(LOG_RATIO, MASK, 0.5, 2.5), [[0.0, 1.0, 0.0], [1.5, 2.5, 0.0]])


def test_the_caps_themselves_are_kept_by_hand():
    """A ratio exactly at a bound is inside it (exp(log 2) == 2 and exp(log 0.4) == 0.4 in
    float64): MIS keeps ρ_t = C = 2, sequence MIS keeps ρ(y) = 2 · 1 = C, IcePop keeps ρ_t = α =
    0.4 (and, as test_icepop_by_hand shows, β)."""
    log_ratio, mask = t([[math.log(2.0), 0.0]]), t([[1.0, 1.0]])
    assert mis_weights(log_ratio, mask, 2.0).tolist() == [[2.0, 1.0]]
    assert seq_mis_weights(log_ratio, mask, 2.0).tolist() == [[2.0, 2.0]]
    close(icepop_weights(LOG_RATIO, MASK, 0.4, 2.0), [[0.4, 1.0, 0.0], [1.5, 0.0, 0.0]])


def test_correction_stats_of_a_rollout_without_valid_tokens_are_zeros():
    """A rank whose rows are all padding: no token, so every stat is 0 (not the nan of an empty
    mean nor the error of an empty min), a float64 scalar for a float64 rollout, whatever sits
    in the padding."""
    sampler = t([[math.log(0.5)] * 3] * 2)
    trainer = sampler + LOG_RATIO
    empty = torch.zeros_like(MASK)
    stats = correction_stats(trainer, sampler, tis_weights(LOG_RATIO, empty, 2.0), empty, 2.0)
    assert set(stats) == {
        "mismatch_kl",
        "mismatch_kl_k1",
        "is_ratio_mean",
        "is_ratio_min",
        "is_ratio_max",
        "masked_share",
        "truncated_share",
    }
    for key, value in stats.items():
        assert value.shape == () and value.dtype == torch.float64, key
        assert value.item() == 0.0, key


def test_correction_stats_by_hand():
    """Sampler log-probs all log 0.5, trainer's log(0.5 ρ). Over the 5 valid tokens:
    ρ mean (0.4+1+3+1.5+2.5)/5 = 1.68, min 0.4, max 3.0; k3 of KL(π_s‖π_old) per token
    (ρ − 1) − log ρ; k1 −log ρ. TIS with cap 2: 2 of 5 truncated, none masked; MIS: 2 masked."""
    sampler = t([[math.log(0.5)] * 3] * 2)
    trainer = sampler + LOG_RATIO
    valid = [0.4, 1.0, 3.0, 1.5, 2.5]
    k3 = sum((r - 1) - math.log(r) for r in valid) / 5
    k1 = sum(-math.log(r) for r in valid) / 5
    stats = correction_stats(trainer, sampler, tis_weights(LOG_RATIO, MASK, 2.0), MASK, 2.0)
    close(stats["mismatch_kl"], t(k3))
    close(stats["mismatch_kl_k1"], t(k1))
    close(stats["is_ratio_mean"], t(1.68))
    close(stats["is_ratio_min"], t(0.4))
    close(stats["is_ratio_max"], t(3.0))
    close(stats["truncated_share"], t(0.4))
    close(stats["masked_share"], t(0.0))
    stats = correction_stats(trainer, sampler, mis_weights(LOG_RATIO, MASK, 2.0), MASK, 2.0)
    close(stats["masked_share"], t(0.4))
    close(stats["truncated_share"], t(0.0))


def test_mismatch_stats_by_hand():
    """The numbers of ``test_correction_stats_by_hand`` without weights (what the update logs
    when the sampler's log-probs are π_old: no correction); no valid token: every stat 0."""
    sampler = t([[math.log(0.5)] * 3] * 2)
    trainer = sampler + LOG_RATIO
    valid = [0.4, 1.0, 3.0, 1.5, 2.5]
    stats = mismatch_stats(trainer, sampler, MASK)
    assert set(stats) == {
        "mismatch_kl",
        "mismatch_kl_k1",
        "is_ratio_mean",
        "is_ratio_min",
        "is_ratio_max",
    }
    close(stats["mismatch_kl"], t(sum((r - 1) - math.log(r) for r in valid) / 5))
    close(stats["mismatch_kl_k1"], t(sum(-math.log(r) for r in valid) / 5))
    close(stats["is_ratio_mean"], t(1.68))
    close(stats["is_ratio_min"], t(0.4))
    close(stats["is_ratio_max"], t(3.0))
    empty = mismatch_stats(trainer, sampler, MASK * 0)
    assert all(float(value) == 0.0 for value in empty.values())


def test_combine_correction_stats_by_hand():
    """Two ranks: rank 0 holds row 0 (ρ 0.4, 1, 3: 3 tokens), rank 1 row 1 (ρ 1.5, 2.5: 2 tokens),
    a third rank none. The whole rollout's ratio mean is (0.4+1+3+1.5+2.5)/5 = 1.68, not the mean
    of the ranks' means (1.4667+2)/2 = 1.7333; its min 0.4 and max 3.0, not the ranks' mean min
    (0.4+1.5)/2 = 0.95 and max (3+2.5)/2 = 2.75; the empty rank's zeros count nowhere."""
    parts = [
        {"is_ratio_mean": 4.4 / 3, "is_ratio_min": 0.4, "is_ratio_max": 3.0},
        {"is_ratio_mean": 2.0, "is_ratio_min": 1.5, "is_ratio_max": 2.5},
        {"is_ratio_mean": 0.0, "is_ratio_min": 0.0, "is_ratio_max": 0.0},
    ]
    combined = combine_correction_stats(parts, [3.0, 2.0, 0.0])
    assert math.isclose(combined["is_ratio_mean"], 1.68, rel_tol=1e-12)
    assert combined["is_ratio_min"] == 0.4
    assert combined["is_ratio_max"] == 3.0
    assert combine_correction_stats(parts[2:], [0.0]) == parts[2]


def test_combine_counts_a_shard_of_one_token():
    """Shards of 1 and 3 tokens: ratio mean (2·1 + 1·3)/4 = 1.25; the one-token shard's ratio
    (0.25) is the least and its 4.0 the greatest of the whole."""
    parts = [
        {"is_ratio_mean": 2.0, "is_ratio_min": 0.25, "is_ratio_max": 4.0},
        {"is_ratio_mean": 1.0, "is_ratio_min": 0.5, "is_ratio_max": 1.5},
    ]
    assert combine_correction_stats(parts, [1.0, 3.0]) == {
        "is_ratio_mean": 1.25,
        "is_ratio_min": 0.25,
        "is_ratio_max": 4.0,
    }


def test_combine_of_one_shard_is_that_shard():
    part = {"is_ratio_mean": 1.5, "is_ratio_min": 0.5, "is_ratio_max": 3.0}
    assert combine_correction_stats([part], [2.0]) == part


def test_combine_refuses_shards_and_counts_of_different_lengths():
    """One count for two shards is a caller's bug: refused, not a silent drop of a shard."""
    part = {"is_ratio_mean": 1.0, "is_ratio_min": 1.0, "is_ratio_max": 1.0}
    with pytest.raises(ValueError, match="zip"):
        combine_correction_stats([part, part], [1.0])


def test_combined_shards_equal_the_whole_rollout():
    """Every stat of the two rows computed apart and combined equals the stat of both rows."""
    sampler = t([[math.log(0.5)] * 3] * 2)
    trainer = sampler + LOG_RATIO
    weights = mis_weights(LOG_RATIO, MASK, 2.0)
    whole = correction_stats(trainer, sampler, weights, MASK, 2.0)
    rows = [slice(0, 1), slice(1, 2)]
    parts = [
        {
            k: float(v)
            for k, v in correction_stats(trainer[r], sampler[r], weights[r], MASK[r], 2.0).items()
        }
        for r in rows
    ]
    combined = combine_correction_stats(parts, [float(MASK[r].sum()) for r in rows])
    assert combined.keys() == whole.keys()
    for key, value in whole.items():
        assert math.isclose(combined[key], float(value), rel_tol=1e-12, abs_tol=1e-15), key


# Every entry of ROLLOUT_CORRECTIONS on LOG_RATIO, MASK with α = 0.5, C = 2 (the cases above).
CORRECTION_CASES = {
    "tis": [[0.4, 1.0, 2.0], [1.5, 2.0, 0.0]],
    "seq_tis": [[1.2, 1.2, 1.2], [2.0, 2.0, 0.0]],
    "mis": [[0.4, 1.0, 0.0], [1.5, 0.0, 0.0]],
    "seq_mis": [[1.2, 1.2, 1.2], [0.0, 0.0, 0.0]],
    "icepop": [[0.0, 1.0, 0.0], [1.5, 0.0, 0.0]],
}


def test_every_rollout_correction_has_a_case():
    from proxrl.core import ROLLOUT_CORRECTIONS

    assert set(CORRECTION_CASES) == set(ROLLOUT_CORRECTIONS)


@pytest.mark.parametrize("name", sorted(CORRECTION_CASES))
def test_rollout_corrections_by_name_by_hand(name):
    from proxrl.core import ROLLOUT_CORRECTIONS

    close(ROLLOUT_CORRECTIONS[name](LOG_RATIO, MASK, 0.5, 2.0), CORRECTION_CASES[name])
