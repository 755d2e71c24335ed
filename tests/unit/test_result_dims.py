"""Named dimensions on every result: sizes, n_<dim>s, labels and the generic frame, from the
shapes the registry declares, against the tensors' own shapes and a frame built by hand."""

from __future__ import annotations

import itertools

import numpy as np
import torch
import pytest

import thermo_lens as tl
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.result import label

PROMPTS = ["the cat sat on the mat", "Water freezes at zero degrees"]


def test_sizes_counts_and_labels_follow_the_declared_dimensions(bridge):
    model = bridge("llama_gqa")
    m = tl.run(model, PROMPTS, measures=["write_norm", "sheaf", "spectral", "attribution"])
    wn, tr, sp, at = m["write_norm"], m["sheaf"], m["spectral"], m["attribution"]
    P, L, H, KV = len(PROMPTS), model.cfg.n_layers, model.cfg.n_heads, model.cfg.n_key_value_heads
    assert KV < H  # grouped-query: the kv_head dimension is its own
    assert wn.sizes == {"prompt": P, "layer": L, "head": H} and tuple(wn.write_norm.shape) == (P, L, H)
    for r in (wn, tr, at):
        assert (r.n_prompts, r.n_layers, r.n_heads) == (P, L, H)
    assert (sp.n_layers, sp.n_heads, sp.n_kv_heads) == (L, H, KV) and at.n_experts == 1
    assert wn.labels()[: H + 1] == [f"L0H{h}" for h in range(H)] + ["L1H0"] and len(wn.labels()) == L * H
    assert sp.labels("layer", "kv_head")[:2] == ["L0KV0", "L0KV1"] and wn.labels("layer") == [f"L{l}" for l in range(L)]
    assert label(layer=3, head=1) == "L3H1"
    with pytest.raises(AttributeError, match="no 'expert' dimension"):
        _ = wn.n_experts
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = wn.nothing
    with pytest.raises(ThermoLensInputError, match="no dimension"):
        wn.labels("expert")
    # a paired difference and a sweep declare their own dimensions
    d = tl.residual_gain(model, PROMPTS, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: 0.5 * z)]) \
        - tl.residual_gain(model, PROMPTS)
    assert d.sizes == {"prompt": P, "layer": L} and d.n_layers == L and d.labels() == [f"L{l}" for l in range(L)]
    s = tl.ablation_sweep(model, PROMPTS, "attn.hook_k", over="head", layers=[0, 1], measure="last_block_gain")
    assert s.dims == ("layer", "kv_head") and (s.n_prompts, s.n_layers, s.n_kv_heads) == (P, 2, KV)


def test_the_generic_frame_is_the_frame_built_by_hand(bridge):
    model = bridge("gpt2")
    m = tl.run(model, PROMPTS, measures=["write_norm", "sheaf"])
    wn, tr = m["write_norm"], m["sheaf"]
    df = wn.to_frame()
    P, L, H = wn.write_norm.shape
    cells = list(itertools.product(range(P), range(L), range(H)))
    assert list(df.columns[:5]) == ["prompt", "layer", "head", "write_norm", "token_scope"]
    np.testing.assert_array_equal(df[["prompt", "layer", "head"]].to_numpy(), np.array(cells))
    np.testing.assert_array_equal(df["write_norm"].to_numpy(), [wn.write_norm[c].item() for c in cells])
    assert set(df["token_scope"]) == {wn.token_scope} and set(df["model"]) == {wn.model["name"]}
    assert set(df["hooks"]) == {wn.provenance.hooks_text}
    # the sheaf traces' frame metrics have two shapes ([prompt, layer, head] and [layer, head]): no generic frame
    with pytest.raises(ThermoLensInputError, match="single-shape"):
        tr.tidy_frame()


