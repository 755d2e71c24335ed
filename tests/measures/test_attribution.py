"""Per-head gain attribution: the exact identity, a dense check from run_with_cache, ablation.

``head.sum(-1) + mlp + bias + norm + sae == total`` must hold to float32 precision on every
layout; each term is checked against a dense computation from the model's own cached
activations (``run_with_cache`` on the same padded tokens: per-head outputs ``z_h W_O^h``
formed explicitly, which the in-hook reduction never does), with and without a head ablation.
Post-LN blocks are checked against the LayerNorms' frozen maps applied forward; SAEs spliced in
with SAELens (``hosts`` marker: TransformerLens 2.16 / 3.x legs) against ``run_with_cache`` at the
SAE's input and output. The other families (sandwich, multiplier, MoE) are the slow tier's
architecture matrix (``tests/models/test_architectures.py``), against the HF model's own tensors.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import thermo_lens as tl
from thermo_lens import ModelView
from thermo_lens.core.tokens import tokenize

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
def test_post_ln_blocks_split_exactly_with_a_normalisation_term(bridge, arch):
    """x_out = L_2(L_1(x_in + A) + M): with each LayerNorm's per-token scale frozen, the heads'
    terms are <A_2 A_1 z_h W_O^h, s>, formed here forward from run_with_cache (each norm's scale
    recomputed from its own input and eps), and the incoming stream's rescaling is the norm term."""
    model = bridge(arch)
    view = ModelView(model)
    assert view.layout.kind == "post" and [n.module for n in view.layout.stream_norms] == ["ln1", "ln2"]
    a = tl.gain_attribution(model, PROMPTS, token_scope="all", batch_size=2)
    assert float((a.closure / a.scale).max()) < 1e-5 and float(a.norm.abs().min()) > 0
    assert "post-LN" in repr(a) and "norm" in repr(a) and set(a.layer_frame().columns) >= {"norm", "sae"}
    tb = tokenize(view, PROMPTS, prepend_bos="host")
    # TransformerLens 4.3 cannot cache OPT's blocks.{l}.ln2.hook_in (its HF layer flattens the batch
    # there); ln2's input is ln1's output plus the MLP's, read instead.
    wanted = ("hook_resid_pre", "hook_resid_post", "attn.hook_z", "ln1.hook_in", "ln1.hook_out", "hook_mlp_out")
    _, cache = model.run_with_cache(tb.tokens, attention_mask=tb.mask.long(), names_filter=lambda n: n.endswith(wanted))
    W_O = view.W_O(torch.float64)
    for p in range(len(PROMPTS)):
        n = int(tb.lengths[p])
        for l in range(view.n_layers):
            x_in = cache[f"blocks.{l}.hook_resid_pre"][p, :n].double()
            x_out = cache[f"blocks.{l}.hook_resid_post"][p, :n].double()
            c = torch.einsum("the,hed->htd", cache[f"blocks.{l}.attn.hook_z"][p, :n].double(), W_O[l])
            ln_in = {"ln1": cache[f"blocks.{l}.ln1.hook_in"][p, :n],
                     "ln2": cache[f"blocks.{l}.ln1.hook_out"][p, :n] + cache[f"blocks.{l}.hook_mlp_out"][p, :n]}
            for k in ("ln1", "ln2"):
                ln = model.blocks[l].submodules[k].original_component
                y = ln_in[k].double()
                yc = y - y.mean(-1, keepdim=True)
                r = 1 / torch.sqrt(yc.pow(2).mean(-1, keepdim=True) + ln.eps)
                c = r * ln.weight.double() * (c - c.mean(-1, keepdim=True))
            head = (c * (x_out + x_in)).sum(-1).mean(-1)
            torch.testing.assert_close(a.head[p, l], head, rtol=0, atol=float(a.scale[p, l]) * 1e-5)


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


