"""One prompt normalisation for every entry point: strings, set names, dicts, token ids."""

from __future__ import annotations

import pytest
import torch

import thermo_lens as tl
from thermo_lens import ModelView
from thermo_lens.core.tokens import tokenize

ENTRY = {
    "residual_gain": lambda m, p, **k: tl.residual_gain(m, p, **k).block_gain,
    "sheaf_traces": lambda m, p, **k: tl.sheaf_traces(m, p, **k).trace,
    "anisotropy_profile": lambda m, p, **k: tl.anisotropy_profile(m, p, **k).values,
    "gain_attribution": lambda m, p, **k: tl.gain_attribution(m, p, **k).head,
    "profile": lambda m, p, **k: tl.profile(m, p, **k).gain.block_gain,
}
PROMPTS = ["The capital of France is Paris", "Water freezes", "the early bird catches the worm"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ENTRY)
def test_every_entry_point_accepts_the_same_inputs(bridge, name):
    model = bridge("gpt2")
    f = ENTRY[name]
    ref = f(model, PROMPTS)
    # {category: [...]} measures the prompts (not the category names)
    torch.testing.assert_close(f(model, {"Factual": PROMPTS[:2], "Other": PROMPTS[2:]}), ref, equal_nan=True)
    # a single string is one prompt
    torch.testing.assert_close(f(model, PROMPTS[0]), ref[:1], equal_nan=True)
    # token ids, right padded with lengths, and an HF BatchEncoding, left padded with a mask
    tb = tokenize(ModelView(model), PROMPTS, prepend_bos=True)
    torch.testing.assert_close(f(model, {"input_ids": tb.tokens, "lengths": tb.lengths}), ref, equal_nan=True)
    left = torch.zeros_like(tb.tokens)
    mask = torch.zeros_like(tb.tokens)
    for b, n in enumerate(tb.lengths.tolist()):
        left[b, -n:] = tb.tokens[b, :n]
        mask[b, -n:] = 1
    torch.testing.assert_close(f(model, {"input_ids": left, "attention_mask": mask}), ref, equal_nan=True)


def test_set_names_and_token_provenance(bridge):
    model = bridge("gpt2")
    g = tl.residual_gain(model, "paper25", truncate=True)
    assert g.n_prompts == 25 and g.provenance.prompt_set == tl.prompts.get("paper25").name
    assert g.provenance.categories[0] == "Factual"
    tb = tokenize(ModelView(model), PROMPTS[:1], prepend_bos=True)
    gt = tl.residual_gain(model, tb.tokens)
    assert gt.prepend_bos == "tokens_as_given" and gt.provenance.prompt_set == "tokens"
    assert gt.prompts[0].endswith("The capital of France is Paris")


def test_bad_inputs_are_clear(bridge):
    model = bridge("gpt2")
    with pytest.raises(tl.ThermoLensInputError, match="holes"):
        tl.residual_gain(model, {"input_ids": torch.ones(1, 4, dtype=torch.long),
                                 "attention_mask": torch.tensor([[1, 0, 1, 1]])})
    with pytest.raises(tl.ThermoLensInputError, match="integer tensor"):
        tl.residual_gain(model, torch.ones(2, 3))
    with pytest.raises(tl.ThermoLensInputError, match="unknown option"):
        tl.residual_gain(model, PROMPTS, batchsize=2)
    with pytest.raises(tl.ThermoLensInputError, match="batch_size"):
        tl.sheaf_traces(model, PROMPTS, batch_size=0)
    with pytest.raises(tl.ThermoLensInputError, match="prepend_bos"):
        tl.anisotropy_profile(model, PROMPTS, prepend_bos="yes")
    with pytest.raises(tl.ThermoLensInputError, match="wrap it in a list"):
        tl.residual_gain(model, PROMPTS, fwd_hooks=("blocks.0.hook_resid_pre", lambda x, hook: None))


def test_run_settings_object_and_keywords(bridge):
    model = bridge("gpt2")
    s = tl.RunSettings(prepend_bos=False, batch_size=2)
    a = tl.residual_gain(model, PROMPTS, settings=s, token_scope="all")
    b = tl.residual_gain(model, PROMPTS, prepend_bos=False, batch_size=2, token_scope="all")
    torch.testing.assert_close(a.block_gain, b.block_gain)
    assert a.prepend_bos is False
    assert tl.RunSettings.resolve(s, batch_size=4).batch_size == 4 and s.batch_size == 2
    assert tl.RunSettings().by_length is None and tl.RunSettings(fwd_hooks=[("x", print)]).by_length is None


def test_layer_and_head_subsets_with_negative_indices(bridge):
    model = bridge("llama_gqa")
    full = tl.spectral_signature(model)
    sub = tl.spectral_signature(model, layers=[-1], heads=[0, -1])
    assert sub.W_V_norm.shape == full.W_V_norm.shape
    torch.testing.assert_close(sub.W_V_norm[2, [0, 3]], full.W_V_norm[2, [0, 3]])
    assert torch.isnan(sub.W_V_norm[:2]).all() and torch.isnan(sub.W_V_norm[2, [1, 2]]).all()
    assert torch.isnan(sub.layer_W_V_norm[:2]).all()
    torch.testing.assert_close(sub.layer_W_V_norm[2], full.layer_W_V_norm[2])
    with pytest.raises(tl.ThermoLensInputError, match="out of range"):
        tl.spectral_signature(model, layers=[3])
    fig = tl.views.spectral_heatmaps(full, layers=-1, heads=[-1])
    assert all(list(t.y) == ["2"] and list(t.x) == ["3"] for t in fig.data)
    tr = tl.sheaf_traces(model, PROMPTS)
    f2 = tl.views.sheaf_trace_heatmap(tr, layers=[-1, -2])
    assert list(f2.data[0].y) == ["2", "1"]
    with pytest.raises(tl.views.ThermoLensViewError, match="out of range"):
        tl.views.sheaf_trace_heatmap(tr, heads=[4])


def test_layer_dynamics_subset_and_negative_heads_in_patches(bridge):
    model = bridge("gpt2")
    g = tl.residual_gain(model, PROMPTS)
    fig = tl.views.layer_dynamics([g, g], names=["a", "b"], layers=[-1, 0])
    means = [t for t in fig.data if (t.meta or {}).get("role") == "mean"]
    assert [list(t.x) for t in means] == [[2, 0], [2, 0]]
    torch.testing.assert_close(torch.as_tensor(means[0].y), g.block_gain.double().mean(0)[[2, 0]], rtol=1e-6, atol=0)
    with pytest.raises(tl.views.ThermoLensViewError, match="out of range"):
        tl.views.layer_dynamics(g, layers=[3])
    p = tl.patch_from(model, PROMPTS[:1], "blocks.0.attn.hook_z", heads=[-1], positions=[-1])
    assert p.heads == (3,)