def test_select_is_direct_indexing_of_the_metrics_by_named_dimension(bridge):
    from thermo_lens.core.result import Result, Selection

    model = bridge("gpt2")
    prompts = PROMPTS + ["one two three four"]
    m = tl.run(model, prompts, measures=["gain", "attribution", "write_norm", "sheaf"])
    g, at, wn, tr = m["gain"], m["attribution"], m["write_norm"], m["sheaf"]
    P, L, H = at.head.shape
    # attribution at one head: head_term per prompt, the head's own values
    s = at.select(layer=1, head=-1)
    assert isinstance(s, Selection) and s.dims == {"head_term": ("prompt",)} and s.index == {"layer": 1, "head": H - 1}
    assert torch.equal(s.head_term, at.head[:, 1, H - 1]) and s.sizes == {"prompt": P}
    df = s.to_frame()
    assert list(df.columns[:3]) == ["layer", "head", "prompt"] and set(df["layer"]) == {1} and set(df["head"]) == {H - 1}
    np.testing.assert_array_equal(df["head_term"].to_numpy(), at.head[:, 1, H - 1].numpy())
    assert set(df["token_scope"]) == {at.token_scope} and set(df["model"]) == {at.model["name"]}
    # a layer of the attribution: the per-layer terms in their own frame, the heads in the main one
    s = at.select(layer=0)
    assert torch.equal(s.head_term, at.head[:, 0]) and torch.equal(s.mlp_term, at.mlp[:, 0])
    np.testing.assert_array_equal(s.to_frame("layer_frame")["mlp_term"].to_numpy(), at.mlp[:, 0].numpy())
    # the gain over a slice of layers: block_gain only (the [prompt] summaries have no layer)
    s = g.select(layer=slice(0, 2))
    assert list(s.values) == ["block_gain"] and torch.equal(s.block_gain, g.block_gain[:, 0:2])
    assert s.coords["layer"] == (0, 1) and s.labels() == ["L0", "L1"] and s.n_layers == 2
    assert isinstance(g.select([0, 2]), type(g))  # prompts only: the GainResult with its summaries, as before
    assert torch.equal(g.select(prompt=[2, 0]).block_gain, g.block_gain[[2, 0]])
    # head-shaped results: heads in a given order keep their original indices
    s = wn.select(head=[2, 0], prompt=1)
    assert torch.equal(s.write_norm, wn.write_norm[1][:, [2, 0]]) and s.labels() == [
        f"L{l}H{h}" for l in range(L) for h in (2, 0)]
    df = s.to_frame()
    assert df[["layer", "head"]].values.tolist() == [[l, h] for l in range(L) for h in (2, 0)] and set(df["prompt"]) == {1}
    np.testing.assert_array_equal(df["write_norm"].to_numpy(), wn.write_norm[1][:, [2, 0]].numpy().ravel())
    s = tr.select(layer=[1], head=0)
    assert torch.equal(s.trace, tr.trace[:, [1], 0]) and torch.equal(s.W_V_frob_sq, tr.W_V_frob_sq[[1], 0])
    df = s.to_frame()  # the [layer head] metric repeats along the prompts
    np.testing.assert_array_equal(df["W_V_frob_sq"].to_numpy(), np.repeat(tr.W_V_frob_sq[1, 0].item(), len(prompts)))
    np.testing.assert_array_equal(df["trace"].to_numpy(), tr.trace[:, 1, 0].numpy())
    # it is a stored result like any other
    back = Result.from_json(s.to_json())
    assert isinstance(back, Selection) and torch.equal(back.trace, s.trace) and back.index == s.index
    # clear errors: the dimensions and their ranges
    with pytest.raises(ThermoLensInputError, match=rf"no dimension 'heads' .*prompt \(0..{P - 1}\), layer \(0..{L - 1}\), head \(0..{H - 1}\)"):
        at.select(heads=1)
    with pytest.raises(ThermoLensInputError, match=rf"layer {L} is out of range: GainAttribution has layer 0..{L - 1}"):
        at.select(layer=L)
    with pytest.raises(ThermoLensInputError, match="is not an index"):
        wn.select(head="0")
    with pytest.raises(ThermoLensInputError, match="picks no head"):
        wn.select(head=slice(5, 5))


def test_a_selection_shows_its_place_values_and_definitions():
    from thermo_lens.core.result import Selection

    sel = Selection(source="GainResult", index={"prompt": 0, "layer": (1, 3)},
                    values={"block_gain": torch.tensor([1.5, 0.25])}, dims={"block_gain": ("layer",)},
                    frames={"block_gain": "to_frame"}, coords={"layer": (1, 3)},
                    columns={"token_scope": "all_but_first", "prepend_bos": "True", "weight_processing": ""})
    text = repr(sel)
    assert text.splitlines()[0] == "Selection of GainResult at prompt=0, layer=[1, 3]"
    assert "  block_gain [layer]: [1.5 , 0.25]" in text
    assert text.splitlines()[-1] == "  definitions: token_scope=all_but_first, prepend_bos=True"
