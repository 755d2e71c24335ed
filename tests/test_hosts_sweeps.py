"""Sweeps on every host of this TransformerLens leg (issue 22): HookedTransformer (2.x / 3.x) and
TransformerBridge (3.x / 4.x), against ``transformer_lens.patching`` and single-condition runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_hosts import host_model  # noqa: F401  (the session fixture)
from test_sweeps import TOL, _gain_cell_ref, _logit_diff, _pairs
from thermo_lens.sweeps import ablation_sweep, patch_sweep

pytestmark = pytest.mark.hosts


@pytest.mark.parametrize("host", ["HookedTransformer", "TransformerBridge"])
@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa"])
def test_sweep_cells_on_each_host(host_model, host, arch):  # noqa: F811
    m = host_model(host, arch)
    clean, corr = _pairs(n=3, length=5, seed=5)
    patching = pytest.importorskip("transformer_lens.patching")
    lg = patch_sweep(m, clean, corr, "attn.hook_z", measure=_logit_diff)
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
