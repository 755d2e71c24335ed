"""A measurement defined outside the package, through the public registration alone, works
everywhere a built-in one does: tl.run, tl.profile(measures=...), ``b - a``, a sweep readout, the
sweep's definitions and JSON. Its numbers are checked against run_with_cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pytest
import torch
from torch import Tensor

import thermo_lens as tl
from thermo_lens.core import registry
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.model import ModelView
from thermo_lens.stats.paired import PairedMixin
from thermo_lens.core.provenance import Provenance, ProvenanceFields
from thermo_lens.core.result import Result
from thermo_lens.core.tokens import scope_mask, tokenize

PROMPTS = ["The capital of France is Paris", "Water boils at one hundred degrees", "the early bird catches the worm"]


@dataclass(frozen=True, repr=False, eq=False)
class MeanStateNorms(PairedMixin, ProvenanceFields, Result):
    """mean over the scope's real tokens of ||x_l[t]||, per prompt and residual state x_l (l < L)."""

    norm: Tensor  # [prompt, layer] float64
    token_scope: str
    provenance: Provenance


@dataclass(frozen=True)
class MeanStateNormOptions(registry.Options):
    token_scope: Literal["all", "last"] = "all"  # checked by its annotation


def mean_state_norms(token_scope: str):
    def reduction(view, rec):
        for l in range(view.n_layers):
            def fn(x, batch):
                mask = scope_mask(batch.lengths, x.shape[1], token_scope, device=x.device)
                norms = x.double().norm(dim=-1) * mask
                return norms.sum(1) / mask.sum(1)  # [batch]
            rec.add(f"blocks.{l}.hook_resid_pre", ("mean_state_norm", l), fn)
    return reduction


class MeanStateNorm(registry.Measurement):
    name = "mean_state_norm"
    title = "Mean residual norms"
    summary = "the mean norm of each block's input residual over the token scope"
    result = MeanStateNorms
    section = "gain"
    Options = MeanStateNormOptions
    in_profile = False
    readouts = (registry.Readout("mean_state_norm:<layer>", "the mean over the token scope of ||x_layer[t]||, "
                                 "block <layer>'s input"),)

    def reductions(self) -> list[Any]:
        return [mean_state_norms(self.options.token_scope)]

    def build(self, ctx: registry.BuildContext) -> MeanStateNorms:
        got = ctx.collected
        return MeanStateNorms(norm=got.stack("mean_state_norm").T.contiguous(), token_scope=self.options.token_scope,
                              provenance=got.provenance())


@pytest.fixture
def registered(monkeypatch):
    """The measurement and its metric registered for one test (the registries restored after)."""
    registry.measurements()  # every provider imported first: what registers later would be lost with the copy
    monkeypatch.setattr(registry, "_METRICS", dict(registry._METRICS))
    monkeypatch.setattr(registry, "_MEASUREMENTS", dict(registry._MEASUREMENTS))
    registry.register_metric(registry.Metric(
        "mean_state_norm", symbol="<||x_l||>", formula="mean over the token scope of ||x_l[t]||", unit="residual norm",
        shape="prompt layer", result="MeanStateNorms", section="gain", attr="norm"))
    return registry.register_measurement(MeanStateNorm)


def _dense(model, prompts, scope, hooks=()):
    view = ModelView(model)
    out = []
    for p in prompts:
        tb = tokenize(view, [p], prepend_bos="host")
        with model.hooks(fwd_hooks=list(hooks)):
            _, cache = model.run_with_cache(tb.tokens)
        n = int(tb.lengths[0])
        keep = slice(0, n) if scope == "all" else slice(n - 1, n)
        out.append(torch.stack([cache[f"blocks.{l}.hook_resid_pre"][0, keep].double().norm(dim=-1).mean()
                                for l in range(view.n_layers)]))
    return torch.stack(out)


def _zero_head(head):
    def hook(z, hook=None):
        z[:, :, head] = 0.0
        return z
    return hook


