"""Patching and ablation sweeps (issue 22) against single-condition runs and hand-written hooks.

References, independent of the sweep's batching: ``residual_gain(corrupted, fwd_hooks=patch_from(...))``
(one condition per run), ``model.run_with_hooks`` with a hand-written patch / mean / resample hook
(logits), and ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos`` (the same cells,
one full forward pass each).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import thermo_lens as tl
from thermo_lens import ThermoLensInputError
from thermo_lens.experiments.sweeps import SweepResult, ablation_sweep, patch_sweep

TOL = 1e-5


def _pairs(n: int = 3, length: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 250, (n, length), generator=g), torch.randint(1, 250, (n, length), generator=g)


def _logit_diff(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 5] - logits[:, -1, 7]


def _total(g) -> np.ndarray:
    return np.asarray(g.summaries["total_amplification"].values, dtype=np.float64)


def _gain_cell_ref(model, clean, corr, layer: int, head: int, measure: str) -> np.ndarray:
    """One condition alone: patch_from + residual_gain(fwd_hooks=...)."""
    patch = tl.patch_from(model, clean, f"blocks.{layer}.attn.hook_z", heads=[head])
    g1, g0 = tl.residual_gain(model, corr, fwd_hooks=patch), tl.residual_gain(model, corr)
    if measure == "total_amplification":
        return _total(g1) - _total(g0)
    col = model.cfg.n_layers - 1 if measure == "last_block_gain" else int(measure.split(":")[1])
    return (g1.block_gain[:, col].double() - g0.block_gain[:, col].double()).numpy()


def _heads4(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], n_heads, -1) if x.ndim == 3 else x


def _patched_logits(model, corr, name: str, value_fn) -> torch.Tensor:
    def hook(x, hook=None):
        value_fn(x)
        return x
    with torch.inference_mode():
        return model.run_with_hooks(corr, fwd_hooks=[(name, hook)])


@pytest.mark.slow
def test_patch_head_cells_equal_single_condition_runs(bridge):
    m = bridge("gpt2")
    clean, corr = _pairs()
    s = patch_sweep(m, clean, corr, "attn.hook_z", measure="total_amplification", batch_size=2)
    assert isinstance(s, SweepResult) and tuple(s.per_prompt.shape) == (3, 3, 4)
    for layer, head in ((0, 1), (2, 3)):
        ref = _gain_cell_ref(m, clean, corr, layer, head, "total_amplification")
        np.testing.assert_allclose(s.per_prompt[:, layer, head].numpy(), ref, atol=TOL)
    # the baseline is the corrupted run's measure, the clean one the clean run's
    np.testing.assert_allclose(s.baseline.numpy(), _total(tl.residual_gain(m, corr)), atol=TOL)
    np.testing.assert_allclose(s.clean.numpy(), _total(tl.residual_gain(m, clean)), atol=TOL)
    frac = s.per_prompt.mean(0) / (s.clean - s.baseline).mean()
    np.testing.assert_allclose(s.fraction.numpy(), frac.numpy(), rtol=1e-9)
    assert bool((s.fraction_low <= s.fraction).all()) and bool((s.fraction <= s.fraction_high).all())


def test_logit_cells_equal_transformer_lens_patching(bridge):
    patching = pytest.importorskip("transformer_lens.patching")
    m = bridge("gpt2")
    clean, corr = _pairs()
    s = patch_sweep(m, clean, corr, "attn.hook_z", measure=_logit_diff, batch_size=6)
    _, cache = m.run_with_cache(clean)
    with torch.inference_mode():
        base = float(_logit_diff(m(corr)).mean())
        grid = patching.get_act_patch_attn_head_out_all_pos(m, corr, cache, lambda lg: _logit_diff(lg).mean())
    np.testing.assert_allclose(s.effect.numpy(), grid.double().numpy() - base, atol=TOL)
    assert s.measure == "logits:_logit_diff" and s.token_scope == "n/a"
    with torch.inference_mode():
        np.testing.assert_allclose(s.clean.numpy(), _logit_diff(m(clean)).double().numpy(), atol=TOL)
        np.testing.assert_allclose(s.baseline.numpy(), _logit_diff(m(corr)).double().numpy(), atol=TOL)


def test_mean_ablation_over_positions_equals_hand_written_hook(bridge):
    m = bridge("gpt2")
    prompts, ref_prompts = _pairs(n=4, length=5, seed=1)
    a = ablation_sweep(m, prompts, "hook_resid_pre", over="pos", method="mean", reference=ref_prompts,
                       measure="block_gain:1", layers=[1], positions=[0, -1])
    assert tuple(a.per_prompt.shape) == (4, 1, 2) and a.positions == (0, -1)
    _, cache = m.run_with_cache(ref_prompts)
    mean = cache["blocks.1.hook_resid_pre"].mean(0)  # [pos, d_model]
    g0 = tl.residual_gain(m, prompts)
    for k, pos in enumerate((0, 4)):
        def hook(x, hook=None, _pos=pos):
            x[:, _pos] = mean[_pos]
            return x
        g1 = tl.residual_gain(m, prompts, fwd_hooks=[("blocks.1.hook_resid_pre", hook)])
        ref = g1.block_gain[:, 1].double() - g0.block_gain[:, 1].double()
        np.testing.assert_allclose(a.per_prompt[:, 0, k].numpy(), ref.numpy(), atol=TOL)


def test_resample_and_zero_ablation_equal_hand_written_hooks(bridge):
    m = bridge("gpt2")
    prompts, _ = _pairs(n=2, length=5, seed=2)
    r = ablation_sweep(m, prompts, "attn.hook_z", method="resample", measure=_logit_diff, layers=[1], seed=3)
    assert "source=[1, 0]" in r.reference  # two prompts: each takes the other's
    z = ablation_sweep(m, prompts, "attn.hook_z", method="zero", measure=_logit_diff, layers=[1])
    _, cache = m.run_with_cache(prompts)
    src = _heads4(cache["blocks.1.attn.hook_z"], 4)[[1, 0]]
    with torch.inference_mode():
        base = _logit_diff(m(prompts)).double()
    for h in range(4):
        def resample(x, h=h):
            _heads4(x, 4)[:, :, h] = src[:, :, h]

        def zero(x, h=h):
            _heads4(x, 4)[:, :, h] = 0
        for res, fn in ((r, resample), (z, zero)):
            ref = _logit_diff(_patched_logits(m, prompts, "blocks.1.attn.hook_z", fn)).double() - base
            np.testing.assert_allclose(res.per_prompt[:, 0, h].numpy(), ref.numpy(), atol=TOL)


def test_frame_stats_and_round_trip(bridge):
    m = bridge("gpt2")
    clean, corr = _pairs()
    s = patch_sweep(m, clean, corr, "attn.hook_z", measure="last_block_gain", layers=[0, 2], heads=[0, 1])
    df = s.to_frame()
    assert list(df["layer"]) == [0, 0, 2, 2] and list(df["head"]) == [0, 1, 0, 1]
    for col in ("effect", "ci_low", "ci_high", "pvalue", "pvalue_adjusted", "fraction_restored", "measure",
                "method", "hook", "token_scope", "prepend_bos", "n_prompts", "model"):
        assert col in df.columns, col
    assert df["measure"].iloc[0] == "last_block_gain" and df["n_prompts"].iloc[0] == 3
    # paired t by hand, Holm over the 4 cells
    from scipy import stats as st
    d = s.per_prompt.numpy().reshape(3, -1)
    p = st.ttest_1samp(d, 0.0).pvalue
    np.testing.assert_allclose(df["pvalue"], p, rtol=1e-6)
    np.testing.assert_allclose(df["pvalue_adjusted"], tl.stats.holm(p), rtol=1e-6)
    spec = tl.spectral_signature(m).to_frame()
    merged = df.merge(spec, on=["layer", "head"], suffixes=("", "_spectral"))
    assert len(merged) == 4 and "effect" in merged and not merged["effect"].isna().any()
    back = SweepResult.from_json(s.to_json())
    assert torch.equal(back.per_prompt, s.per_prompt) and back.hook == "attn.hook_z"
    assert "last_block_gain" in repr(s) and "Holm" in repr(s)

    # scipy's vocabulary, from the sweep's PairedDifference: t, df, any level's CI; old names warn
    ref = st.ttest_1samp(d, 0.0)
    np.testing.assert_allclose(s.statistic.numpy().ravel(), ref.statistic, rtol=1e-9)
    assert (s.df.numpy() == 2).all() and isinstance(s.paired, tl.paired.PairedDifference)
    assert torch.equal(s.paired.difference, s.per_prompt) and s.paired.dims == ("layer", "head")
    np.testing.assert_allclose(s.pvalue_holm.numpy().ravel(), tl.stats.holm(p), rtol=1e-6)
    assert torch.equal(s.confidence_interval(s.level).low, s.ci_low) and torch.equal(s.confidence_interval().high,
                                                                                     s.ci_high)
    ci = ref.confidence_interval(0.8)
    np.testing.assert_allclose(s.confidence_interval(0.8).low.numpy().ravel(), ci.low, rtol=1e-9)
    np.testing.assert_allclose(s.confidence_interval(0.8).high.numpy().ravel(), ci.high, rtol=1e-9)
    with pytest.warns(DeprecationWarning, match="pvalue_adjusted is deprecated"):
        assert torch.equal(s.pvalue_adjusted, s.pvalue_holm)
    # a sweep stored before the rename (schema 1, pvalue_adjusted) still loads
    import json
    import warnings
    data = json.loads(s.to_json())
    data["version"] = data["thermo_lens_schema"] = 1
    data["fields"]["pvalue_adjusted"] = data["fields"].pop("pvalue_holm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        old = SweepResult.from_json(json.dumps(data))
    assert torch.equal(old.pvalue_holm, s.pvalue_holm)


def test_bad_input_is_a_clear_error(bridge):
    m = bridge("gpt2")
    clean, corr = _pairs()
    cases = [
        (lambda: patch_sweep(m, clean, corr, "hook_resid_pre", over="head"), "no head axis"),
        (lambda: patch_sweep(m, clean[:2], corr, "attn.hook_z"), "2 clean and 3 corrupted"),
        (lambda: patch_sweep(m, clean, corr, "attn.hook_z", positions=[6]), "beyond"),
        (lambda: patch_sweep(m, clean, corr[:, :5], "attn.hook_z"), "same token length"),
        (lambda: patch_sweep(m, clean, corr, "attn.hook_z", measure="gain"), "unknown measure"),
        (lambda: patch_sweep(m, clean, corr, "attn.hook_z", over="layer"), "over must be"),
        (lambda: patch_sweep(m, clean, corr, "blocks.0.attn.hook_z"), "per-layer name"),
        (lambda: ablation_sweep(m, corr, "attn.hook_z", method="median"), "unknown method"),
        # the longer prompt has no other prompt to take every one of its tokens from
        (lambda: ablation_sweep(m, ["The cat", "The capital of France is"], "attn.hook_z", method="resample"),
         "no other prompt has every position prompt 1"),
        (lambda: ablation_sweep(m, ["The cat", "The capital of France is"], "hook_resid_post", over="pos"),
         "same token length"),
        # a misspelt hook is named as unknown, not as a hook without a head axis
        (lambda: patch_sweep(m, clean, corr, "attn.hook_zz"), r"(?s)attn\.hook_zz.*attn\.hook_z"),
        # a function of the logits cannot tell a shorter prompt's padding from its tokens
        (lambda: ablation_sweep(m, ["The cat", "The capital of France is"], "attn.hook_z", measure=_logit_diff),
         "LogitDifference"),
        (lambda: patch_sweep(m, ["The cat", "The capital of France is"], ["The dog", "The capital of Spain is"],
                             "attn.hook_z", measure=_logit_diff), "padding"),
    ]
    for call, words in cases:
        with pytest.raises(ThermoLensInputError, match=words):
            call()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama_gqa"])
def test_every_cell_equals_its_own_run(bridge, arch):
    """Every (layer, head) cell and every (layer, head, pos) cell of one layer, on three architectures."""
    m = bridge(arch)
    clean, corr = _pairs(n=3, length=5, seed=4)
    s = patch_sweep(m, clean, corr, "attn.hook_z", measure="total_amplification", batch_size=7)
    for layer in range(m.cfg.n_layers):
        for head in range(m.cfg.n_heads):
            ref = _gain_cell_ref(m, clean, corr, layer, head, "total_amplification")
            np.testing.assert_allclose(s.per_prompt[:, layer, head].numpy(), ref, atol=TOL)
    both = patch_sweep(m, clean, corr, "attn.hook_z", over=("head", "pos"), measure="last_block_gain", layers=[1])
    assert tuple(both.per_prompt.shape) == (3, 1, m.cfg.n_heads, 5)
    g0 = tl.residual_gain(m, corr)
    for head in range(m.cfg.n_heads):
        for pos in (0, 4):
            patch = tl.patch_from(m, clean, "blocks.1.attn.hook_z", heads=[head], positions=[pos])
            g1 = tl.residual_gain(m, corr, fwd_hooks=patch)
            ref = g1.block_gain[:, -1].double() - g0.block_gain[:, -1].double()
            np.testing.assert_allclose(both.per_prompt[:, 0, head, pos].numpy(), ref.numpy(), atol=TOL)
    patching = pytest.importorskip("transformer_lens.patching")
    lg = patch_sweep(m, clean, corr, "attn.hook_z", measure=_logit_diff)
    _, cache = m.run_with_cache(clean)
    with torch.inference_mode():
        base = float(_logit_diff(m(corr)).mean())
        grid = patching.get_act_patch_attn_head_out_all_pos(m, corr, cache, lambda x: _logit_diff(x).mean())
    np.testing.assert_allclose(lg.effect.numpy(), grid.double().numpy() - base, atol=TOL)


@pytest.mark.slow
def test_views_heatmap_marks_non_significant_cells_and_paired_plot(bridge):
    m = bridge("gpt2")
    clean, corr = _pairs()
    s = patch_sweep(m, clean, corr, "attn.hook_z", measure="total_amplification", layers=[0, 1])
    fig = s.plot()
    heat = next(t for t in fig.data if t.type == "heatmap")
    np.testing.assert_allclose(np.asarray(heat.z, dtype=float), s.effect.numpy())
    assert "Holm-adjusted p" in heat.hovertemplate and "fraction restored" in heat.hovertemplate
    marked = next(t for t in fig.data if (t.meta or {}).get("role") == "not_significant")
    n_ns = int((~(s.pvalue_adjusted < 0.05)).sum())
    assert len(marked.x) == n_ns
    d = tl.residual_gain(m, corr, fwd_hooks=tl.patch_from(m, clean, "blocks.1.attn.hook_z")) - tl.residual_gain(m, corr)
    pfig = d.plot()
    np.testing.assert_allclose(np.asarray(pfig.data[0].y, dtype=float), d.mean.numpy())


def test_pairs_of_different_lengths_patch_positions_from_each_end(bridge):
    m = bridge("gpt2")
    clean = ["The capital of France is", "Water boils at one hundred degrees"]
    corr = ["The capital of Spain was", "Ice melts at zero"]
    s = patch_sweep(m, clean, corr, "attn.hook_z", positions=[-1], measure="last_block_gain", layers=[1])
    patch = tl.patch_from(m, clean, "blocks.1.attn.hook_z", heads=[2], positions=[-1])
    g1, g0 = tl.residual_gain(m, corr, fwd_hooks=patch), tl.residual_gain(m, corr)
    ref = g1.block_gain[:, -1].double() - g0.block_gain[:, -1].double()
    np.testing.assert_allclose(s.per_prompt[:, 0, 2].numpy(), ref.numpy(), atol=TOL)
    with pytest.raises(ThermoLensInputError, match="positions="):
        patch_sweep(m, clean, corr, "attn.hook_z")


def test_user_hooks_run_in_every_copy_first(bridge):
    """fwd_hooks run in the baseline and in every condition, before the sweep's own edit."""
    m = bridge("gpt2")
    clean, corr = _pairs(n=2, length=5, seed=6)

    def zero_head0(z, hook):
        _heads4(z, 4)[:, :, 0] = 0.0
        return z
    user = [("blocks.0.attn.hook_z", zero_head0)]
    s = patch_sweep(m, clean, corr, "attn.hook_z", measure="last_block_gain", layers=[1], heads=[2], fwd_hooks=user)
    g0 = tl.residual_gain(m, corr, fwd_hooks=user)
    np.testing.assert_allclose(s.baseline.numpy(), g0.block_gain[:, -1].double().numpy(), atol=TOL)
    # the clean activations come from the clean run under the same user hooks
    src = {}

    def grab(z, hook):
        src["z"] = _heads4(z, 4).clone()
    with torch.inference_mode():
        m.run_with_hooks(clean, fwd_hooks=user + [("blocks.1.attn.hook_z", grab)])

    def patch(z, hook):
        _heads4(z, 4)[:, :, 2] = src["z"][:, :, 2]
        return z
    g1 = tl.residual_gain(m, corr, fwd_hooks=user + [("blocks.1.attn.hook_z", patch)])
    ref = g1.block_gain[:, -1].double() - g0.block_gain[:, -1].double()
    np.testing.assert_allclose(s.per_prompt[:, 0, 0].numpy(), ref.numpy(), atol=TOL)
    assert "zero_head0" in s.provenance.hooks_text


