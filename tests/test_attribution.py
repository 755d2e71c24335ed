"""Per-head gain attribution: the exact identity, a dense check from run_with_cache, ablation.

``head.sum(-1) + mlp + bias == total`` must hold to float32 precision on every pre-LN
architecture; each term is checked against a dense computation from the model's own cached
activations (``run_with_cache`` on the same padded tokens: per-head outputs ``z_h W_O^h``
formed explicitly, which the in-hook reduction never does), with and without a head ablation.
"""

from __future__ import annotations

import pytest
import torch

import thermo_lens as tl
from thermo_lens import ModelView
from thermo_lens.tokens import tokenize

PROMPTS = ["The capital of France is Paris", "Water", "the early bird catches the worm, and the cat sat",
           "Colorless green ideas sleep"]
PRE_LN = ("gpt2", "neox", "llama_gqa", "gptj", "opt", "gemma", "falcon", "bloom")
DENSE = ("gpt2", "neox", "llama_gqa", "gptj")


def _dense(model, prompts, token_scope, fwd_hooks=()):
    """Reference terms from run_with_cache: [prompt, layer, head] and [prompt, layer]."""
    view = ModelView(model)
    tb = tokenize(view, prompts, prepend_bos="host")  # the entry points' default
    with model.hooks(fwd_hooks=list(fwd_hooks)):
        _, cache = model.run_with_cache(tb.tokens, attention_mask=tb.mask.long())
    P, L, H = len(prompts), view.n_layers, view.n_heads
    head, mlp, bias, total = (torch.zeros(P, L, H, dtype=torch.float64), *(torch.zeros(P, L, dtype=torch.float64)
                                                                          for _ in range(3)))
    W_O = view.W_O(torch.float64)
    for p in range(P):
        n = int(tb.lengths[p])
        pos = {"all": range(n), "all_but_first": range(1, n), "last": [n - 1]}[token_scope]
        pos = list(pos)
        for l in range(L):
            x_in = cache[f"blocks.{l}.hook_resid_pre"][p, pos].double()
            x_out = cache[f"blocks.{l}.hook_resid_post"][p, pos].double()
            z = cache[f"blocks.{l}.attn.hook_z"][p, pos].double()
            o = torch.einsum("the,hed->thd", z, W_O[l])  # every head's output, [pos, head, d_model]
            s = x_out + x_in
            head[p, l] = (o * s[:, None]).sum(-1).mean(0)
            b_O, b_out = view.output_biases(l, torch.float64)
            bvec = torch.zeros(view.d_model, dtype=torch.float64)
            m = cache[f"blocks.{l}.hook_mlp_out"][p, pos].double()
            if b_O is not None:
                bvec += b_O
            if b_out is not None:
                bvec += b_out
                m = m - b_out
            mlp[p, l] = (m * s).sum(-1).mean()
            bias[p, l] = (s @ bvec).mean()
            total[p, l] = (x_out.pow(2).sum(-1) - x_in.pow(2).sum(-1)).mean()
    return head, mlp, bias, total


@pytest.mark.parametrize("arch", PRE_LN)
def test_terms_add_up_to_the_squared_norm_change(bridge, arch):
    a = tl.gain_attribution(bridge(arch), PROMPTS, batch_size=3)
    P, L, H = a.head.shape
    view = ModelView(bridge(arch))
    assert (P, L, H) == (len(PROMPTS), view.n_layers, view.n_heads)
    assert a.mlp.shape == a.bias.shape == a.total.shape == (P, L)
    scale = a.scale.abs().max()
    torch.testing.assert_close(a.head.sum(-1) + a.mlp + a.bias, a.total, rtol=0, atol=float(scale) * 1e-6)
    assert float((a.closure / a.scale).max()) < 1e-5
    assert not torch.equal(a.head, torch.zeros_like(a.head))


@pytest.mark.parametrize("arch", DENSE)
@pytest.mark.parametrize("token_scope", ["all_but_first", "last", "all"])
def test_matches_a_dense_computation_from_run_with_cache(bridge, arch, token_scope):
    model = bridge(arch)
    a = tl.gain_attribution(model, PROMPTS, token_scope=token_scope, batch_size=2)
    head, mlp, bias, total = _dense(model, PROMPTS, token_scope)
    tol = dict(rtol=1e-4, atol=float(a.scale.max()) * 1e-6)
    torch.testing.assert_close(a.head, head, **tol)
    torch.testing.assert_close(a.mlp, mlp, **tol)
    torch.testing.assert_close(a.bias, bias, **tol)
    torch.testing.assert_close(a.total, total, **tol)


