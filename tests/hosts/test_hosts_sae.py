"""SAEs spliced in with SAELens' ``HookedSAETransformer.add_sae``: every metric reads the residual
stream downstream of the SAE, results record the SAEs, and ``sae_gain_change`` is the paired
with/without comparison.

References: the same weights as a plain ``HookedTransformer`` with a user hook that replaces the
activation by ``sae(x)`` (no SAE wrapper involved), the host's own ``run_with_cache`` at
``<hook>.hook_sae_output``, and scipy's paired t-test interval. SAEs are built locally with seeded
random weights (``thermo_lens.testing.random_sae``), never downloaded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_gain import PROMPTS
from test_hosts import LEGACY, TOL
from thermo_lens.core import attached
from thermo_lens import ModelView, ThermoLensInputError, residual_gain, sae_gain_change, sheaf_traces
from thermo_lens.core.passes import collect
from thermo_lens.measures.gain import residual_norms
from thermo_lens.measures.sae import SAEGainChange
from thermo_lens.testing import hooked_transformer, random_sae

pytestmark = pytest.mark.hosts
sae_lens = pytest.importorskip(
    "sae_lens", reason="sae-lens is not installed (it needs TransformerLens 2.16.x / 3.x): the "
                       "tl2 / tl3 CI legs run these tests")
if not LEGACY:  # pragma: no cover - sae-lens pins transformer-lens<4
    pytest.skip("HookedSAETransformer needs TransformerLens 2.16.x / 3.x", allow_module_level=True)

HOOK = "blocks.1.hook_resid_post"
D_SAE = 64


def _sae_bridge_cls():
    try:
        from sae_lens.analysis.sae_transformer_bridge import SAETransformerBridge
    except ImportError:
        return None
    return SAETransformerBridge


@pytest.fixture(scope="module", params=["HookedSAETransformer", "SAETransformerBridge"])
def models(request, checkpoint_dir):
    """(SAE host, plain HookedTransformer) on the same gpt2 fixture weights."""
    if request.param == "HookedSAETransformer":
        sae_model = hooked_transformer(checkpoint_dir("gpt2"), cls=sae_lens.HookedSAETransformer)
    else:
        cls = _sae_bridge_cls()
        if cls is None:
            pytest.skip("this sae-lens / TransformerLens has no SAETransformerBridge (TransformerLens 3.x)")
        sae_model = cls.boot_transformers(str(checkpoint_dir("gpt2")))
    plain = hooked_transformer(checkpoint_dir("gpt2"))
    return sae_model, plain


@pytest.fixture
def model(models, checkpoint_dir):
    m = models[0]
    if "Bridge" in type(m).__name__:
        # A fresh bridge per test: after reset_saes, SAETransformerBridge's hook point stops firing.
        yield type(m).boot_transformers(str(checkpoint_dir("gpt2")))
        return
    m.reset_saes()
    yield m
    m.reset_saes()


@pytest.fixture
def plain(models):
    return models[1]


def _replace_with(sae):
    def hook(x, hook=None):
        return sae(x)
    return hook


@pytest.mark.parametrize("use_error_term", [False, True])
def test_every_metric_reads_the_stream_downstream_of_the_sae(use_error_term, model, plain):
    sae = random_sae(HOOK, 32, D_SAE, seed=1)
    baseline = residual_gain(model, PROMPTS, prepend_bos=True)
    model.add_sae(sae, use_error_term=use_error_term)
    g = residual_gain(model, PROMPTS, prepend_bos=True)  # was: TypeError ... _SAEWrapper
    # Independent: the plain host with the activation replaced by sae(x) in a user hook (by x
    # itself with the error term: sae(x) + (x - sae(x))).
    hooks = [] if use_error_term else [(HOOK, _replace_with(sae))]
    ref = residual_gain(plain, PROMPTS, prepend_bos=True, fwd_hooks=hooks)
    torch.testing.assert_close(g.block_gain, ref.block_gain, atol=TOL, rtol=TOL)
    if use_error_term:  # sae(x) + (x - sae(x)) = x up to rounding
        torch.testing.assert_close(g.block_gain, baseline.block_gain, atol=TOL, rtol=TOL)
    else:
        assert (g.block_gain[:, 1] - baseline.block_gain[:, 1]).abs().min() > 1e-3
        torch.testing.assert_close(g.block_gain[:, 0], baseline.block_gain[:, 0], atol=0, rtol=0)
    # The host's own cache of what flows downstream.
    view = ModelView(model)
    c = collect(model, [PROMPTS[0]], [residual_norms], prepend_bos="host")
    _, cache = model.run_with_cache(PROMPTS[0])
    out = attached.resolve_hook(model, HOOK)  # blocks.1.hook_resid_post.hook_sae_output (bridge: hook_out...)
    assert out.endswith(".hook_sae_output")
    torch.testing.assert_close(c.stack("resid_norm")[2, 0], cache[out][0].norm(dim=-1), atol=TOL, rtol=TOL)
    rec = g.model["saes"]
    assert rec == [{"hook": HOOK, "hook_out": HOOK, "d_in": 32, "d_sae": D_SAE,
                    "use_error_term": use_error_term, "architecture": "standard"}]
    assert view.metadata()["host"].startswith(type(model).__name__)
    # The pattern-based metric runs too, and records the SAE.
    t = sheaf_traces(model, PROMPTS, prepend_bos=True)
    assert t.model["saes"] == rec


def test_sae_at_resid_pre_is_read_as_the_next_blocks_input(model, plain):
    hook = "blocks.2.hook_resid_pre"
    sae = random_sae(hook, 32, D_SAE, seed=2)
    model.add_sae(sae)
    view = ModelView(model)
    assert view.resid_hook_names[2] == hook
    g = residual_gain(model, PROMPTS, token_scope="last", prepend_bos=True)
    # Reference: norms captured on the plain model right after the replacement.
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", hook, "blocks.2.hook_resid_post"]
    for p, prompt in enumerate(PROMPTS):
        got = {}

        def grab(x, hook, got=got):
            got[hook.name] = x[0, -1].norm().item()
        toks = plain.to_tokens(prompt, prepend_bos=True)
        plain.run_with_hooks(toks, fwd_hooks=[(hook, _replace_with(sae))] + [(n, grab) for n in names])
        ref = [got[names[i + 1]] / got[names[i]] for i in range(3)]
        np.testing.assert_allclose(g.block_gain[p].numpy(), ref, rtol=1e-5)


def test_sae_gain_change_is_the_paired_difference_with_ci(model, plain):
    from scipy import stats

    sae = random_sae(HOOK, 32, D_SAE, seed=1)
    model.add_sae(sae)
    res = sae_gain_change(model, PROMPTS, prepend_bos=True)
    # Independent runs: the SAE model as it is, and the plain model.
    with_ = residual_gain(model, PROMPTS, prepend_bos=True).block_gain.double()
    without = residual_gain(plain, PROMPTS, prepend_bos=True).block_gain.double()
    torch.testing.assert_close(res.delta.double(), with_ - without, atol=TOL, rtol=TOL)
    assert (res.delta[:, 0] == 0).all()  # block 0 runs before the SAE
    for l in (1, 2):
        d = (with_ - without)[:, l].numpy()
        ci = stats.ttest_rel((with_[:, l]).numpy(), without[:, l].numpy()).confidence_interval(0.95)
        np.testing.assert_allclose([res.delta_summary.ci_low[l], res.delta_summary.ci_high[l]],
                                   [ci.low, ci.high], rtol=1e-4)
        np.testing.assert_allclose(res.delta_summary.mean[l], d.mean(), rtol=1e-5)
    # The SAE is attached again afterwards, with its settings.
    assert attached.sae_records(model) == list(res.saes)
    assert res.saes[0]["hook"] == HOOK and res.saes[0]["d_sae"] == D_SAE
    df = res.to_frame()  # a PairedDifference's frame, with where the SAEs sit
    assert list(df["layer"]) == [0, 1, 2] and df.loc[1, "saes_at_layer"] == HOOK
    assert df.loc[0, "mean_difference"] == 0 and {"ci_low", "t", "pvalue", "t_test"} <= set(df.columns)
    for l in (1, 2):
        ref = stats.ttest_rel(with_[:, l].numpy(), without[:, l].numpy())
        np.testing.assert_allclose(df.loc[l, "pvalue"], ref.pvalue, rtol=1e-3)
    assert df.loc[0, "t_test"].startswith("undefined: zero variance")
    back = SAEGainChange.from_json(res.to_json())
    torch.testing.assert_close(back.delta, res.delta, atol=0, rtol=0)
    # stored by the schema before the scipy names (version 2, its t statistic as t_statistic): still loads
    import json
    data = json.loads(res.to_json())
    data["version"] = data["thermo_lens_schema"] = 2
    data["fields"]["t_statistic"] = data["fields"].pop("statistic")
    old = SAEGainChange.from_json(json.dumps(data))
    np.testing.assert_array_equal(old.statistic, res.statistic)
    np.testing.assert_array_equal(old.df, np.full(3, len(PROMPTS) - 1.0))
    assert "layer 1" in repr(res)
    fig = res.plot()
    roles = [t.meta.get("role") for t in fig.data if isinstance(t.meta, dict)]
    assert {"with_saes", "without_saes", "delta"} <= set(roles)
    delta_trace = next(t for t in fig.data if isinstance(t.meta, dict) and t.meta.get("role") == "delta")
    np.testing.assert_allclose(delta_trace.y, res.delta_summary.mean)


def test_sae_gain_change_with_error_term_is_zero_and_leaves_the_model_clean(model):
    sae = random_sae(HOOK, 32, D_SAE, seed=3)
    if "Bridge" in type(model).__name__:
        with pytest.raises(ThermoLensInputError, match="attach the SAEs first.*model.add_sae"):
            sae_gain_change(model, PROMPTS, saes=[sae])
        model.add_sae(sae, use_error_term=True)
        res = sae_gain_change(model, PROMPTS, prepend_bos=True)
        assert res.delta.abs().max() < TOL and attached.sae_records(model)[0]["use_error_term"] is True
        return
    res = sae_gain_change(model, PROMPTS, saes=[sae], use_error_term=True, prepend_bos=True)
    assert res.delta.abs().max() < TOL
    assert res.saes[0]["use_error_term"] is True
    assert attached.sae_records(model) == []  # attached for the comparison only
    off = sae_gain_change(model, PROMPTS, saes=sae, use_error_term=False, prepend_bos=True)
    assert off.delta[:, 1].abs().min() > 1e-3


def test_sae_of_the_wrong_width_says_what_to_do(model):
    model.add_sae(random_sae(HOOK, 16, D_SAE))
    with pytest.raises(ThermoLensInputError, match=r"d_in=16.*d_model=32.*reset_saes\('blocks.1.hook_resid_post'\)"):
        residual_gain(model, PROMPTS)
    with pytest.raises(ThermoLensInputError, match=r"d_in=16.*d_model=32"):
        sae_gain_change(model, PROMPTS)


def test_sae_on_a_hook_thermo_lens_does_not_read_says_what_to_do(model):
    if "Bridge" in type(model).__name__:
        pytest.skip("saes= is HookedSAETransformer-only (checked in the error-term test)")
    z = random_sae("blocks.0.attn.hook_z", 32, D_SAE)
    with pytest.raises(ThermoLensInputError, match=r"'blocks.0.attn.hook_z'.*not on the residual stream.*hook_resid_post"):
        sae_gain_change(model, PROMPTS, saes=[z])
    far = random_sae("blocks.7.hook_resid_post", 32, D_SAE)
    with pytest.raises(ThermoLensInputError, match=r"no such hook point.*blocks are 0\.\.2"):
        sae_gain_change(model, PROMPTS, saes=[far])
    with pytest.raises(ThermoLensInputError, match="no SAE is attached.*add_sae"):
        sae_gain_change(model, PROMPTS)


def test_sae_gain_change_needs_an_sae_host(plain):
    with pytest.raises(ThermoLensInputError, match="cannot hold SAEs.*HookedSAETransformer"):
        sae_gain_change(plain, PROMPTS, saes=[random_sae(HOOK, 32, D_SAE)])


def test_user_hook_on_an_sae_hook_point_sees_the_sae_output(model):
    sae = random_sae(HOOK, 32, D_SAE, seed=1)
    model.add_sae(sae)
    seen = {}

    def spy(x, hook):
        seen["name"] = hook.name
    residual_gain(model, PROMPTS[:1], fwd_hooks=[(HOOK, spy)])
    assert seen["name"] == attached.resolve_hook(model, HOOK) and seen["name"].endswith(".hook_sae_output")


def test_sae_bridge_without_saes_equals_the_plain_host(models, checkpoint_dir):
    """SAETransformerBridge resolves TransformerLens' hook names through its own aliases."""
    if "Bridge" not in type(models[0]).__name__:
        pytest.skip("SAETransformerBridge only")
    fresh = type(models[0]).boot_transformers(str(checkpoint_dir("gpt2")))
    a = residual_gain(fresh, PROMPTS, prepend_bos=True).block_gain
    b = residual_gain(models[1], PROMPTS, prepend_bos=True).block_gain
    torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)