@pytest.mark.slow  # a subprocess booting a model (~15 s)
def test_sweep_benchmark_runs_quick():
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "sweeps.py"), "--quick", "--pairs", "3",
                          "--tokens", "5"], capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    diffs = [float(x) for x in re.findall(r"max \|cell difference\| ([0-9.e+-]+)", out.stdout)]
    assert len(diffs) == 5 and max(diffs) < 1e-5, out.stdout  # 3 logit-difference sweeps, 2 gain sweeps
    assert out.stdout.count("ratio") == 5 and "starts at its layer" in out.stdout


def test_pattern_head_and_query_position_cells_equal_hand_written_hook(bridge):
    m = bridge("gpt2")
    prompts, _ = _pairs(n=3, length=5, seed=7)
    z = ablation_sweep(m, prompts, "hook_pattern", over=("head", "pos"), method="zero", measure=_logit_diff,
                       layers=[0], positions=[2, -1])
    assert tuple(z.per_prompt.shape) == (3, 1, 4, 2) and z.positions == (2, -1)
    with torch.inference_mode():
        base = _logit_diff(m(prompts)).double()
    for h, (k, q) in ((1, (0, 2)), (3, (1, 4))):
        def zero(x, h=h, q=q):
            x[:, h, q, :] = 0.0
        ref = _logit_diff(_patched_logits(m, prompts, "blocks.0.attn.hook_pattern", zero)).double() - base
        np.testing.assert_allclose(z.per_prompt[:, 0, h, k].numpy(), ref.numpy(), atol=TOL)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa"])