@pytest.mark.slow
def test_heatmap_and_panel(bridge):
    model = bridge("gpt2")
    a = tl.gain_attribution(model, PROMPTS)
    fig = tl.views.attribution_heatmap(a, layers=[-1, 0], heads=[1, 3])
    hm, comp = fig.data
    import numpy as np

    assert hm.meta["role"] == "heatmap" and comp.meta["role"] == "components"
    np.testing.assert_allclose(np.asarray(hm.z), a.mean_head[[2, 0]][:, [1, 3]].numpy(), rtol=1e-9)
    assert list(hm.y) == ["2", "0"] and list(hm.x) == ["1", "3"] and "share" in hm.hovertemplate
    # beside the heads: the MLP, the biases and the block's total, and they add up (all heads)
    assert list(comp.x) == ["MLP", "bias", "total"] and list(comp.y) == ["2", "0"]
    full = tl.views.attribution_heatmap(a).data
    heads, rest = np.asarray(full[0].z), np.asarray(full[1].z)
    np.testing.assert_allclose(rest[:, 0], a.mlp.mean(0).numpy(), rtol=1e-9)
    np.testing.assert_allclose(rest[:, -1], a.total.mean(0).numpy(), rtol=1e-9)
    np.testing.assert_allclose(heads.sum(1) + rest[:, :-1].sum(1), rest[:, -1], rtol=1e-3, atol=1e-4)
    assert full[0].texttemplate == "%{z:.3g}" and "value %{z:.4g}" in full[1].hovertemplate
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
    assert "exact up to the model's bfloat16 rounding" in repr(a)  # not a bare "exact"


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
    assert post.attribution is not None and not post.meta["skipped"]
    # A block with no exact split: the reason (architecture and component) is recorded, not dropped.
    view = ModelView(bridge("gpt2"))
    view.layout = dataclasses.replace(view.layout, unsupported="gpt2 (gpt2): test block component X")
    with pytest.raises(tl.ThermoLensInputError, match="component X"):
        tl.gain_attribution(view, PROMPTS)
    prof = tl.profile(view, PROMPTS)
    assert prof.attribution is None and prof.meta["skipped"]["attribution"] == "gpt2 (gpt2): test block component X"


def test_results_stored_before_the_new_terms_still_load(bridge):
    """A GainAttribution stored under schema 1 (no norm, sae, sae_error, expert fields) reads back
    with those terms 0 and the MLP as one expert, and the identity still holds."""
    import json

    a = tl.gain_attribution(bridge("gpt2"), PROMPTS[:2])
    data = json.loads(a.to_json())
    for k in ("norm", "sae", "sae_error", "expert"):
        del data["fields"][k]
    data["version"] = data["thermo_lens_schema"] = 1
    old = tl.attribution.GainAttribution.from_json(json.dumps(data))
    assert torch.equal(old.norm, torch.zeros_like(old.total)) and torch.equal(old.expert[..., 0], old.mlp)
    torch.testing.assert_close(old.head.sum(-1) + old.mlp + old.bias + old.norm + old.sae, old.total,
                               rtol=0, atol=float(old.scale.max()) * 1e-6)


# ---------------------------------------------------------------------------- legacy hosts
def _legacy():
    from thermo_lens.core.host import _parse, transformer_lens_version

    if _parse(transformer_lens_version())[0] not in (2, 3):
        pytest.skip("HookedEncoder / HookedSAETransformer need TransformerLens 2.16.x / 3.x (the tl2 / tl3 legs)")


def _encoders(checkpoint_dir):
    """(name, checkpoint directory) of the BERT fixture and, when installed, the real MiniLM."""
    from thermo_lens.testing import minilm_path

    out = [("bert", checkpoint_dir("bert"))]
    try:
        out.append(("minilm", minilm_path()))
    except ModuleNotFoundError:
        pass
    return out


