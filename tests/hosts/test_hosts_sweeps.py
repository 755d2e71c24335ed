"""Sweeps on every host of this TransformerLens leg (issue 22): HookedTransformer (2.x / 3.x) and
TransformerBridge (3.x / 4.x), against ``transformer_lens.patching`` and single-condition runs."""

from __future__ import annotations

from importlib.metadata import version

import numpy as np
import pytest
import torch

from test_hosts import host_model  # noqa: F401  (the session fixture)
from test_sweeps import TOL, _gain_cell_ref, _logit_diff, _pairs
from thermo_lens.experiments.sweeps import LogitDifference, ablation_sweep, patch_sweep

pytestmark = pytest.mark.hosts


@pytest.mark.slow
@pytest.mark.parametrize("host", ["HookedTransformer", "TransformerBridge"])
@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa"])
def test_sweep_cells_on_each_host(host_model, host, arch):  # noqa: F811
    m = host_model(host, arch)
    clean, corr = _pairs(n=3, length=5, seed=5)
    patching = pytest.importorskip("transformer_lens.patching")
    lg = patch_sweep(m, clean, corr, "attn.hook_z", measure=_logit_diff)
    ld = patch_sweep(m, clean, corr, "attn.hook_z", measure=LogitDifference(5, 7))
    np.testing.assert_allclose(ld.per_prompt.numpy(), lg.per_prompt.numpy(), atol=TOL)
    _, cache = m.run_with_cache(clean)
    with torch.inference_mode():
        base = float(_logit_diff(m(corr)).mean())
        grid = patching.get_act_patch_attn_head_out_all_pos(m, corr, cache, lambda x: _logit_diff(x).mean())
    np.testing.assert_allclose(lg.effect.numpy(), grid.double().numpy() - base, atol=TOL)
    g = patch_sweep(m, clean, corr, "attn.hook_z", measure="last_block_gain", layers=[1])
    for head in (0, m.cfg.n_heads - 1):
        ref = _gain_cell_ref(m, clean, corr, 1, head, "last_block_gain")
        np.testing.assert_allclose(g.per_prompt[:, 0, head].numpy(), ref, atol=TOL)
    z = ablation_sweep(m, corr, "hook_pattern", method="zero", measure=_logit_diff, layers=[0])
    assert tuple(z.per_prompt.shape) == (3, 1, m.cfg.n_heads) and bool(torch.isfinite(z.per_prompt).all())


@pytest.mark.slow
@pytest.mark.parametrize("host", ["HookedTransformer", "TransformerBridge"])
@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa"])
def test_start_at_layer_cells_equal_full_passes(host_model, host, arch):  # noqa: F811
    """Passes that start at the cell's layer give the full passes' cells (prompts of different
    lengths: padding, masks and rotary positions of a pass that starts at a block)."""
    m = host_model(host, arch)
    clean, corr = _pairs(n=3, length=6, seed=11)
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 5:] = 0
    corr_p, clean_p = {"input_ids": corr, "attention_mask": mask}, {"input_ids": clean, "attention_mask": mask}
    # (a function of the logits is refused on prompts of different lengths: it cannot see the padding)
    for measure in ("total_amplification", "attribution_head:1", LogitDifference(5, 7)):
        kw = dict(measure=measure, positions=[-1, 1], batch_size=7)
        fast = patch_sweep(m, clean_p, corr_p, "attn.hook_z", **kw)
        full = patch_sweep(m, clean_p, corr_p, "attn.hook_z", start_at_layer=False, **kw)
        np.testing.assert_allclose(fast.per_prompt.numpy(), full.per_prompt.numpy(), atol=TOL)
        np.testing.assert_allclose(fast.baseline.numpy(), full.baseline.numpy(), atol=TOL)
        assert "every pass from the embedding (start_at_layer=False)" in full.passes
        if isinstance(measure, LogitDifference):  # the same cells as the full logits of each prompt alone
            for p in range(3):
                n = int(mask[p].sum())
                one = patch_sweep(m, clean[p:p + 1, :n], corr[p:p + 1, :n], "attn.hook_z", measure=_logit_diff,
                                  positions=[-1, 1], start_at_layer=False)
                np.testing.assert_allclose(fast.per_prompt[p].numpy(), one.per_prompt[0].numpy(), atol=TOL)
        # HookedTransformer (2.x / 3.x) and TransformerLens 4's bridge start at a layer; 3.x's bridge refuses
        if host == "HookedTransformer" or int(version("transformer_lens").split(".")[0]) >= 4:
            assert "starts at its layer" in fast.passes, fast.passes
        else:
            assert "NotImplementedError" in fast.passes, fast.passes
    # the swept hook is the residual the pass starts from; x_2 of a cell at layer 2 is block 1's output
    r = patch_sweep(m, clean_p, corr_p, "hook_resid_pre", over="pos", positions=[0, -1], measure="block_gain:1")
    rf = patch_sweep(m, clean_p, corr_p, "hook_resid_pre", over="pos", positions=[0, -1], measure="block_gain:1",
                     start_at_layer=False)
    np.testing.assert_allclose(r.per_prompt.numpy(), rf.per_prompt.numpy(), atol=TOL)
    assert bool((r.per_prompt[:, 2].abs() > 1e-4).any())  # a patch at x_2 changes block 1's gain
    z = ablation_sweep(m, corr_p, "attn.hook_z", over=("head", "pos"), positions=[0, -1], measure="block_gain:1")
    zf = ablation_sweep(m, corr_p, "attn.hook_z", over=("head", "pos"), positions=[0, -1], measure="block_gain:1",
                        start_at_layer=False)
    np.testing.assert_allclose(z.per_prompt.numpy(), zf.per_prompt.numpy(), atol=TOL)