def test_attribution_and_sheaf_measures_equal_the_library(bridge, arch):
    """The unpatched row is gain_attribution's / sheaf_traces' own per-prompt number; a patched cell
    is the library's number under a hand-written patch hook."""
    m = bridge(arch)
    H = m.cfg.n_heads
    clean, corr = _pairs(n=3, length=5, seed=8)
    with torch.inference_mode():
        _, cache = m.run_with_cache(clean, names_filter=lambda n: n == "blocks.0.attn.hook_z")
    src = _heads4(cache["blocks.0.attn.hook_z"], H).clone()

    def patch(z, hook):  # head 1 of layer 0 from the clean run, every position
        _heads4(z, H)[:, :, 1] = src[:, :, 1]
        return z
    hooked = [("blocks.0.attn.hook_z", patch)]
    a0, a1 = tl.gain_attribution(m, corr), tl.gain_attribution(m, corr, fwd_hooks=hooked)
    t0, t1 = tl.sheaf_traces(m, corr), tl.sheaf_traces(m, corr, fwd_hooks=hooked)
    c0 = tl.gain_attribution(m, clean)
    refs = {"attribution_total:1": (a0.total[:, 1], a1.total[:, 1], c0.total[:, 1]),
            f"attribution_head:{1 - m.cfg.n_layers}": (a0.head[:, 1].sum(-1), a1.head[:, 1].sum(-1), None),
            f"attribution_head:1.{H - 1}": (a0.head[:, 1, H - 1], a1.head[:, 1, H - 1], None),
            "sheaf_trace:1": (t0.layer_trace[:, 1], t1.layer_trace[:, 1], None),
            "sheaf_trace:1.0": (t0.trace[:, 1, 0], t1.trace[:, 1, 0], None)}
    for measure, (before, after, on_clean) in refs.items():
        s = patch_sweep(m, clean, corr, "attn.hook_z", measure=measure, layers=[0], batch_size=6)
        scale = float(before.abs().max())
        np.testing.assert_allclose(s.baseline.numpy(), before.double().numpy(), atol=TOL * scale, rtol=1e-5)
        np.testing.assert_allclose(s.per_prompt[:, 0, 1].numpy(), (after - before).double().numpy(),
                                   atol=TOL * scale, rtol=1e-5)
        if on_clean is not None:
            np.testing.assert_allclose(s.clean.numpy(), on_clean.double().numpy(), atol=TOL * scale, rtol=1e-5)
        assert s.measure == measure.replace(str(1 - m.cfg.n_layers), "1") and s.measure_definition
    s = patch_sweep(m, clean, corr, "attn.hook_z", measure="sheaf_trace:1", layers=[0], token_scope="last")
    assert "all real tokens" in s.token_scope and "off_diagonal_mass" in s.measure_definition
    s = patch_sweep(m, clean, corr, "attn.hook_z", measure="attribution_total:1", layers=[0], token_scope="last")
    np.testing.assert_allclose(s.baseline.numpy(), tl.gain_attribution(m, corr, token_scope="last").total[:, 1]
                               .double().numpy(), rtol=1e-5)


