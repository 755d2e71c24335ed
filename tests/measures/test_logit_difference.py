"""LogitDifference is the model's own logit difference on every family of the test matrix: read
from the final residual through the model's head (final norm, BERT's masked-LM transform, OPT-350m's
project_out, Granite's logits_scaling, Gemma-2's final soft cap), checked against ``model(tokens)``;
string answers; a head it cannot reproduce is refused with the way out; NaN is never a number."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from thermo_lens.core.errors import ThermoLensInputError, ThermoLensNumericsError
from thermo_lens.experiments.sweeps import LogitDifference, ablation_sweep
from thermo_lens.testing import ARCHITECTURES, FAST_ARCHITECTURES

TOL = 2e-5
SLOW = pytest.mark.slow
MATRIX = [a if a in FAST_ARCHITECTURES else pytest.param(a, marks=SLOW) for a in ARCHITECTURES]
# token ids without the pad id 0 (three prompts of one length, so the logits compare position by position)
TOKENS = torch.tensor([[3, 5, 17, 33, 41, 9], [7, 2, 11, 13, 19, 23], [29, 31, 37, 43, 47, 53]])


def _zero_head0(m):
    n = m.cfg.n_heads

    def hook(z, hook):
        z = z.clone()
        z.view(z.shape[0], z.shape[1], n, -1)[:, :, 0] = 0.0
        return z
    return hook


@pytest.mark.parametrize("arch", MATRIX)
def test_equals_the_models_own_logit_difference(bridge, arch):
    m = bridge(arch)
    ld = LogitDifference([5, 6, 8], [7, 9, 10], pos=-2)
    s = ablation_sweep(m, TOKENS, "attn.hook_z", measure=ld, layers=[1], heads=[0])
    with torch.inference_mode():
        clean = m(TOKENS)
        abl = m.run_with_hooks(TOKENS, fwd_hooks=[("blocks.1.attn.hook_z", _zero_head0(m))])
    np.testing.assert_allclose(s.baseline.numpy(), ld(clean).double().numpy(), rtol=TOL, atol=TOL)
    np.testing.assert_allclose(s.per_prompt[:, 0, 0].numpy(), (ld(abl) - ld(clean)).double().numpy(),
                               rtol=10 * TOL, atol=10 * TOL)


@pytest.mark.parametrize("arch", ["granite", "bert", "opt_postln", "gemma2"])
def test_the_head_steps_are_named_and_needed(bridge, arch):
    """Each family's extra head step is in the readout, and the readout without it is not the
    model's difference (the test would fail if the step were a no-op on these weights)."""
    from thermo_lens import ModelView
    from thermo_lens.experiments.sweeps.logits import head_readout

    m = bridge(arch)
    head = head_readout(ModelView(m))
    word = {"granite": "logits_scaling=4", "bert": "masked-LM head's transform", "opt_postln": "project_out",
            "gemma2": "soft-capped at 30"}[arch]
    assert word in head.steps
    view = ModelView(m)
    with torch.inference_mode():
        seen = {}
        logits = m.run_with_hooks(TOKENS, fwd_hooks=[(view.resid_hook_names[-1],
                                                     lambda x, hook: seen.setdefault("x", x.clone()))])
        ids = torch.tensor([[5, 7]] * 3)
        got = head.logits(view, seen["x"][:, -1], ids)
        want = logits[:, -1].gather(1, ids)
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)
        if arch == "granite":
            assert not torch.allclose(got * 4.0, want, atol=1e-3)


