"""The agent columns of an observation row: the array form (environment, vectorised backtest)
and the one-row form on Python floats (the trading step) give the same float32 values."""

from __future__ import annotations

import numpy as np

from agent.policy.observation import UPNL_CLIP, agent_feature_values, agent_features


def test_one_row_form_matches_the_array_form_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    n = 20_000
    position = rng.integers(-3, 4, size=n)
    entry = rng.normal(18_000.0, 40.0, size=n)
    mark = entry + rng.normal(0.0, 30.0, size=n) * rng.choice([1e-3, 1.0, 1e3], size=n)
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    mark[:50] = rng.choice(special, size=50)  # unhealthy marks, flat and held
    entry[50:100] = mark[50:100]  # no move: the product is a signed zero
    scale = 0.37
    with np.errstate(invalid="ignore"):  # inf - inf, 0 * inf: NaN, as in the one-row form
        expected = agent_features(np, position, entry, mark, scale)
    got = np.array(
        [
            agent_feature_values(int(p), float(e), float(m), scale)
            for p, e, m in zip(position, entry, mark, strict=True)
        ],
        dtype=np.float32,
    )
    np.testing.assert_array_equal(got, expected)  # NaN where the array form has NaN
    assert np.array_equal(got.view(np.uint32)[~np.isnan(got)], expected.view(np.uint32)[~np.isnan(got)])
    clipped = np.abs(expected[:, 1]) == np.float32(UPNL_CLIP)
    assert clipped.any() and (~clipped & (expected[:, 1] != 0)).any()  # both regimes were met
    assert np.isnan(expected[:, 1]).any() and (expected[position == 0] == 0).all()