@pytest.mark.hosts
def test_hooked_encoder_reads_the_stream_the_next_block_receives(checkpoint_dir):
    """HookedEncoder's hook_resid_post is taken before the block's last LayerNorm: thermo-lens reads
    x_{l+1} at hook_normalized_resid_post, so the gains are the HF layers' own (hidden_states, which
    BERT never final-norms) and the attribution closes with its normalisation term."""
    _legacy()
    import transformers

    from thermo_lens.testing import hooked_encoder

    for name, path in _encoders(checkpoint_dir):
        model = hooked_encoder(path)
        view = ModelView(model)
        assert view.backend == "hooked_encoder" and view.layout.kind == "post"
        # x_l where block l reads it (blocks.{l}.hook_resid_pre, the previous block's normalised output), x_L
        # the last block's normalised output
        L = view.n_layers
        assert view.resid_hook_names == tuple([f"blocks.{l}.hook_resid_pre" for l in range(L)]
                                              + [f"blocks.{L - 1}.hook_normalized_resid_post"])
        g = tl.residual_gain(model, PROMPTS, token_scope="all", batch_size=2)
        hf = transformers.BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
        tb = tokenize(view, PROMPTS, prepend_bos="host")
        for p in range(len(PROMPTS)):
            n = int(tb.lengths[p])
            with torch.no_grad():
                hs = hf(input_ids=tb.tokens[p:p + 1, :n], output_hidden_states=True).hidden_states
            ref = torch.stack([(hs[l + 1][0].norm(dim=-1) / hs[l][0].norm(dim=-1)).mean() for l in range(view.n_layers)])
            torch.testing.assert_close(g.block_gain[p].double(), ref.double(), rtol=1e-5, atol=0, msg=name)
        a = tl.gain_attribution(model, PROMPTS, token_scope="all", batch_size=2)
        assert float((a.closure / a.scale).max()) < 1e-5 and float(a.norm.abs().min()) > 0, name
        tr = tl.sheaf_traces(model, PROMPTS)
        assert torch.isfinite(tr.trace).all()
        try:
            from transformer_lens.model_bridge import TransformerBridge
        except ImportError:  # TransformerLens 2.16: no bridge to compare with
            continue
        # The same tokens on both hosts (their "host" BOS modes differ: the bridge prepends BOS).
        a = tl.gain_attribution(model, PROMPTS, token_scope="all", batch_size=2, prepend_bos=False)
        b = tl.gain_attribution(TransformerBridge.boot_transformers(str(path)), PROMPTS, token_scope="all",
                                batch_size=2, prepend_bos=False)
        for k in ("head", "mlp", "bias", "norm", "total"):
            torch.testing.assert_close(getattr(a, k), getattr(b, k), rtol=1e-4, atol=float(a.scale.max()) * 1e-5)


def _sae(hook, cfg, error_term):
    from thermo_lens.testing import random_sae

    is_z = hook.endswith("hook_z")
    d_in = cfg.n_heads * cfg.d_head if is_z else cfg.d_mlp if hook.endswith("mlp.hook_post") else cfg.d_model
    sae = random_sae(hook, d_in, 64, use_error_term=error_term, seed=len(hook))
    if is_z:
        sae.cfg.reshape_activations = "hook_z"
        sae.turn_on_forward_pass_hook_z_reshaping()
    return sae


SAE_HOOKS = ("blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post", "blocks.1.hook_attn_out",
             "blocks.1.hook_mlp_out", "blocks.1.attn.hook_z", "blocks.1.mlp.hook_post")


@pytest.mark.hosts
@pytest.mark.parametrize("error_term", [False, True])
def test_spliced_saes_are_components_and_the_attribution_closes(checkpoint_dir, error_term):
    """An SAE in the stream is a component: sae = <sae(x) - x, u> (u = x_out + x_in of its block;
    u W_O^T per head at hook_z), formed here from run_with_cache at the SAE's input and output; the
    heads and MLP are read at the SAE's input; with use_error_term the error term's share is
    sae_error; an SAE inside the MLP (mlp.hook_post) is part of the MLP term. The identity closes
    in every block."""
    _legacy()
    sae_lens = pytest.importorskip("sae_lens")
    from thermo_lens.measures.attribution import sae_sites
    from thermo_lens.testing import hooked_transformer

    model = hooked_transformer(checkpoint_dir("gpt2"), cls=sae_lens.HookedSAETransformer)
    view = ModelView(model)
    for hook in SAE_HOOKS:
        model.add_sae(_sae(hook, model.cfg, error_term), use_error_term=error_term)
        try:
            a = tl.gain_attribution(model, PROMPTS, token_scope="all", batch_size=2)
            assert float((a.closure / a.scale).max()) < 1e-5, hook
            sites, other = sae_sites(view)
            tb = tokenize(view, PROMPTS, prepend_bos="host")
            _, cache = model.run_with_cache(tb.tokens)
            if hook.endswith("mlp.hook_post"):
                assert not sites and "inside a component" in other[0]
                assert torch.equal(a.sae, torch.zeros_like(a.sae))
                continue
            (site,) = sites
            layer = site.layer
            assert layer == (0 if hook.endswith("hook_resid_pre") else 1), hook

            def read(name, _cache=cache, _hook=hook):
                return _cache[name + ".hook_sae_output" if name == _hook else name]

            sae = torch.zeros(len(PROMPTS), dtype=torch.float64)
            W_O = view.W_O(torch.float64)[1]
            for p in range(len(PROMPTS)):
                n = int(tb.lengths[p])
                x_in = read(view.resid_hook_names[layer])[p, :n].double()
                x_out = read(view.resid_hook_names[layer + 1])[p, :n].double()
                delta = (cache[hook + ".hook_sae_output"][p, :n].reshape(n, -1)
                         - cache[hook + ".hook_sae_input"][p, :n].reshape(n, -1)).double()
                if hook.endswith("hook_z"):
                    delta = delta @ W_O.reshape(-1, view.d_model)
                sae[p] = (delta * (x_out + x_in)).sum(-1).mean()
            tol = float(a.scale.max()) * 1e-5
            torch.testing.assert_close(a.sae[:, layer], sae, rtol=0, atol=tol)
            if error_term:
                assert float(a.sae.abs().max()) < tol and float(a.sae_error.abs().max()) > 10 * tol, hook
            else:
                assert float(a.sae[:, layer].abs().min()) > 10 * tol and torch.equal(a.sae_error, torch.zeros_like(a.sae))
            assert hook in repr(a) and "sae" in repr(a)
        finally:
            model.reset_saes()


