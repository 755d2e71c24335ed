"""Anisotropy profile vs the dense mean pairwise cosine of HF hidden states (numpy float64)."""

import warnings

import numpy as np
import pytest
import torch

from conftest import ARCHS
from test_gain import PROMPTS, hf_ids, hf_states
from thermo_lens.measures.anisotropy import AnisotropyResult, anisotropy_from_collected, anisotropy_profile
from thermo_lens.measures.gain import gain_from_collected, residual_gain
from thermo_lens.core.passes import collect
from thermo_lens.measures.anisotropy import anisotropy
from thermo_lens.measures.gain import residual_norms
from thermo_lens.core.model import ModelView
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.tokens import encode

torch.set_num_threads(1)  # tiny models on a shared machine: threads only contend


def dense_anisotropy(x):
    """Mean off-diagonal cosine of the token states x[1:] (position 0 excluded), float64."""
    u = x[1:].numpy()
    u = u / np.linalg.norm(u, axis=-1, keepdims=True)
    m = u.shape[0]
    if m < 2:
        return float("nan")
    cos = u @ u.T
    return float((cos.sum() - np.trace(cos)) / (m * (m - 1)))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_anisotropy_equals_dense_cosines_of_hf_states(arch, bridge, hf_model, checkpoint_dir):
    res = anisotropy_profile(bridge(arch), PROMPTS, batch_size=3, prepend_bos=True)
    L = ModelView(bridge(arch)).n_layers
    assert res.values.shape == (len(PROMPTS), L + 1) and res.values.dtype == torch.float32
    ref = np.empty((len(PROMPTS), L + 1))
    for p, prompt in enumerate(PROMPTS):
        xs, _ = hf_states(arch, hf_model(arch), hf_ids(checkpoint_dir, arch, prompt))
        ref[p] = [dense_anisotropy(x) for x in xs]
    np.testing.assert_allclose(res.values.numpy(), ref, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(res.stats.mean), np.nanmean(ref, axis=0), atol=2e-5)
    assert res.post_ln == (arch in ("bert", "opt_postln"))


@pytest.mark.slow
def test_same_pass_as_the_gain(bridge):
    view = ModelView(bridge("neox"))
    calls = []

    def count(x, hook):
        calls.append(1)

    both = collect(view, PROMPTS, [residual_norms, anisotropy], prepend_bos=True, batch_size=8,
                   fwd_hooks=[("blocks.0.hook_resid_pre", count)])
    assert len(calls) == 1  # one forward pass for both metrics
    a = anisotropy_from_collected(both)
    g = gain_from_collected(both, "last")
    # float32 tolerance, not bit equality: without user hooks the prompts run in length buckets
    # (other batches than the hooked run's), and a forward pass rounds differently per batch shape.
    torch.testing.assert_close(a.values, anisotropy_profile(view, PROMPTS, prepend_bos=True).values, equal_nan=True)
    torch.testing.assert_close(g.block_gain, residual_gain(view, PROMPTS, token_scope="last", prepend_bos=True).block_gain)


@pytest.mark.slow
def test_short_prompts_are_nan_and_left_out(bridge):
    view = ModelView(bridge("gpt2"))
    short = "The"  # BOS + 1 token: no pair of tokens after position 0
    assert len(encode(view, short, True)) == 2
    res = anisotropy_profile(view, [PROMPTS[0], short, PROMPTS[2]])
    assert torch.isnan(res.values[1]).all() and not torch.isnan(res.values[[0, 2]]).any()
    assert list(res.stats.n) == [2] * (view.n_layers + 1)
    torch.testing.assert_close(res.mean, res.values[[0, 2]].mean(0))
    assert "too short" in repr(res)
    with pytest.warns(UserWarning, match="fewer than 3 tokens"):
        anisotropy_profile(view, [short])


def test_frame_json_and_records(bridge):
    res = anisotropy_profile(bridge("opt_postln"), PROMPTS, prepend_bos=False)
    back = AnisotropyResult.from_json(res.to_json())
    torch.testing.assert_close(back.values, res.values, rtol=0, atol=0)
    assert back.prepend_bos is False and back.post_ln is True and back.weights == "raw"
    df = res.to_frame()
    L = res.n_layers
    assert len(df) == len(PROMPTS) * (L + 1)
    assert tuple(df["hook"][: L + 1]) == ModelView(bridge("opt_postln")).resid_hook_names
    assert {"prompt", "state", "anisotropy", "prepend_bos", "dtype", "weights", "post_ln"} <= set(df.columns)
    assert len(res.summary_frame()) == L + 1
    assert "mean pairwise cosine" in repr(res)


def test_bad_input(bridge):
    with pytest.raises(ThermoLensInputError, match="empty"):
        anisotropy_profile(bridge("gpt2"), [])
    c = collect(bridge("gpt2"), PROMPTS, [residual_norms], prepend_bos=True)
    with pytest.raises(ThermoLensInputError, match=r"collect\(model, prompts, \[anisotropy"):
        anisotropy_from_collected(c)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ThermoLensInputError, match="Collected"):
            anisotropy_from_collected("not a pass")


def test_a_sweep_reads_one_state_s_anisotropy(bridge):
    # The registry's readout anisotropy:<state>: each cell equals anisotropy_profile under its hook;
    # cells in blocks at or after the state's reader leave it unchanged.
    from thermo_lens.experiments.sweeps import ablation_sweep

    model = bridge("gpt2")
    H = model.cfg.n_heads

    def zero(h):
        def hook(z, hook=None):
            z[:, :, h] = 0.0
            return z
        return hook

    clean = anisotropy_profile(model, PROMPTS).values[:, 2].double()
    s = ablation_sweep(model, PROMPTS, "attn.hook_z", method="zero", measure="anisotropy:2", layers=[0, 1, 2])
    assert s.measure == "anisotropy:2" and "x_<state>" in s.measure_definition and "position 0" in s.token_scope
    np.testing.assert_allclose(s.baseline.numpy(), clean.numpy(), rtol=1e-6)
    for l in (0, 1):
        for h in range(H):
            want = anisotropy_profile(model, PROMPTS, fwd_hooks=[(f"blocks.{l}.attn.hook_z", zero(h))]).values[:, 2]
            np.testing.assert_allclose(s.per_prompt[:, l, h].numpy(), (want.double() - clean).numpy(),
                                       rtol=1e-4, atol=1e-6)
    assert torch.all(s.per_prompt[:, 2] == 0)  # x_2 is block 2's input: its heads come after
    with pytest.raises(ThermoLensInputError, match="state 9 out of range"):
        ablation_sweep(model, PROMPTS, "attn.hook_z", measure="anisotropy:9")
