"""Across-prompt summaries vs numpy / scipy.stats on the same values."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from thermo_lens.stats import SummaryStats, summarize

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


def _scipy(x, level=0.95):
    x = np.asarray(x, dtype=float)
    se = stats.sem(x)
    with np.errstate(invalid="ignore"):  # scipy warns for a zero-width interval
        lo, hi = stats.t.interval(level, x.size - 1, loc=x.mean(), scale=se)
    return x.mean(), np.std(x, ddof=1), se, lo, hi


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=2, max_size=40), st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_summary_equals_scipy(values, level):
    s = summarize(values, level=level)
    mean, sd, se, lo, hi = _scipy(values, level)
    assert s.n == len(values) and s.ddof == 1 and s.level == level
    tol = dict(rel=1e-9, abs=1e-9)
    assert s.mean == pytest.approx(mean, **tol)
    assert s.sd == pytest.approx(sd, **tol)
    assert s.se == pytest.approx(se, **tol)
    if sd > 0:
        assert s.ci_low == pytest.approx(lo, **tol) and s.ci_high == pytest.approx(hi, **tol)
    else:  # scipy gives NaN for a zero-width interval; the interval is the point itself
        assert s.ci_low == pytest.approx(mean, **tol) and s.ci_high == pytest.approx(mean, **tol)
    assert s.sd_ddof0 == pytest.approx(np.std(values), **tol)
    np.testing.assert_array_equal(s.values, np.asarray(values, dtype=float))


def test_axis_summary_per_layer_equals_columnwise():
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 0.1, size=(7, 5))  # [prompt, layer]
    s = summarize(torch.tensor(x, dtype=torch.float32))
    assert s.mean.shape == (5,) and list(s.n) == [7] * 5
    for l in range(5):
        col = summarize(x[:, l].astype(np.float32))
        assert s.mean[l] == pytest.approx(col.mean, rel=1e-12)
        assert s.ci_high[l] == pytest.approx(col.ci_high, rel=1e-12)
    # axis=1 summarises over the other axis
    s1 = summarize(x, axis=1)
    np.testing.assert_allclose(s1.sd, np.std(x, axis=1, ddof=1), rtol=1e-12)


def test_nan_policies():
    x = np.array([1.0, np.nan, 3.0, 2.0])
    assert np.isnan(summarize(x).mean)  # propagate, as scipy
    s = summarize(x, nan_policy="omit")
    ref = stats.sem(x, nan_policy="omit")
    assert s.n == 3 and s.mean == pytest.approx(2.0) and s.se == pytest.approx(float(ref))
    with pytest.raises(ValueError, match="NaN"):
        summarize(x, nan_policy="raise")
    m = np.array([[1.0, np.nan], [2.0, np.nan], [4.0, 5.0]])
    sm = summarize(m, nan_policy="omit")
    assert list(sm.n) == [3, 1] and np.isnan(sm.sd[1]) and sm.mean[1] == 5.0


def test_one_value_has_no_spread():
    s = summarize([1.3])
    assert s.n == 1 and s.mean == 1.3
    assert all(np.isnan(v) for v in (s.sd, s.se, s.ci_low, s.ci_high))
    assert s.sd_ddof0 == 0.0 and s.excludes(1.0) is False


def test_excludes_and_format():
    s = summarize([1.2, 1.3, 1.25])
    assert s.excludes(1.0) and not s.excludes(1.25)
    text = repr(s)
    assert "ddof=1" in text and "95% CI" in text and "n=3" in text
    assert set(s.to_dict()) == {"n", "mean", "sd", "se", "ci_low", "ci_high", "level", "sd_ddof"}


def test_json_round_trip():
    s = summarize(np.array([[1.0, 2.0], [1.5, 2.5], [0.5, 3.0]]))
    back = SummaryStats.from_json(s.to_json())
    np.testing.assert_array_equal(back.mean, s.mean)
    np.testing.assert_array_equal(back.values, s.values)
    scalar = summarize([1.0, 2.0])
    assert SummaryStats.from_json(scalar.to_json()).ci_low == scalar.ci_low


def test_bad_input():
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    with pytest.raises(ValueError, match="scalar"):
        summarize(1.0)
    with pytest.raises(ValueError, match="level"):
        summarize([1.0, 2.0], level=95)
    with pytest.raises(ValueError, match="nan_policy"):
        summarize([1.0, 2.0], nan_policy="drop")