@pytest.mark.hosts
def test_saes_on_the_sae_transformer_bridge_are_components(checkpoint_dir):
    """SAETransformerBridge keys its SAEs by alias (blocks.1.hook_mlp_out) and hooks them at the
    aliased point (blocks.1.mlp.hook_out): the SAE terms are read there, and the identity closes."""
    _legacy()
    pytest.importorskip("sae_lens")
    try:
        from sae_lens.analysis.sae_transformer_bridge import SAETransformerBridge
    except ImportError:
        pytest.skip("this sae-lens / TransformerLens has no SAETransformerBridge")
    from thermo_lens.testing import random_sae

    model = SAETransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")))
    for hook in ("blocks.1.hook_mlp_out", "blocks.0.hook_resid_post"):
        model.add_sae(random_sae(hook, model.cfg.d_model, 64, seed=len(hook)))
    a = tl.gain_attribution(model, PROMPTS, batch_size=2)
    assert float((a.closure / a.scale).max()) < 1e-5
    assert float(a.sae[:, :2].abs().min()) > 1e-3 and torch.equal(a.sae[:, 2], torch.zeros_like(a.sae[:, 2]))


@pytest.mark.hosts
def test_hooked_transformer_sandwich_blocks_split_exactly(checkpoint_dir):
    """A HookedTransformer with norms before and after each sublayer (Gemma-2's layout,
    use_normalization_before_and_after, soft-capped GQA), built from its config: the heads add
    r_a g_a z_h W_O^h, so their terms sum to <hook_attn_out, s> (the post-norm attention output the
    block adds, from run_with_cache), and the block closes."""
    _legacy()
    from transformers import AutoTokenizer
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, n_ctx=64, d_head=8, n_heads=4, n_key_value_heads=2, d_mlp=64, d_vocab=300,
        act_fn="gelu_pytorch_tanh", normalization_type="RMS", use_normalization_before_and_after=True,
        positional_embedding_type="rotary", gated_mlp=True, attn_scores_soft_cap=1.0, seed=0)
    model = HookedTransformer(cfg, tokenizer=AutoTokenizer.from_pretrained(str(checkpoint_dir("gpt2"))))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".w"):
                p.add_(0.3 * torch.randn_like(p))  # non-trivial norm gains
    view = ModelView(model)
    assert view.layout.kind == "sandwich" and view.layout.mlp_hook == "ln2_post.hook_normalized"
    a = tl.gain_attribution(model, PROMPTS, token_scope="all", batch_size=2)
    assert float((a.closure / a.scale).max()) < 1e-5
    tb = tokenize(view, PROMPTS, prepend_bos="host")
    _, cache = model.run_with_cache(tb.tokens)
    for p in range(len(PROMPTS)):
        n = int(tb.lengths[p])
        for l in range(view.n_layers):
            s = (cache[f"blocks.{l}.hook_resid_post"][p, :n] + cache[f"blocks.{l}.hook_resid_pre"][p, :n]).double()
            attn = (cache[f"blocks.{l}.hook_attn_out"][p, :n].double() * s).sum(-1).mean()
            mlp = (cache[f"blocks.{l}.hook_mlp_out"][p, :n].double() * s).sum(-1).mean()
            tol = float(a.scale[p, l]) * 1e-5
            assert abs(float(a.head[p, l].sum()) - float(attn)) < tol and abs(float(a.mlp[p, l]) - float(mlp)) < tol


