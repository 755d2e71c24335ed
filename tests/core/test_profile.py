"""profile(): one forward pass per batch, equal to the individual metrics, exact JSON round trip."""

import warnings

import numpy as np
import pytest
import torch

import thermo_lens as tl
from thermo_lens.measures.profile import ThermoProfile, profile, profiles_frame

PROMPTS = ["The capital of France is", "Water freezes at a temperature of",
           "Birds of a feather flock", "The Voynich manuscript's undeciphered text"]


@pytest.fixture(scope="module")
def prof(bridge):
    return profile(bridge("gpt2"), PROMPTS, batch_size=3, lab="OpenAI-like", family="toy")


def test_one_forward_pass_per_batch(bridge):
    calls = []
    p = profile(bridge("llama_gqa"), PROMPTS, batch_size=3,
                fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: calls.append(x.shape[0]))])
    # one pass per batch of the plan, for gain + anisotropy + sheaf together
    assert calls == [len(b) for b in p.gain.provenance.batch_plan] and sum(calls) == len(PROMPTS)


def test_a_profile_looks_up_the_device_once(bridge, monkeypatch):
    """For a dispatched model each device lookup walks every module: a profile (its pass, the
    spectral signature, every result's metadata) does it once, and the pin ends with it."""
    from thermo_lens.core import offload
    from thermo_lens.core.model import ModelView

    view = ModelView(bridge("gpt2"))
    calls = []
    real = offload.execution_device
    monkeypatch.setattr(offload, "execution_device", lambda m: calls.append(1) or real(m))
    p = profile(view, PROMPTS, batch_size=2)
    assert len(calls) == 1 and len(p.gain.provenance.batch_plan) > 1
    assert getattr(view, "_pinned_device", None) is None


@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa", "opt_postln"])
def test_profile_equals_individual_metrics(arch, bridge):
    m = bridge(arch)
    p = profile(m, PROMPTS, batch_size=3)
    g = tl.residual_gain(m, PROMPTS, batch_size=2)
    torch.testing.assert_close(p.gain.block_gain, g.block_gain)
    assert p.gain.regime == g.regime
    s = tl.spectral_signature(m)
    torch.testing.assert_close(p.spectral.ov_norm, s.ov_norm)
    t = tl.sheaf_traces(m, PROMPTS, batch_size=4)
    torch.testing.assert_close(p.sheaf.trace, t.trace)
    a = tl.anisotropy_profile(m, PROMPTS)
    torch.testing.assert_close(p.anisotropy.values, a.values, equal_nan=True)
    assert p.meta["post_ln"] == (arch == "opt_postln")
    assert p.l_star.n_layers == 3


def test_metadata_and_row(prof):
    m = prof.meta
    assert m["lab"] == "OpenAI-like" and m["family"] == "toy" and m["n_prompts"] == len(PROMPTS)
    assert m["weights"] == "raw" and m["dtype"] == "float32" and m["prepend_bos"] is True
    row = prof.to_row()
    assert row["gain"] == pytest.approx(float(prof.gain.summaries[prof.gain.regime_by].mean))
    assert row["rho"] == pytest.approx(4 / 8)
    assert row["mean_trace"] == pytest.approx(float(prof.sheaf.trace.sum(-1).mean(0).mean()))
    T = prof.sheaf.trace.sum(-1).mean(0).double().numpy()  # the L* row names its rule, the paper's beside it
    assert row["l_star_rule"] == "steepest_step" and row["l_star"] == float(np.argmax(np.abs(np.diff(T))) + 1)
    assert row["l_star_paper_rule"] == float(np.argmax(np.abs(np.gradient(T))))
    frame = profiles_frame([prof, prof])
    assert len(frame) == 2 and {"n_layers", "rho", "gain", "regime", "lab"} <= set(frame.columns)
    text = repr(prof)
    assert "regime" in text and "L*" in text and "weights raw" in text


def test_json_round_trip_is_exact(prof, tmp_path):
    text = prof.to_json()
    back = ThermoProfile.from_json(text)
    assert back.to_json() == text
    assert torch.equal(back.gain.block_gain, prof.gain.block_gain)
    assert torch.equal(back.sheaf.trace, prof.sheaf.trace)
    prof.to_json(tmp_path / "p.json")
    assert ThermoProfile.from_json(tmp_path / "p.json").meta == prof.meta


@pytest.mark.slow
def test_laws_run_on_profiles(bridge):
    models = [(bridge("gpt2"), "A"), (bridge("gemma"), "B"),
              (tl.zoo.load("gpt2-tiny-wd"), "A"), (tl.zoo.load("neox-tiny"), "B")]
    profs = [profile(m, PROMPTS[:2], name=f"m{i}", lab=lab) for i, (m, lab) in enumerate(models)]
    table = profiles_frame(profs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = tl.laws.kleiber(table)
    assert k.gain_vs_rho.n == 4 and k.gain_vs_depth.n == 4
    # the law's inputs are the profiles' own numbers
    assert list(table["n_layers"]) == [3, 3, 4, 4]