def test_attribution_and_sheaf_measure_errors(bridge):
    m = bridge("gpt2")
    clean, corr = _pairs(n=2, length=4, seed=9)
    for measure, words in (("attribution_total:9", "out of range"), ("attribution_head:1.9", "head 9 out of range"),
                           ("attribution_total:1.0", "not a head's"), ("sheaf_trace:x", "must be an int"),
                           ("sheaf:1", "attribution_head:<layer>.<head>")):
        with pytest.raises(ThermoLensInputError, match=words):
            patch_sweep(m, clean, corr, "attn.hook_z", measure=measure, layers=[0])
    with pytest.raises(ThermoLensInputError, match="frobenius"):
        patch_sweep(m, clean, corr, "attn.hook_z", measure="attribution_total:1", token_scope="frobenius")
    # a condition the attribution cannot split is named, not a deep traceback
    with pytest.raises(ThermoLensInputError, match="hook_resid_post"):
        ablation_sweep(m, corr, "hook_resid_post", over="pos", measure="attribution_total:0", layers=[0])


@pytest.mark.slow
def test_start_at_layer_falls_back_and_says_why(bridge, monkeypatch):
    """Hooks already on the model run in every block: full passes (recorded); a host whose
    start-at-layer pass gives other numbers fails the check and the sweep runs full passes."""
    from thermo_lens.experiments.sweeps import start

    m = bridge("gpt2")
    clean, corr = _pairs(n=2, length=5, seed=12)
    ref = patch_sweep(m, clean, corr, "attn.hook_z", measure=_logit_diff, layers=[1, 2], start_at_layer=False)
    fast = patch_sweep(m, clean, corr, "attn.hook_z", measure=_logit_diff, layers=[1, 2])
    assert "starts at its layer" in fast.passes and "starts at its layer" in repr(fast)
    np.testing.assert_allclose(fast.per_prompt.numpy(), ref.per_prompt.numpy(), atol=TOL)

    def scale(x, hook):
        return x * 1.0
    with m.hooks(fwd_hooks=[("blocks.0.hook_resid_post", scale)]):
        on = patch_sweep(m, clean, corr, "attn.hook_z", measure=_logit_diff, layers=[1, 2])
    assert "every pass from the embedding (hooks are already on the model" in on.passes
    np.testing.assert_allclose(on.per_prompt.numpy(), ref.per_prompt.numpy(), atol=TOL)
    run = start.FromLayer.run_batch

    def twice(self, view, batch, rows, hooks, **kw):  # a host adding the embedding again
        self._residual = self._residual * 1.5
        return run(self, view, batch, rows, hooks, **kw)
    monkeypatch.setattr(start.FromLayer, "run_batch", twice)
    bad = patch_sweep(m, clean, corr, "attn.hook_z", measure="total_amplification", layers=[0, 1])
    assert "the check failed" in bad.passes
    good = patch_sweep(m, clean, corr, "attn.hook_z", measure="total_amplification", layers=[0, 1],
                       start_at_layer=False)
    np.testing.assert_allclose(bad.per_prompt.numpy(), good.per_prompt.numpy(), atol=TOL)