def test_a_pass_with_no_other_hooks_reads_no_splice_and_gives_the_same_terms(bridge):
    """Without hooks other than the reductions' the stream cannot change between a block's output and
    the next block's input: the pass keeps no copy of the output (no splice hook) and the terms are
    exactly those of a pass that reads the splice (a do-nothing user hook makes it read it)."""
    from thermo_lens.measures.attribution.terms import TERM_COLUMNS, attribution_terms
    from thermo_lens.core.passes import collect

    model = bridge("gpt2")
    seen = []

    def noop(x, hook):
        seen.append(hook.name)

    plain = collect(model, PROMPTS, [attribution_terms()])
    hooked = collect(model, PROMPTS, [attribution_terms()], fwd_hooks=[("blocks.0.hook_resid_post", noop)])
    assert seen and not plain.recorder.foreign_hooks and hooked.recorder.foreign_hooks
    assert not any(k[0] == "_attr_y_out" for _, k, _ in plain.recorder._reductions)
    assert any(k[0] == "_attr_y_out" for _, k, _ in hooked.recorder._reductions)
    for name in ("head",) + TERM_COLUMNS:
        assert torch.equal(plain.stack(f"attr_{name}"), hooked.stack(f"attr_{name}")), name
    assert not plain.stack("attr_splice").any() and not hooked.stack("attr_splice").any()
    # One metadata read per pass, a copy per result: editing one result's record leaves the others alone.
    first, second = plain.provenance(), plain.provenance()
    first.model["name"] = "edited"
    assert second.model["name"] != "edited" and plain.provenance().model == second.model


def test_terms_recorded_per_batch_by_the_last_registered_block(bridge):
    """The means are taken and recorded once per batch by the last block whose hooks are registered:
    a pass registering one block's hooks (as a sweep does) records that block's terms alone, equal
    to the whole pass's, batch by batch."""
    from thermo_lens.measures.attribution.terms import TERM_COLUMNS, attribution_terms
    from thermo_lens.core.passes import collect
    from thermo_lens.experiments.sweeps.engine import _one_layer

    model = bridge("gpt2")
    full = collect(model, PROMPTS, [attribution_terms()], batch_size=2)
    one = collect(model, PROMPTS, [_one_layer(attribution_terms(), 1)], batch_size=2)
    assert len(full.batch_plan) > 1
    assert {k for k in one.recorder._parts} == {(f"attr_{c}", 1) for c in ("head",) + TERM_COLUMNS}
    for name in ("head",) + TERM_COLUMNS:
        assert torch.equal(one.stack(f"attr_{name}")[0], full.stack(f"attr_{name}")[1]), name
    assert full.stack("attr_head").shape == (model.cfg.n_layers, len(PROMPTS), model.cfg.n_heads)


def test_block_plan_constants_move_to_the_activations_device_once():
    """The attribution's per-block constants go to the device of the block's activations once per
    pass (memoised), not in every batch: on a GPU the per-batch host-to-device copies of W_O were
    most of a warm profile's device time. ``meta`` stands in for a second device here."""
    from thermo_lens.measures.attribution.terms import _BlockPlan

    W, b = torch.randn(8, 4), torch.zeros(4)
    plan = _BlockPlan(layer=0, reads=[], W_O=W, b_O=b, b_out=b, norms={"ln": (torch.ones(4), None)}, sites=[])
    assert plan.on(torch.device("cpu")) is plan  # already there: no copy
    meta = plan.on(torch.device("meta"))
    assert meta is plan.on(torch.device("meta"))  # once per device
    assert meta.W_O.device.type == "meta" and meta.b_O.device.type == "meta"
    assert meta.norms["ln"][0].device.type == "meta" and meta.norms["ln"][1] is None
    assert plan.W_O is W and meta.layer == 0 and meta.sites is plan.sites