def test_a_head_it_cannot_reproduce_is_refused_with_the_way_out(bridge, monkeypatch):
    import thermo_lens.experiments.sweeps.logits as logits

    m = bridge("granite")
    real = logits._build_head

    def without_scaling(view):
        h = real(view)
        return logits.HeadReadout(pre=h.pre, post=lambda x: x, steps="the final norm, two columns")
    monkeypatch.setattr(logits, "_build_head", without_scaling)
    monkeypatch.setattr(logits, "_CHECKED", __import__("weakref").WeakKeyDictionary())
    ld = LogitDifference(5, 7)
    with pytest.raises(ThermoLensInputError, match=r"cannot read .*logits exactly.*differs .* by up to.*ld\.on_logits"):
        ablation_sweep(m, TOKENS, "attn.hook_z", measure=ld, layers=[0], heads=[0])
    # the way out: the same difference from the full logits
    s = ablation_sweep(m, TOKENS, "attn.hook_z", measure=ld.on_logits, layers=[0], heads=[0])
    with torch.inference_mode():
        np.testing.assert_allclose(s.baseline.numpy(), ld(m(TOKENS)).double().numpy(), rtol=TOL, atol=TOL)
    monkeypatch.setattr(logits, "_CHECKED", __import__("weakref").WeakKeyDictionary())


def test_string_answers_are_one_token_continuations(bridge):
    m = bridge("gpt2")
    tok = m.tokenizer
    one = next(t for t in (" the", " a", " of", "e", "a") if len(tok.encode(t, add_special_tokens=False)) == 1)
    other = next(t for t in ("t", "o", "s", "n") if len(tok.encode(t, add_special_tokens=False)) == 1)
    ids = [tok.encode(t, add_special_tokens=False)[0] for t in (one, other)]
    by_text = ablation_sweep(m, TOKENS, "attn.hook_z", measure=LogitDifference(one, other), layers=[0], heads=[0])
    by_id = ablation_sweep(m, TOKENS, "attn.hook_z", measure=LogitDifference(*ids), layers=[0], heads=[0])
    np.testing.assert_array_equal(by_text.per_prompt.numpy(), by_id.per_prompt.numpy())
    assert repr(one) in by_text.measure
    assert LogitDifference(one, other).resolve(m) == LogitDifference([ids[0]], [ids[1]])
    with torch.inference_mode():
        np.testing.assert_allclose(LogitDifference(one, other).resolve(m)(m(TOKENS)).numpy(),
                                   LogitDifference(*ids)(m(TOKENS)).numpy())
    # several tokens: refused, naming them (" John" is 4 tokens for this nearly character-level tokenizer)
    long = " Johnathan"
    n = len(tok.encode(long, add_special_tokens=False))
    assert n > 1
    with pytest.raises(ThermoLensInputError, match=rf"answer ' Johnathan' is {n} tokens .*ids \[.*explicitly"):
        ablation_sweep(m, TOKENS, "attn.hook_z", measure=LogitDifference(long, other), layers=[0], heads=[0])
    with pytest.raises(ThermoLensInputError, match="need the model's tokenizer"):
        LogitDifference(one, other)(torch.zeros(1, 2, 300))
    for bad in ("", []):
        with pytest.raises(ThermoLensInputError, match="LogitDifference"):
            LogitDifference(bad, 1)


def test_a_nan_difference_is_refused_naming_the_readout(bridge):
    """A NaN in the answer's unembedding column (not an input token's: GPT-2 ties W_U to W_E) gives a
    finite final residual and a NaN difference: refused, naming the readout."""
    m = bridge("gpt2")
    weight = m.unembed.weight if hasattr(m.unembed, "weight") else m.unembed.original_component.weight
    keep = weight.detach().clone()
    with torch.no_grad():
        if weight.shape[0] == m.cfg.d_vocab:
            weight[250, 0] = float("nan")
        else:
            weight[0, 250] = float("nan")
    try:
        assert bool(m.W_U[:, 250].isnan().any()) and not bool(m.W_U[:, 7].isnan().any())
        with pytest.raises(ThermoLensNumericsError,
                           match=r"NaN/inf at the logit difference read from blocks\.2\.hook_resid_post"):
            ablation_sweep(m, TOKENS, "attn.hook_z", measure=LogitDifference(250, 7), layers=[0], heads=[0])
    finally:
        with torch.no_grad():
            weight.copy_(keep)