@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa"])
def test_logit_difference_from_the_final_residual_equals_full_logits(bridge, arch):
    """LogitDifference (final norm + two W_U columns) gives the cells of the same difference of the
    full logits, and of transformer_lens.patching; per-prompt ids and positions of padded prompts."""
    from thermo_lens.experiments.sweeps import LogitDifference

    m = bridge(arch)
    clean, corr = _pairs(n=3, length=5, seed=13)
    ld = LogitDifference(5, 7)
    s = patch_sweep(m, clean, corr, "attn.hook_z", measure=ld, layers=[0, 1])
    ref = patch_sweep(m, clean, corr, "attn.hook_z", measure=_logit_diff, layers=[0, 1])
    np.testing.assert_allclose(s.per_prompt.numpy(), ref.per_prompt.numpy(), atol=TOL)
    np.testing.assert_allclose(s.clean.numpy(), ref.clean.numpy(), atol=TOL)
    assert s.measure == "logit_difference:5-7@-1" and "unembedding" in s.measure_definition
    with torch.inference_mode():
        np.testing.assert_allclose(s.baseline.numpy(), ld(m(corr)).double().numpy(), atol=TOL)
    # one id per prompt, the second position, prompts of different lengths (right-padded)
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[0, 3:] = 0
    per = LogitDifference([1, 2, 3], [9, 8, 7], pos=-2)
    z = ablation_sweep(m, {"input_ids": corr, "attention_mask": mask}, "attn.hook_z", measure=per, layers=[1],
                       heads=[0])
    with torch.inference_mode():
        base = m(corr[1:])[:, -2]
        first = m(corr[:1, :3])[:, -2]

    def zero(x):
        _heads4(x, m.cfg.n_heads)[:, :, 0] = 0.0
    with torch.inference_mode():
        abl = _patched_logits(m, corr[1:], "blocks.1.attn.hook_z", zero)[:, -2]
        abl0 = _patched_logits(m, corr[:1, :3], "blocks.1.attn.hook_z", zero)[:, -2]
    want = torch.cat([abl0[:, 1] - abl0[:, 9] - (first[:, 1] - first[:, 9]),
                      abl[0, 2:3] - abl[0, 8:9] - (base[0, 2:3] - base[0, 8:9]),
                      abl[1, 3:4] - abl[1, 7:8] - (base[1, 3:4] - base[1, 7:8])])
    np.testing.assert_allclose(z.per_prompt[:, 0, 0].numpy(), want.double().numpy(), atol=TOL)
    for bad, words in ((LogitDifference([1, 2], 3), "2 answer ids for 3 prompts"),
                       (LogitDifference(1, 2, pos=9), "beyond prompt 0"),
                       (LogitDifference(10**7, 2), "beyond the vocabulary")):
        with pytest.raises(ThermoLensInputError, match=words):
            patch_sweep(m, clean, corr, "attn.hook_z", measure=bad, layers=[0])
    with pytest.raises(ThermoLensInputError, match="token ids >= 0"):
        LogitDifference([-1], 1)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gemma3", "gpt_oss", "gemma2"])
