"""Head write norms mean_t ||z_h W_O^h||: against a dense computation from run_with_cache, and
carried by the registry into profiles, rows, panels and the report with no code of their own."""

import numpy as np
import pytest
import torch

import thermo_lens as tl
from thermo_lens import registry
from thermo_lens.model import ModelView
from thermo_lens.tokens import tokenize

PROMPTS = ["The capital of France is Paris", "Water boils at one hundred degrees", "the early bird catches the worm"]


def _dense(model, prompts, scope, hooks=()):
    """mean over the scope's tokens of ||z_h W_O^h||, float64, from run_with_cache (one prompt at a time)."""
    view = ModelView(model)
    W_O = view.W_O(torch.float64)  # [layer, head, d_head, d_model]
    out = []
    for p in prompts:
        tb = tokenize(view, [p], prepend_bos="host")
        with model.hooks(fwd_hooks=list(hooks)):
            _, cache = model.run_with_cache(tb.tokens)
        n = int(tb.lengths[0])
        keep = {"all_but_first": slice(1, n), "all": slice(0, n), "last": slice(n - 1, n)}[scope]
        per_layer = []
        for l in range(view.n_layers):
            z = cache[f"blocks.{l}.attn.hook_z"][0].double().reshape(-1, view.n_heads, view.d_head)[keep]
            written = torch.einsum("thd,hdm->thm", z, W_O[l])  # [token, head, d_model]: formed on purpose
            per_layer.append(written.norm(dim=-1).mean(0))
        out.append(torch.stack(per_layer))
    return torch.stack(out)


@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa"])
@pytest.mark.parametrize("scope", ["all_but_first", "last"])
def test_write_norms_equal_the_dense_head_outputs(bridge, arch, scope):
    model = bridge(arch)
    got = tl.run(model, PROMPTS, {"write_norm": {"token_scope": scope}}, batch_size=2).write_norm
    torch.testing.assert_close(got.write_norm, _dense(model, PROMPTS, scope), rtol=1e-5, atol=1e-7)
    assert got.token_scope == scope and got.write_norm.shape == (3, *ModelView(model).W_O().shape[:2])


def test_an_ablated_head_writes_nothing_and_the_hook_is_recorded(bridge):
    model = bridge("gpt2")

    def zero_head_2(z, hook):
        z[:, :, 2] = 0.0
        return z

    hooks = [("blocks.1.attn.hook_z", zero_head_2)]
    got = tl.run(model, PROMPTS, ["write_norm"], fwd_hooks=hooks).write_norm
    assert torch.all(got.write_norm[:, 1, 2] == 0) and torch.all(got.write_norm[:, 1, :2] > 0)
    torch.testing.assert_close(got.write_norm, _dense(model, PROMPTS, "all_but_first", hooks), rtol=1e-5, atol=1e-7)
    assert "zero_head_2" in repr(got) and "zero_head_2" in got.to_frame()["hooks"].iloc[0]


@pytest.mark.slow
def test_the_registry_carries_it_everywhere(bridge):
    # No code outside thermo_lens/write_norm.py knows about write norms: the profile runs it, the row
    # and the panel show it, the report draws it, the definitions page lists it.
    from thermo_lens.report import render_report

    model = bridge("gpt2")
    assert "write_norm" in {m.name for m in registry.measurements(in_profile=True)}
    prof = tl.profile(model, PROMPTS, progress=False)
    torch.testing.assert_close(prof.write_norm.write_norm, _dense(model, PROMPTS, "all_but_first"), rtol=1e-5, atol=1e-7)
    assert prof.to_row()["mean_write_norm"] == pytest.approx(float(prof.write_norm.write_norm.mean()), rel=1e-9)
    panel = tl.views.attention_panel(model, PROMPTS[0], 1, gain_prompts=PROMPTS, ablation=False, include_js=False)
    np.testing.assert_allclose(panel.metrics["write_norm"], prof.write_norm.mean_head[1].numpy(), rtol=1e-6)
    page, ids = render_report(prof, panel=False)
    assert 'id="write_norm"' in page and any(i.startswith("fig-write_norm-write_norm") for i in ids)
    assert "| `write_norm` |" in tl.definitions.text()
    back = type(prof).from_json(prof.to_json())
    assert torch.equal(back.write_norm.write_norm, prof.write_norm.write_norm)


def test_frobenius_has_no_per_token_form():
    from thermo_lens.errors import ThermoLensInputError

    with pytest.raises(ThermoLensInputError, match="token_scope must be one of"):
        registry.measurement("write_norm").resolve({"token_scope": "frobenius"})