def test_registered_outside_it_runs_pairs_and_sweeps(bridge, registered):
    model = bridge("gpt2")
    assert registry.measurement("mean_state_norm") is MeanStateNorm
    res = tl.run(model, PROMPTS, {"mean_state_norm": {"token_scope": "last"}}, batch_size=2)
    torch.testing.assert_close(res.mean_state_norm.norm, _dense(model, PROMPTS, "last"), rtol=1e-6, atol=1e-8)
    with pytest.raises(ThermoLensInputError, match="token_scope must be one of 'all', 'last'"):
        tl.run(model, PROMPTS, {"mean_state_norm": {"token_scope": "all_but_first"}})
    with pytest.raises(ThermoLensInputError, match="has no option"):
        tl.run(model, PROMPTS, {"mean_state_norm": {"scope": "all"}})

    # in a profile beside a built-in one, and back from JSON
    prof = tl.profile(model, PROMPTS, measures=["gain", "mean_state_norm"], token_scope="all", progress=False)
    assert set(prof.results) == {"gain", "mean_state_norm"}
    torch.testing.assert_close(prof.mean_state_norm.norm, _dense(model, PROMPTS, "all"), rtol=1e-6, atol=1e-8)
    back = type(prof).from_json(prof.to_json())
    assert isinstance(back.mean_state_norm, MeanStateNorms)
    assert torch.equal(back.mean_state_norm.norm, prof.mean_state_norm.norm)

    # b - a: a head of block 0 zeroed changes the inputs of blocks 1.. and not block 0's
    hooks = [("blocks.0.attn.hook_z", _zero_head(1))]
    a = tl.run(model, PROMPTS, ["mean_state_norm"]).mean_state_norm
    b = tl.run(model, PROMPTS, ["mean_state_norm"], fwd_hooks=hooks).mean_state_norm
    d = b - a
    assert d.quantity == "norm" and d.dims == ("layer",)
    torch.testing.assert_close(d.difference, _dense(model, PROMPTS, "all", hooks) - _dense(model, PROMPTS, "all"),
                               rtol=1e-5, atol=1e-7)
    assert torch.all(d.difference[:, 0] == 0) and float(d.difference[:, 1:].abs().min()) > 0

    # a sweep reads it by name: each cell equals a run under that cell's hook
    L = model.cfg.n_layers
    s = tl.sweeps.ablation_sweep(model, PROMPTS, "attn.hook_z", method="zero", measure=f"mean_state_norm:{L - 1}",
                                 layers=[0, L - 1], token_scope="all")
    assert s.measure == f"mean_state_norm:{L - 1}" and "block <layer>'s input" in s.measure_definition
    clean = _dense(model, PROMPTS, "all")[:, L - 1]
    np.testing.assert_allclose(s.baseline.numpy(), clean.numpy(), rtol=1e-6)
    for h in range(model.cfg.n_heads):
        want = _dense(model, PROMPTS, "all", [("blocks.0.attn.hook_z", _zero_head(h))])[:, L - 1]
        np.testing.assert_allclose(s.per_prompt[:, 0, h].numpy(), (want - clean).numpy(), rtol=1e-4, atol=1e-6)
    assert torch.all(s.per_prompt[:, 1] == 0)  # block L-1's heads write after its input is read
    assert "mean_state_norm:<layer>" in tl.sweeps.measure_definitions()
    from thermo_lens import definitions

    assert "| `mean_state_norm:<layer>` | `mean_state_norm` |" in definitions.readout_table()


def test_registration_refuses_what_is_not_a_measurement(registered):
    with pytest.raises(TypeError, match="Measurement"):  # (under the tests, the type checker says it first)
        registry.register_measurement(object)  # type: ignore[arg-type]

    class Taken(MeanStateNorm):
        name = "another"
    with pytest.raises(ValueError, match="already 'mean_state_norm'"):
        registry.register_measurement(Taken)

    class Again(MeanStateNorm):
        pass
    with pytest.raises(ValueError, match="already registered"):
        registry.register_measurement(Again)