def test_start_at_layer_keeps_each_blocks_attention_kind(bridge, arch, monkeypatch):
    """Sliding-window and full-attention blocks (config.layer_types, read by loop position): a pass
    that starts at a full-attention block must not give it block 0's sliding window or local
    rotary base. Prompts longer than the window (4); every layer's cells equal full passes; and a
    host that shifted the kinds is caught by the check at that start layer and falls back."""
    import contextlib

    import thermo_lens.experiments.sweeps.start as start

    m = bridge(arch)
    prompts = ["The cat sat on the mat and looked at the dog", "Entropy always increases in a closed system"]
    kw = dict(method="zero", measure="total_amplification")
    fast = ablation_sweep(m, prompts, "attn.hook_z", **kw)
    full = ablation_sweep(m, prompts, "attn.hook_z", start_at_layer=False, **kw)
    if "NotImplementedError" in fast.passes:
        pytest.skip("this TransformerLens' bridge has no start_at_layer (3.x)")
    assert "starts at its layer" in fast.passes
    np.testing.assert_allclose(fast.per_prompt.numpy(), full.per_prompt.numpy(), atol=TOL)

    @contextlib.contextmanager
    def list_only(self, view):  # the layer list cut, the per-layer kinds not: block 1 gets block 0's kind
        parent, attr = view.adapter.hf_layer_list(view.model)
        whole = getattr(parent, attr)
        setattr(parent, attr, torch.nn.ModuleList(list(whole)[self.start_layer:]))
        try:
            yield
        finally:
            setattr(parent, attr, whole)

    monkeypatch.setattr(start.FromLayer, "_only_later_blocks", list_only)
    shifted = ablation_sweep(m, prompts, "attn.hook_z", **kw)
    assert "the check failed" in shifted.passes and "from block 1" in shifted.passes, shifted.passes
    np.testing.assert_allclose(shifted.per_prompt.numpy(), full.per_prompt.numpy(), atol=TOL)


@pytest.mark.slow
def test_start_at_layer_falls_back_when_the_host_pass_fails(bridge):
    """OPT with project_in maps inputs_embeds before its first block: the bridge's start_at_layer
    pass fails with a shape error inside HF; the sweep runs full passes, says why, same cells."""
    m = bridge("opt_postln")
    prompts = ["The cat sat on the mat", "A dog ran in the park today"]
    a = ablation_sweep(m, prompts, "attn.hook_z", measure="last_block_gain")
    b = ablation_sweep(m, prompts, "attn.hook_z", measure="last_block_gain", start_at_layer=False)
    if "starts at its layer" not in a.passes:
        assert "the host's start_at_layer raised" in a.passes, a.passes
    np.testing.assert_allclose(a.per_prompt.numpy(), b.per_prompt.numpy(), atol=TOL)