@pytest.mark.parametrize("host", ["HookedTransformer", "HookedSAETransformer", "TransformerBridge"])
def test_kv_hooks_ragged_scores_and_start_at_layer_on_each_host(host_model, host):  # noqa: F811
    """Key/value hooks swept over their KV heads, zeroed attention scores of padded prompts equal to
    each prompt alone, and (no SAE attached) passes that start at the cell's layer on every host
    whose forward takes start_at_layer, HookedSAETransformer's through its **kwargs included."""
    m = host_model(host, "llama_gqa")
    n_kv = int(getattr(m.cfg, "n_key_value_heads", None) or m.cfg.n_heads)
    corr = _pairs(n=3, length=6, seed=14)[1]
    z = ablation_sweep(m, corr, "attn.hook_v", method="zero", layers=[1], measure=LogitDifference(5, 7))
    assert tuple(z.per_prompt.shape) == (3, 1, n_kv) and z.head_kind == "kv_head"
    with torch.inference_mode():
        base = m(corr)[:, -1]
    for h in range(n_kv):
        def zero(x, hook=None, h=h):
            x[:, :, h] = 0.0
            return x
        with torch.inference_mode():
            lg = m.run_with_hooks(corr, fwd_hooks=[("blocks.1.attn.hook_v", zero)])[:, -1]
        want = (lg[:, 5] - lg[:, 7] - (base[:, 5] - base[:, 7])).double()
        np.testing.assert_allclose(z.per_prompt[:, 0, h].numpy(), want.numpy(), atol=TOL)
    if host == "HookedTransformer" or int(version("transformer_lens").split(".")[0]) >= 4:
        assert "starts at its layer" in z.passes, z.passes
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[0, 3:] = 0
    s = ablation_sweep(m, {"input_ids": corr, "attention_mask": mask}, "attn.hook_attn_scores", method="zero",
                       layers=[0], heads=[1], measure=LogitDifference(5, 7))
    for p in range(3):
        n = int(mask[p].sum())

        def rows(x, hook=None):
            x[:, 1] = 0.0
            return x
        with torch.inference_mode():
            one = m(corr[p:p + 1, :n])[0, -1]
            ab = m.run_with_hooks(corr[p:p + 1, :n], fwd_hooks=[("blocks.0.attn.hook_attn_scores", rows)])[0, -1]
        want = float(ab[5] - ab[7] - (one[5] - one[7]))
        assert s.per_prompt[p, 0, 0].item() == pytest.approx(want, abs=TOL), p
