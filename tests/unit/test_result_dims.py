"""Named dimensions on every result: sizes, n_<dim>s, labels and the generic frame, from the
shapes the registry declares, against the tensors' own shapes and a frame built by hand."""

from __future__ import annotations

import itertools

import numpy as np
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
