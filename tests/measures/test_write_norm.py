"""Head write norms mean_t ||z_h W_O^h||: against a dense computation from run_with_cache, and
carried by the registry into profiles, rows, panels and the report with no code of their own."""

import numpy as np
import pytest
import torch

import thermo_lens as tl
from thermo_lens.core import registry
from thermo_lens.core.model import ModelView
from thermo_lens.core.tokens import tokenize

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
    # No code outside thermo_lens/measures/write_norm.py knows about write norms: the profile runs it, the row
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
    from thermo_lens.core.errors import ThermoLensInputError

    with pytest.raises(ThermoLensInputError, match="token_scope must be one of"):
        registry.measurement("write_norm").resolve({"token_scope": "frobenius"})


def _zero_head(head):
    def hook(z, hook=None):
        z[:, :, head] = 0.0
        return z
    return hook


def test_write_norms_pair_b_minus_a_against_the_dense_difference(bridge):
    # Paired through the registry alone: its metric's shape "prompt layer head" gives the quantity.
    model = bridge("gpt2")
    hooks = [("blocks.0.attn.hook_z", _zero_head(2))]
    a = tl.run(model, PROMPTS, ["write_norm"]).write_norm
    b = tl.run(model, PROMPTS, ["write_norm"], fwd_hooks=hooks).write_norm
    d = b - a
    assert d.quantity == "write_norm" and d.dims == ("layer", "head") and d.result_type == "HeadWriteNorms"
    dense = _dense(model, PROMPTS, "all_but_first", hooks) - _dense(model, PROMPTS, "all_but_first")
    torch.testing.assert_close(d.difference, dense, rtol=1e-4, atol=1e-6)
    assert torch.all(d.difference[:, 0, 2] == -a.write_norm[:, 0, 2].double())  # the zeroed head: all of it
    assert torch.all(d.difference[:, 0, [0, 1, 3]] == 0)  # the other heads of block 0 read the same z
    assert float(d.difference[:, 1:].abs().max()) > 1e-4  # later blocks see the change
    with pytest.raises(Exception, match="not paired"):
        _ = tl.run(model, PROMPTS[:2], ["write_norm"]).write_norm - a


def test_write_norms_sweep_as_a_readout(bridge):
    # ablation_sweep(measure="write_norm:<layer>.<head>"): each cell against a dense run under its hook.
    model = bridge("gpt2")
    view = ModelView(model)
    clean = _dense(model, PROMPTS, "all_but_first")
    s = tl.sweeps.ablation_sweep(model, PROMPTS, "attn.hook_z", method="zero", measure="write_norm:1.-1",
                                 layers=[0, 1, 2], batch_size=4)
    H = view.n_heads
    assert s.measure == f"write_norm:1.{H - 1}" and "z_h(t) W_O^h" in s.measure_definition
    assert s.token_scope == "all_but_first" and s.passes.startswith("each cell's pass starts at its layer"), s.passes
    np.testing.assert_allclose(s.baseline.numpy(), clean[:, 1, H - 1].numpy(), rtol=1e-5)
    for h in range(H):
        want = _dense(model, PROMPTS, "all_but_first", [("blocks.0.attn.hook_z", _zero_head(h))])[:, 1, H - 1]
        np.testing.assert_allclose(s.per_prompt[:, 0, h].numpy(), (want - clean[:, 1, H - 1]).numpy(),
                                   rtol=1e-4, atol=1e-6)
    # block 1's own head H-1 zeroed writes nothing; its other heads leave it; block 2 comes after it
    np.testing.assert_allclose(s.per_prompt[:, 1, H - 1].numpy(), -clean[:, 1, H - 1].numpy(), rtol=1e-5)
    assert float(s.per_prompt[:, 1, :H - 1].abs().max()) < 1e-6 and torch.all(s.per_prompt[:, 2] == 0)
    with pytest.raises(Exception, match="token_scope must be one of"):
        tl.sweeps.ablation_sweep(model, PROMPTS, "attn.hook_z", measure="write_norm:1.0", token_scope="frobenius")
    assert "write_norm:<layer>.<head>" in tl.sweeps.measure_definitions()
    assert "| `write_norm:<layer>.<head>` | `write_norm` |" in tl.definitions.text()  # the shipped page
