"""Paired differences of two runs on the same prompts (ablated minus clean), and slicing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

import thermo_lens as tl

PROMPTS = ["The capital of France is Paris", "Water freezes at zero degrees", "the early bird catches the worm",
           "Colorless green ideas sleep", "the cat sat on the mat"]


def _zero_head(h):
    def hook(z, hook):
        z[:, :, h] = 0.0
        return z
    return hook


def test_ablated_minus_clean_gain_with_paired_t(bridge):
    model = bridge("gpt2")
    clean = tl.residual_gain(model, PROMPTS)
    abl = tl.residual_gain(model, PROMPTS, fwd_hooks=[("blocks.1.attn.hook_z", _zero_head(0))])
    d = abl - clean
    assert isinstance(d, tl.paired.PairedDifference) and d.dims == ("layer",)
    diff = (abl.block_gain - clean.block_gain).double()
    torch.testing.assert_close(d.difference, diff)
    # scipy's paired t-test, layer by layer (block 0 is upstream of the ablation: difference 0)
    for l in (1, 2):
        ref = stats.ttest_rel(abl.block_gain[:, l].double().numpy(), clean.block_gain[:, l].double().numpy())
        assert d.t_statistic[l] == pytest.approx(ref.statistic, rel=1e-9)
        assert d.pvalue[l] == pytest.approx(ref.pvalue, rel=1e-9)
        ci = stats.t.interval(0.95, len(PROMPTS) - 1, loc=diff[:, l].mean(), scale=stats.sem(diff[:, l].numpy()))
        assert (d.summary.ci_low[l], d.summary.ci_high[l]) == pytest.approx(ci, rel=1e-9)
    assert float(d.mean[0]) == 0.0
    df = d.to_frame()
    assert list(df["layer"]) == [0, 1, 2] and {"mean_difference", "ci_low", "ci_high", "t", "pvalue"} <= set(df)
    assert "blocks.1.attn.hook_z" in df["hooks_b"].iloc[0] and df["hooks_a"].iloc[0] == "none (clean run)"
    assert "blocks.1.attn.hook_z" in repr(d)
    # slicing by prompt and layer recomputes the statistics
    s = d.select(prompts=[0, 1, -1], layer=-1)
    assert s.dims == () and s.n_prompts == 3
    torch.testing.assert_close(s.difference, diff[[0, 1, 4], 2])
    back = tl.paired.PairedDifference.from_json(d.to_json())
    torch.testing.assert_close(back.difference, d.difference)
    # every per-prompt metric the registry declares for the result pairs, with its dimensions
    assert list(tl.paired.quantities(clean))[:2] == ["block_gain", "last_block_gain"]
    t = tl.paired.paired_difference(abl, clean, quantity="total_amplification")
    assert t.dims == () and t.quantity == "total_amplification"
    want = abl.summaries["total_amplification"].values - clean.summaries["total_amplification"].values
    np.testing.assert_allclose(t.difference.numpy(), want, rtol=1e-12)
    with pytest.raises(tl.ThermoLensInputError, match="no paired quantity 'trace'; choose one of block_gain"):
        tl.paired.paired_difference(abl, clean, quantity="trace")


def test_traces_and_anisotropy_pair_too(bridge):
    model = bridge("llama_gqa")
    hooks = [("blocks.0.attn.hook_z", _zero_head(1))]
    t = tl.sheaf_traces(model, PROMPTS, fwd_hooks=hooks) - tl.sheaf_traces(model, PROMPTS)
    assert t.dims == ("layer", "head") and t.difference.shape == (5, 3, 4)
    # Layer 0's pattern is computed before its z is ablated: zero up to float32 rounding (the
    # unhooked run batches in length buckets, other batches than the hooked run's).
    torch.testing.assert_close(t.difference[:, 0], torch.zeros_like(t.difference[:, 0]), rtol=0, atol=1e-6)
    a = tl.anisotropy_profile(model, PROMPTS, fwd_hooks=hooks) - tl.anisotropy_profile(model, PROMPTS)
    assert a.dims == ("state",)


def test_unpaired_runs_are_refused(bridge):
    model = bridge("gpt2")
    a = tl.residual_gain(model, PROMPTS)
    with pytest.raises(tl.ThermoLensInputError, match="prompts differ"):
        _ = tl.residual_gain(model, PROMPTS[::-1]) - a
    with pytest.raises(tl.ThermoLensInputError, match="prepend_bos differs"):
        _ = tl.residual_gain(model, PROMPTS, prepend_bos=False, token_scope="all") - \
            tl.residual_gain(model, PROMPTS, token_scope="all")
    with pytest.raises(tl.ThermoLensInputError, match="token_scope differs"):
        _ = tl.residual_gain(model, PROMPTS, token_scope="last") - a
    with pytest.raises(tl.ThermoLensInputError, match="model name differs"):
        _ = tl.residual_gain(bridge("neox"), PROMPTS) - a
    with pytest.raises(tl.ThermoLensInputError, match="same kind"):
        _ = tl.sheaf_traces(model, PROMPTS) - a


def test_gain_select_by_prompt_and_layer(bridge):
    g = tl.residual_gain(bridge("gpt2"), PROMPTS)
    s = g.select([0, -1])
    assert s.prompts == (PROMPTS[0], PROMPTS[-1]) and s.n_prompts == 2
    torch.testing.assert_close(s.block_gain, g.block_gain[[0, 4]])
    assert s.last_block_gain.mean == pytest.approx(float(g.block_gain[[0, 4], -1].double().mean()), rel=1e-6)
    torch.testing.assert_close(g.layers(-1), g.block_gain[:, [2]])
    with pytest.raises(tl.ThermoLensInputError, match="out of range"):
        g.layers(3)
    np.testing.assert_array_equal(s.to_frame()["text"].unique(), [PROMPTS[0], PROMPTS[-1]])


def test_scipy_vocabulary_and_deprecated_names(bridge):
    """statistic / pvalue / df / pvalue_holm / confidence_interval(level) as scipy's ttest_rel;
    t_statistic is a deprecated alias; a difference stored with t_statistic still loads."""
    import json
    import warnings

    model = bridge("gpt2")
    clean = tl.residual_gain(model, PROMPTS)
    abl = tl.residual_gain(model, PROMPTS, fwd_hooks=[("blocks.1.attn.hook_z", _zero_head(0))])
    d = abl - clean
    a, b = clean.block_gain.double().numpy(), abl.block_gain.double().numpy()
    ps = []
    for l in (1, 2):
        ref = stats.ttest_rel(b[:, l], a[:, l])
        assert d.statistic[l] == pytest.approx(ref.statistic, rel=1e-9) and d.df[l] == ref.df == len(PROMPTS) - 1
        for level in (0.95, 0.8):
            ci = ref.confidence_interval(level)
            assert (d.confidence_interval(level).low[l], d.confidence_interval(level).high[l]) == \
                pytest.approx((ci.low, ci.high), rel=1e-9)
        ps.append(ref.pvalue)
    # the stored level's interval is the summary's; Holm over the elements with a p-value (block 0: none)
    np.testing.assert_array_equal(d.confidence_interval(d.level).low, d.summary.ci_low)
    assert np.isnan(d.pvalue_holm[0])
    m = len(ps)
    order = np.argsort(ps)
    expect = np.maximum.accumulate([min(1.0, (m - r) * ps[i]) for r, i in enumerate(order)])
    np.testing.assert_allclose(d.pvalue_holm[1:][order], expect, rtol=1e-12)
    with pytest.warns(DeprecationWarning, match=r"t_statistic is deprecated.*\.statistic"):
        old = d.t_statistic
    np.testing.assert_array_equal(old, d.statistic)
    with pytest.raises(tl.ThermoLensInputError, match="level"):
        d.confidence_interval(1.5)
    # JSON written before the rename (schema 1, field t_statistic) reads back with the new name
    data = json.loads(d.to_json())
    data["version"] = data["thermo_lens_schema"] = 1
    data["fields"]["t_statistic"] = data["fields"].pop("statistic")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = tl.paired.PairedDifference.from_json(json.dumps(data))
    np.testing.assert_array_equal(back.statistic, d.statistic)