@pytest.mark.parametrize("arch", DENSE)
def test_head_ablation(bridge, arch):
    """Zeroing head h: its term is exactly 0, the identity still holds, and the other terms
    match the dense computation of the ablated run; block gain moves the way total says."""
    model = bridge(arch)
    layer, h = 1, 2

    def zero(z, hook):
        z[:, :, h] = 0.0
        return z

    hooks = [(f"blocks.{layer}.attn.hook_z", zero)]
    clean = tl.gain_attribution(model, PROMPTS)
    abl = tl.gain_attribution(model, PROMPTS, fwd_hooks=hooks)
    assert torch.all(abl.head[:, layer, h] == 0) and torch.all(clean.head[:, layer, h] != 0)
    torch.testing.assert_close(abl.head.sum(-1) + abl.mlp + abl.bias, abl.total, rtol=0,
                               atol=float(abl.scale.max()) * 1e-6)
    head, mlp, bias, total = _dense(model, PROMPTS, "all_but_first", hooks)
    torch.testing.assert_close(abl.head, head, rtol=1e-4, atol=float(abl.scale.max()) * 1e-6)
    torch.testing.assert_close(abl.total, total, rtol=1e-4, atol=float(abl.scale.max()) * 1e-6)
    # blocks before the ablation are untouched
    torch.testing.assert_close(abl.total[:, :layer], clean.total[:, :layer])
    # the paired difference of the ablation: per layer, with paired CIs
    d = abl - clean
    assert d.quantity == "head" and d.difference.shape == clean.head.shape
    dt = tl.paired_difference(abl, clean, quantity="total")
    torch.testing.assert_close(dt.difference, abl.total - clean.total)


@pytest.mark.parametrize("arch", ["opt_postln", "bert"])
def test_post_ln_is_refused_clearly(bridge, arch):
    with pytest.raises(tl.ThermoLensInputError, match="post-LN"):
        tl.gain_attribution(bridge(arch), PROMPTS[:2])


def test_scope_and_frames(bridge):
    model = bridge("gpt2")
    with pytest.raises(tl.ThermoLensInputError, match="frobenius"):
        tl.gain_attribution(model, PROMPTS, token_scope="frobenius")
    a = tl.gain_attribution(model, PROMPTS)
    df = a.to_frame()
    assert list(df.columns[:4]) == ["prompt", "layer", "head", "head_term"] and len(df) == a.head.numel()
    lf = a.layer_frame()
    torch.testing.assert_close(torch.tensor(lf["total"].to_numpy()).view_as(a.total), a.total)
    top = a.top_heads(3)
    assert len(top) == 3 and top["head_term"].is_monotonic_decreasing
    back = tl.attribution.GainAttribution.from_json(a.to_json())
    assert torch.equal(back.head, a.head) and back.provenance.prompts == a.prompts
    assert "GainAttribution" in repr(a) and "exact" in repr(a)
    prof = tl.profile(model, PROMPTS)
    torch.testing.assert_close(prof.attribution.head, a.head, rtol=1e-5, atol=1e-9)


def test_heatmap_and_panel(bridge):
    model = bridge("gpt2")
    a = tl.gain_attribution(model, PROMPTS)
    fig = tl.views.attribution_heatmap(a, layers=[-1, 0], heads=[1, 3])
    (hm,) = fig.data
    import numpy as np

    np.testing.assert_allclose(np.asarray(hm.z), a.mean_head[[2, 0]][:, [1, 3]].numpy(), rtol=1e-9)
    assert list(hm.y) == ["2", "0"] and list(hm.x) == ["1", "3"] and "share" in hm.hovertemplate
    sig = tl.spectral_signature(model)
    f2 = tl.views.spectral_heatmaps(sig, attribution=a, layers=[1])
    assert [t.meta["metric"] for t in f2.data][-1] == "head_term"
    panel = tl.views.attention_panel(model, PROMPTS[0], 1, head=2, gain_prompts=PROMPTS)
    assert list(panel.metrics["head"]) == [2] and panel.pattern.shape[0] == 1
    assert panel.metrics["head_term"].iloc[0] == pytest.approx(float(a.mean_head[1, 2]), rel=1e-5)


def test_half_precision_models_close_to_their_precision(checkpoint_dir):
    """A bf16 model adds its components in bf16: the terms (float32 from bf16 activations) still
    add up to the measured change to bf16 precision, and the result says which dtype ran."""
    from transformer_lens.model_bridge import TransformerBridge

    model = TransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")), dtype=torch.bfloat16)
    a = tl.gain_attribution(model, PROMPTS)
    assert a.dtype == "bfloat16" and a.head.dtype == torch.float64
    rel = (a.head.sum(-1) + a.mlp + a.bias - a.total).abs() / a.scale
    assert float(rel.max()) < 1e-2


def test_a_hook_that_breaks_the_identity_is_named(bridge):
    def bump(x, hook):
        return x * 1.5

    with pytest.raises(tl.ThermoLensInputError, match=r"block 1's output .*user hook.*bump"):
        tl.gain_attribution(bridge("gpt2"), PROMPTS, fwd_hooks=[("blocks.1.hook_attn_out", bump)])


def test_profile_keeps_going_without_the_attribution(bridge):
    def bump(x, hook):
        return x * 1.5

    with pytest.warns(UserWarning, match="gain attribution skipped"):
        prof = tl.profile(bridge("gpt2"), PROMPTS, fwd_hooks=[("blocks.1.hook_attn_out", bump)])
    assert prof.attribution is None and "user hook" in prof.meta["attribution_skipped"]
    post = tl.profile(bridge("opt_postln"), PROMPTS)
    assert post.attribution is None and "post-LN" in post.meta["attribution_skipped"]
