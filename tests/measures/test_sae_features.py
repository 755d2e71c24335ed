"""Per-feature split of SAE terms in the gain attribution (``sae_features=True``).

References: each feature's term recomputed from the host's own ``run_with_cache`` (the SAE's latents
``hook_sae_acts_post``, its decoder, and the residual states of the block it belongs to), averaged over
the token scope by hand; the block's ``sae`` (or, for a transcoder, ``mlp``) term it must add up to;
the full feature set against the top-k variant. SAEs are SAELens modules with seeded random weights
(``thermo_lens.testing.random_sae``), never downloaded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_gain import PROMPTS
from test_hosts import LEGACY
from thermo_lens import ThermoLensInputError, gain_attribution
from thermo_lens.core.errors import ThermoLensNumericsError
from thermo_lens.measures.attribution import GainAttribution
from thermo_lens.testing import hooked_transformer, random_sae

pytestmark = pytest.mark.hosts
sae_lens = pytest.importorskip(
    "sae_lens", reason="sae-lens is not installed (it needs TransformerLens 2.16.x / 3.x): the "
                       "tl2 / tl3 CI legs run these tests")
if not LEGACY:  # pragma: no cover - sae-lens pins transformer-lens<4
    pytest.skip("HookedSAETransformer needs TransformerLens 2.16.x / 3.x", allow_module_level=True)

D_SAE = 64
ARCHS = ("standard", "topk", "jumprelu", "gated")
RTOL = 2e-4


@pytest.fixture(scope="module")
def host(checkpoint_dir):
    return hooked_transformer(checkpoint_dir("gpt2"), cls=sae_lens.HookedSAETransformer)


@pytest.fixture
def model(host):
    host.reset_saes()
    yield host
    host.reset_saes()


def _states(model, prompt, hook):
    """``(x_in, x_out)`` of the block an SAE at ``hook`` belongs to, and the cache, for one prompt."""
    _, cache = model.run_with_cache(prompt, prepend_bos=True)
    layer, where = int(hook.split(".")[1]), hook.split(".")[-1]
    out = f"{hook}.hook_sae_output"
    if where == "hook_resid_pre":  # blocks.{l}.hook_resid_pre belongs to block l - 1 (its x_out)
        return cache[f"blocks.{layer - 1}.hook_resid_pre"][0], cache[out][0], cache
    x_in = cache[f"blocks.{layer}.hook_resid_pre"][0]
    post = out if where == "hook_resid_post" else f"blocks.{layer}.hook_resid_post"
    return x_in, cache[post][0], cache


def _reference(model, sae, hook):
    """Per prompt: ``[d_sae]`` mean over positions 1.. (all_but_first) of ``f_i <W_dec[i], x_out + x_in>``,
    and the rest ``<b_dec - x, x_out + x_in>``, from run_with_cache."""
    feats, rests = [], []
    for prompt in PROMPTS:
        x_in, x_out, cache = _states(model, prompt, hook)
        s = (x_out + x_in).double()[1:]
        f = cache[f"{hook}.hook_sae_acts_post"][0].double()[1:]
        x = cache[f"{hook}.hook_sae_input"][0].double()[1:]
        W = sae.W_dec.detach().double()
        feats.append((f * (s @ W.T)).mean(0))
        rests.append(((sae.b_dec.detach().double() - x) * s).sum(-1).mean())
    return torch.stack(feats), torch.stack(rests)


@pytest.mark.parametrize("use_error_term", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("hook", ["blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"])
def test_each_feature_term_is_its_share_computed_from_the_cache(model, hook, arch, use_error_term):
    sae = random_sae(hook, 32, D_SAE, seed=3, architecture=arch, b_dec=0.1, k=6)
    model.add_sae(sae, use_error_term=use_error_term)
    r = gain_attribution(model, PROMPTS, sae_features=True, prepend_bos=True)
    layer = 0 if hook.endswith("pre") else 1
    assert r.sae_feature_layer == {hook: layer} and r.sae_features[hook].shape == (len(PROMPTS), D_SAE)
    feats, rest = _reference(model, sae, hook)
    scale = float(feats.abs().max())
    torch.testing.assert_close(r.sae_features[hook].double(), feats, atol=RTOL * scale, rtol=RTOL)
    torch.testing.assert_close(r.sae_feature_rest[hook], rest, atol=RTOL * float(rest.abs().max()), rtol=RTOL)
    # The features (every one of them active on some token: the test is not vacuous) and the rest close to
    # the block's sae term, the error term's share kept apart.
    assert (r.sae_features[hook] != 0).any(0).sum() > (6 if arch == "topk" else D_SAE // 4)
    whole = r.sae_features[hook].double().sum(-1) + r.sae_feature_rest[hook] + r.sae_feature_error[hook]
    torch.testing.assert_close(whole, r.sae[:, layer], atol=1e-6 * float(r.scale[:, layer].max()), rtol=0)
    torch.testing.assert_close(r.sae_feature_error[hook], r.sae_error[:, layer], atol=1e-9, rtol=0)
    if use_error_term:
        assert r.sae_feature_error[hook].abs().min() > 0
    else:
        assert (r.sae_feature_error[hook] == 0).all()
    assert float((r.sae_feature_closure[hook] / r.scale[:, layer]).max()) < 1e-5


def test_jumprelu_threshold_is_part_of_the_latent(model):
    """f_i = pre_i where pre_i > threshold, not pre_i - threshold: the features still close to the term."""
    hook = "blocks.1.hook_resid_post"
    sae = random_sae(hook, 32, D_SAE, seed=4, architecture="jumprelu", threshold=0.0)
    model.add_sae(sae)
    _, cache = model.run_with_cache(PROMPTS[0], prepend_bos=True)
    pre = cache[f"{hook}.hook_sae_acts_pre"]
    thr = float(pre[pre > 0].median())  # half the positive pre-activations fall below it
    with torch.no_grad():
        sae.threshold.fill_(thr)
    r = gain_attribution(model, PROMPTS, sae_features=True, prepend_bos=True)
    _, cache = model.run_with_cache(PROMPTS[0], prepend_bos=True)
    f = cache[f"{hook}.hook_sae_acts_post"]
    assert (f > 0).any() and (f[f > 0] > thr).all() and ((pre > 0) & (f == 0)).any()
    torch.testing.assert_close(f[f > 0], pre[f > 0])  # the latent is the whole pre-activation
    whole = r.sae_features[hook].double().sum(-1) + r.sae_feature_rest[hook]
    torch.testing.assert_close(whole, r.sae[:, 1], atol=1e-6 * float(r.scale[:, 1].max()), rtol=0)


def test_top_k_keeps_the_features_with_the_largest_mean_abs_term(model):
    hook = "blocks.2.hook_resid_pre"
    model.add_sae(random_sae(hook, 32, D_SAE, seed=5, b_dec=0.1))
    full = gain_attribution(model, PROMPTS, sae_features=True, prepend_bos=True)
    top = gain_attribution(model, PROMPTS, sae_features=True, sae_features_top_k=5, prepend_bos=True)
    score = full.sae_features[hook].double().abs().mean(0)
    expect = torch.argsort(score, descending=True)[:5]
    assert top.sae_feature_index[hook].tolist() == expect.tolist()
    assert score[expect].min() >= score[torch.argsort(score, descending=True)[5:]].max()
    torch.testing.assert_close(top.sae_features[hook], full.sae_features[hook][:, expect], atol=0, rtol=0)
    assert top.feature_ids(hook).tolist() == expect.tolist() and full.sae_feature_index is None
    assert "top 5 by mean |term|" in repr(top)
    df = top.feature_frame()
    assert sorted(set(df["feature"])) == sorted(expect.tolist()) and len(df) == 5 * len(PROMPTS)


def test_result_repr_frames_and_json_carry_the_features(model):
    hook = "blocks.1.hook_resid_post"
    model.add_sae(random_sae(hook, 32, D_SAE, seed=6, b_dec=0.1), use_error_term=True)
    r = gain_attribution(model, PROMPTS, sae_features=True, sae_features_top_k=10, prepend_bos=True)
    text = repr(r)
    assert f"features of {hook} (block 1, top 10 by mean |term|)" in text and "most amplifying #" in text
    back = GainAttribution.from_json(r.to_json())
    for name in ("sae_features", "sae_feature_rest", "sae_feature_error", "sae_feature_index", "sae_feature_closure"):
        a, b = getattr(r, name), getattr(back, name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert back.sae_feature_layer == r.sae_feature_layer and back.sae_features_top_k == 10
    frame = r.feature_frame()
    summary = r.feature_summary()
    merged = frame.merge(summary, on=["hook", "feature"], suffixes=("", "_summary"))
    assert len(merged) == len(frame) == 10 * len(PROMPTS)
    one = summary.iloc[0]
    x = r.sae_features[hook][:, 0].double().numpy()
    from scipy import stats

    ci = stats.ttest_1samp(x, 0).confidence_interval(0.95)
    assert int(one["feature"]) == int(r.sae_feature_index[hook][0])
    np.testing.assert_allclose([one["mean"], one["ci_low"], one["ci_high"]], [x.mean(), ci.low, ci.high], rtol=1e-6)
    top = r.top_features(3, by="mean")
    assert list(top["mean"]) == sorted(summary["mean"], reverse=True)[:3]
    rest = r.feature_rest_frame()
    np.testing.assert_allclose(rest["sae_feature_error"], r.sae_feature_error[hook].numpy())
    assert {"token_scope", "block_layout"} <= set(frame.columns)


def test_features_that_do_not_add_up_are_refused(model):
    """A hook that edits the reconstruction breaks f W_dec + b_dec = output: the check fails, naming the SAE;
    a NaN there fails it too (a NaN compares False with any tolerance)."""
    hook = "blocks.1.hook_resid_post"
    model.add_sae(random_sae(hook, 32, D_SAE, seed=7))

    def shift(x, hook):
        return x + 0.5

    with pytest.raises(ThermoLensInputError, match=f"features of the SAE at {hook} do not add up"):
        gain_attribution(model, PROMPTS, sae_features=True, fwd_hooks=[(f"{hook}.hook_sae_recons", shift)])

    def nan_one(x, hook):
        x = x.clone()
        x[:, -1, 0] = float("nan")
        return x

    # the NaN flows downstream; the block where it arose (the SAE's, block 1) is the one named
    with pytest.raises(ThermoLensNumericsError, match="term of block 1 is NaN/inf"):
        gain_attribution(model, PROMPTS, sae_features=True, fwd_hooks=[(f"{hook}.hook_sae_acts_post", nan_one)])


def test_bad_options_say_what_to_do(model):
    with pytest.raises(ThermoLensInputError, match="no SAE is attached"):
        gain_attribution(model, PROMPTS, sae_features=True)
    with pytest.raises(ThermoLensInputError, match="needs sae_features=True"):
        gain_attribution(model, PROMPTS, sae_features_top_k=3)
    model.add_sae(random_sae("blocks.1.hook_resid_post", 32, D_SAE))
    with pytest.raises(ThermoLensInputError, match="positive int"):
        gain_attribution(model, PROMPTS, sae_features=True, sae_features_top_k=0)
    with pytest.raises(ThermoLensInputError, match="has no per-feature SAE terms"):
        gain_attribution(model, PROMPTS).feature_frame()


def _block_states(model, prompt, layer):
    _, cache = model.run_with_cache(prompt, prepend_bos=True)
    return cache[f"blocks.{layer}.hook_resid_pre"][0], cache[f"blocks.{layer}.hook_resid_post"][0], cache


@pytest.mark.parametrize("use_error_term", [False, True])
@pytest.mark.parametrize("where", ["attn.hook_z", "hook_mlp_out"])
def test_sae_inside_a_component_splits_it_per_feature(model, where, use_error_term):
    """An SAE at attn.hook_z writes through W_O: feature i adds f_i W_dec[i] (per head, d_head each) W_O;
    at hook_mlp_out it adds f_i W_dec[i]. Each term is <that, x_out + x_in> of the block, from the cache."""
    layer, hook = 1, f"blocks.1.{where}"
    sae = random_sae(hook, 32, D_SAE, seed=8, b_dec=0.1)
    model.add_sae(sae, use_error_term=use_error_term)
    r = gain_attribution(model, PROMPTS, sae_features=True, prepend_bos=True)
    W = sae.W_dec.detach().double()
    if where == "attn.hook_z":  # [d_sae, H * d_head] -> the stream: sum_h W_dec[i, h] W_O^h
        W_O = model.W_O[layer].detach().double()  # [H, d_head, d_model]
        W = torch.einsum("ihd,hdm->im", W.view(D_SAE, *W_O.shape[:2]), W_O)
        b = torch.einsum("hd,hdm->m", sae.b_dec.detach().double().view(W_O.shape[:2]), W_O)
    else:
        b = sae.b_dec.detach().double()
    feats, offsets = [], []
    for prompt in PROMPTS:
        x_in, x_out, cache = _block_states(model, prompt, layer)
        s = (x_out + x_in).double()[1:]
        f = cache[f"{hook}.hook_sae_acts_post"][0].double().flatten(1)[1:]
        feats.append((f * (s @ W.T)).mean(0))
        offsets.append((s @ b).mean())
    feats_ref = torch.stack(feats)
    torch.testing.assert_close(r.sae_features[hook].double(), feats_ref, atol=RTOL * float(feats_ref.abs().max()),
                               rtol=RTOL)
    whole = r.sae_features[hook].double().sum(-1) + r.sae_feature_rest[hook] + r.sae_feature_error[hook]
    tol = 1e-6 * float(r.scale[:, layer].max())
    torch.testing.assert_close(whole, r.sae[:, layer], atol=tol, rtol=0)
    # The component as it ran (read at the SAE's input, plus the SAE's change) is the features, the
    # decoder bias's write and the error term: x cancels.
    component = (r.head[:, layer].sum(-1) if where == "attn.hook_z" else r.mlp[:, layer]) + r.sae[:, layer]
    torch.testing.assert_close(component, r.sae_features[hook].double().sum(-1) + torch.stack(offsets)
                               + r.sae_feature_error[hook], atol=tol, rtol=0)


@pytest.mark.parametrize("use_error_term", [False, True])
def test_transcoder_replacing_an_mlp_splits_the_mlp_term(model, use_error_term):
    layer = 1
    tc = random_sae(f"blocks.{layer}.ln2.hook_normalized", 32, D_SAE, seed=9, architecture="transcoder", b_dec=0.1,
                    hook_name_out=f"blocks.{layer}.hook_mlp_out")
    model.add_sae(tc, use_error_term=use_error_term)
    key = f"blocks.{layer}.ln2.hook_normalized"
    r = gain_attribution(model, PROMPTS, sae_features=True, prepend_bos=True)
    assert r.sae_feature_layer == {key: layer}
    W, b_out = tc.W_dec.detach().double(), model.b_out[layer].detach().double()
    feats, rests = [], []
    for prompt in PROMPTS:
        x_in, x_out, cache = _block_states(model, prompt, layer)
        s = (x_out + x_in).double()[1:]
        f = cache[f"blocks.{layer}.hook_mlp_out.hook_sae_acts_post"][0].double()[1:]
        feats.append((f * (s @ W.T)).mean(0))
        rests.append((s @ (tc.b_dec.detach().double() - b_out)).mean())
    ref = torch.stack(feats)
    torch.testing.assert_close(r.sae_features[key].double(), ref, atol=RTOL * float(ref.abs().max()), rtol=RTOL)
    torch.testing.assert_close(r.sae_feature_rest[key], torch.stack(rests), atol=1e-6, rtol=RTOL)
    whole = r.sae_features[key].double().sum(-1) + r.sae_feature_rest[key] + r.sae_feature_error[key]
    torch.testing.assert_close(whole, r.mlp[:, layer], atol=1e-6 * float(r.scale[:, layer].max()), rtol=0)
    assert (r.sae_feature_error[key] != 0).all() == use_error_term


def test_sae_transformer_bridge_gives_the_same_features(model, checkpoint_dir):
    try:
        from sae_lens.analysis.sae_transformer_bridge import SAETransformerBridge
    except ImportError:
        pytest.skip("this sae-lens / TransformerLens has no SAETransformerBridge (TransformerLens 3.x)")
    bridge = SAETransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")))
    for hook in ("blocks.1.hook_resid_post", "blocks.2.hook_resid_pre"):
        for m in (model, bridge):
            m.add_sae(random_sae(hook, 32, D_SAE, seed=10, b_dec=0.1, architecture="topk", k=6), use_error_term=True)
    a = gain_attribution(model, PROMPTS, sae_features=True, prepend_bos=True)
    b = gain_attribution(bridge, PROMPTS, sae_features=True, prepend_bos=True)
    assert a.sae_feature_layer == b.sae_feature_layer == {"blocks.1.hook_resid_post": 1, "blocks.2.hook_resid_pre": 1}
    for k in a.sae_features:
        scale = float(a.sae_features[k].abs().max())
        torch.testing.assert_close(b.sae_features[k], a.sae_features[k], atol=1e-4 * scale, rtol=1e-4)
        torch.testing.assert_close(b.sae_feature_rest[k], a.sae_feature_rest[k], atol=1e-4 * scale, rtol=1e-4)


def test_registered_feature_metrics_are_in_their_frames(model):
    from thermo_lens.core import registry

    model.add_sae(random_sae("blocks.1.hook_resid_post", 32, D_SAE, seed=11, b_dec=0.1), use_error_term=True)
    r = gain_attribution(model, PROMPTS, sae_features=True, prepend_bos=True)
    names = {"sae_feature_term", "sae_feature_rest", "sae_feature_error"}
    for m in registry.metrics():
        if m.name in names:
            names.discard(m.name)
            frame = getattr(r, m.frame)()
            assert m.frame_column in frame.columns and np.isfinite(frame[m.frame_column]).all(), m.name
            assert isinstance(m.values(r), dict)
    assert not names


# ---------------------------------------------------------------------------- feature sweeps
def _tokens(n: int, seed: int) -> torch.Tensor:
    """Token ids of one length (mean and resample need aligned positions)."""
    return torch.randint(1, 250, (n, 7), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_feature_ablation_sweep_equals_hand_written_hooks(model, method):
    import thermo_lens as tl
    from scipy import stats

    hook = "blocks.1.hook_resid_post"
    acts = f"{hook}.hook_sae_acts_post"
    model.add_sae(random_sae(hook, 32, D_SAE, seed=12, b_dec=0.1), use_error_term=True)
    toks = _tokens(4, 0)
    full = gain_attribution(model, toks, sae_features=True)
    feats = full.top_features(3, hook=hook)["feature"].astype(int).tolist()
    res = tl.ablation_sweep(model, toks, acts, over="feature", features=feats, method=method,
                            measure="total_amplification")
    base = tl.residual_gain(model, toks).summaries["total_amplification"].values
    _, cache = model.run_with_cache(toks)
    clean_f = cache[acts]
    src = list(range(len(toks)))
    if method == "resample":  # the source of each prompt, as the result records it
        src = [int(v) for v in res.reference.split("source=")[1].strip("[]").split(",")]
        assert all(s != p for p, s in enumerate(src))
    for c, f in enumerate(feats):
        per = []
        for p in range(len(toks)):
            def edit(x, hook, p=p, f=f):
                x = x.clone()
                x[:, :, f] = {"zero": torch.zeros(()), "mean": clean_f[:, :, f].mean(0)[None],
                              "resample": clean_f[src[p], :, f][None]}[method]
                return x
            g = tl.residual_gain(model, toks[p:p + 1], fwd_hooks=[(acts, edit)])
            per.append(float(g.summaries["total_amplification"].values[0]) - float(base[p]))
        np.testing.assert_allclose(res.per_prompt[:, 0, c].numpy(), per, rtol=1e-4, atol=1e-6)
        ci = stats.ttest_1samp(per, 0).confidence_interval(0.95)
        np.testing.assert_allclose([res.ci_low[0, c], res.ci_high[0, c]], [ci.low, ci.high], rtol=1e-3, atol=1e-9)
    assert res.over == ("feature",) and res.heads == tuple(feats) and res.hook == acts
    assert (res.per_prompt.abs() > 1e-6).any()
    from thermo_lens.stats import holm

    np.testing.assert_allclose(res.pvalue_adjusted.numpy().ravel(), holm(res.pvalue.numpy().ravel()))
    df = res.to_frame()
    assert list(df["feature"]) == feats and set(df["sae_hook"]) == {hook}
    merged = df.merge(full.feature_summary(), on=["sae_hook", "feature"])
    assert len(merged) == len(feats)
    assert "over feature" in repr(res)


def test_feature_patch_sweep_and_feature_readout(model):
    import thermo_lens as tl

    hook = "blocks.1.hook_resid_post"
    acts = f"{hook}.hook_sae_acts_post"
    model.add_sae(random_sae(hook, 32, D_SAE, seed=13, b_dec=0.1))
    clean, corrupted = _tokens(2, 1), _tokens(2, 2)
    res = tl.patch_sweep(model, clean, corrupted, acts, over="feature", features=[0, 5], measure="last_block_gain")
    _, cache = model.run_with_cache(clean)
    base = tl.residual_gain(model, corrupted).block_gain[:, -1]
    for c, f in enumerate([0, 5]):
        for p in range(2):
            def patch(x, hook, p=p, f=f):
                x = x.clone()
                x[:, :, f] = cache[acts][p, :, f]
                return x
            g = tl.residual_gain(model, corrupted[p:p + 1], fwd_hooks=[(acts, patch)]).block_gain[0, -1]
            np.testing.assert_allclose(float(res.per_prompt[p, 0, c]), float(g - base[p]), rtol=1e-4, atol=1e-7)
    # The latent as a measure: a head sweep's readout of feature 5, against the cache by hand.
    toks = _tokens(3, 3)
    head_sweep = tl.ablation_sweep(model, toks, "attn.hook_z", layers=[0], heads=[1], measure=f"sae_feature:{hook}.5")
    _, c0 = model.run_with_cache(toks)
    ref = c0[acts][:, 1:, 5].double().mean(1)
    np.testing.assert_allclose(head_sweep.baseline.numpy(), ref.numpy(), rtol=1e-5, atol=1e-8)
    assert head_sweep.measure == f"sae_feature:{hook}.5"

    def ablate_head(x, hook):
        x = x.clone()
        x[:, :, 1] = 0
        return x
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", ablate_head)]):
        _, c1 = model.run_with_cache(toks)
    np.testing.assert_allclose(head_sweep.per_prompt[:, 0, 0].numpy(),
                               (c1[acts][:, 1:, 5].double().mean(1) - ref).numpy(), rtol=1e-4, atol=1e-7)
    with pytest.raises(ThermoLensInputError, match="needs features="):
        tl.ablation_sweep(model, toks, acts, over="feature")
    with pytest.raises(ThermoLensInputError, match="out of range"):
        tl.ablation_sweep(model, toks, acts, over="feature", features=[D_SAE])
    with pytest.raises(ThermoLensInputError, match="no SAE is attached at"):
        tl.ablation_sweep(model, toks, "blocks.0.hook_resid_post.hook_sae_acts_post", over="feature", features=[0])
    with pytest.raises(ThermoLensInputError, match="pass over='feature'"):
        tl.ablation_sweep(model, toks, "attn.hook_z", features=[0])


# ---------------------------------------------------------------------------- views
def test_feature_chart_and_panel(model):
    from thermo_lens.views import FeaturePanel, feature_panel

    hook = "blocks.1.hook_resid_post"
    sae = random_sae(hook, 32, D_SAE, seed=14, b_dec=0.1)
    model.add_sae(sae)
    r = gain_attribution(model, PROMPTS, sae_features=True, prepend_bos=True)
    fig = r.plot_features(k=3)
    summary = r.feature_summary()
    amp = next(t for t in fig.data if t.meta["role"] == "amplify")
    expect = summary.sort_values("mean", ascending=False).head(3)
    expect = expect[expect["mean"] > 0]
    assert amp.meta["features"] == expect["feature"].astype(int).tolist()
    np.testing.assert_allclose(amp.x, expect["mean"])
    np.testing.assert_allclose(np.asarray(amp.error_x.array) + amp.x, expect["ci_high"])
    damp = [t for t in fig.data if t.meta["role"] == "damp"]
    assert all((np.asarray(t.x) < 0).all() for t in damp)
    f = int(expect["feature"].iloc[0])
    panel = feature_panel(model, r, hook, f, PROMPTS[:2], include_js=False)
    assert isinstance(panel, FeaturePanel)
    torch.testing.assert_close(panel.terms, r.sae_features[hook][:, f].double())
    _, cache = model.run_with_cache(PROMPTS[0], prepend_bos=True)
    torch.testing.assert_close(panel.activations[0], cache[f"{hook}.hook_sae_acts_post"][0, :, f])
    assert panel.decoder_norm == pytest.approx(float(sae.W_dec[f].detach().norm()))
    # cosine with head h's output space: the norm of W_dec[f]'s projection on the row space of W_O^h
    w = sae.W_dec[f].detach().double()
    W_O = model.W_O[1].detach().double()
    for h in range(W_O.shape[0]):
        proj = W_O[h].T @ torch.linalg.lstsq(W_O[h].T, w[:, None]).solution
        assert float(panel.head_cosine[h]) == pytest.approx(float(proj.norm() / w.norm()), rel=1e-5)
    assert "ColoredTokens" in panel.html and len(panel.tokens[0]) == len(panel.activations[0])
