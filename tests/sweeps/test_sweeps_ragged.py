"""Sweeps on prompts of different token lengths, and the sweep's NaN, option and host checks.

The reference for every ragged cell is each prompt run alone (one prompt, no padding) through
``model.run_with_hooks`` with a hand-written hook, and its logit difference read from the full
logits: independent of the sweep's alignment, stacking and padding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import thermo_lens as tl
from thermo_lens import ThermoLensInputError
from thermo_lens.core.errors import ThermoLensNumericsError, ThermoLensWarning
from thermo_lens.experiments.sweeps import LogitDifference, SweepResult, ablation_sweep, patch_sweep

TOL = 1e-5
A, B = 5, 7  # the logit difference's token ids
CLEAN = ["When John and Mary went to the store, John gave a drink to",
         "When Tom and Sue went to the park, Tom gave a ball to",
         "After Anna and Bob met at the cafe, Anna handed a cup to"]
CORRUPTED = ["When Alice and Bob went to the store, Alice gave a drink to",
             "When Alexander and Jo went to the park, Alexander gave a ball to",
             "After Kim and Lee met at the cafe, Kim handed a cup to"]


@pytest.fixture(scope="module")
def zoo_model():
    return tl.zoo.load("gpt2-tiny-wd")


def _tokens(m, text: str) -> torch.Tensor:
    return m.to_tokens(text)  # [1, n]: the host's BOS, as the sweep's prepend_bos="host"


def _ld_alone(m, text: str, hooks=()) -> float:
    """The logit difference at the last token of ``text`` run alone under ``hooks``."""
    with torch.inference_mode():
        logits = m.run_with_hooks(_tokens(m, text), fwd_hooks=list(hooks))
    return float(logits[0, -1, A] - logits[0, -1, B])


def _act_alone(m, text: str, name: str) -> torch.Tensor:
    with torch.inference_mode():
        _, cache = m.run_with_cache(_tokens(m, text), names_filter=lambda n: n == name)
    return cache[name][0].clone()


def _heads4(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], n, -1) if x.ndim == 3 else x


def test_zoo_prompts_are_ragged(zoo_model):
    lengths = [_tokens(zoo_model, t).shape[1] for t in CLEAN + CORRUPTED]
    assert len(set(lengths)) > 3, lengths  # the near character-level tokenizer: every pair differs
    assert all(_tokens(zoo_model, c).shape[1] != _tokens(zoo_model, d).shape[1] for c, d in zip(CLEAN, CORRUPTED))


@pytest.mark.slow
def test_patch_from_each_prompts_end_equals_each_pair_alone(zoo_model):
    """Position -1 (and -3) of the clean prompt into position -1 (-3) of the corrupted prompt,
    each at its own length; position 2 from each prompt's start."""
    m = zoo_model
    H = m.cfg.n_heads
    s = patch_sweep(m, CLEAN, CORRUPTED, "attn.hook_z", over=("head", "pos"), positions=[-1, 2, -3],
                    measure=LogitDifference(A, B), layers=[1, 3])
    assert tuple(s.per_prompt.shape) == (3, 2, H, 3) and s.positions == (-1, 2, -3)
    assert "own end" in s.alignment and "from its start" in s.alignment
    for i, (c, d) in enumerate(zip(CLEAN, CORRUPTED)):
        base = _ld_alone(m, d)
        assert s.baseline[i].item() == pytest.approx(base, abs=TOL)
        assert s.clean[i].item() == pytest.approx(_ld_alone(m, c), abs=TOL)
        for li, layer in enumerate((1, 3)):
            name = f"blocks.{layer}.attn.hook_z"
            src = _heads4(_act_alone(m, c, name)[None], H)[0]  # [n_clean, head, d_head]
            nc, nd = src.shape[0], _tokens(m, d).shape[1]
            for k, (qc, qd) in enumerate(((nc - 1, nd - 1), (2, 2), (nc - 3, nd - 3))):
                for h in ((0,) if layer == 1 else (H - 1,)):
                    def hook(z, hook=None, h=h, qc=qc, qd=qd, src=src):
                        _heads4(z, H)[0, qd, h] = src[qc, h]
                        return z
                    want = _ld_alone(m, d, [(name, hook)]) - base
                    assert s.per_prompt[i, li, h, k].item() == pytest.approx(want, abs=TOL), (i, layer, h, k)
    # every position of a ragged pair cannot align; a square hook's keys cannot either
    with pytest.raises(ThermoLensInputError, match="positions="):
        patch_sweep(m, CLEAN, CORRUPTED, "attn.hook_z")
    with pytest.raises(ThermoLensInputError, match="keys of the two prompts cannot align"):
        patch_sweep(m, CLEAN, CORRUPTED, "hook_pattern", positions=[-1])
    with pytest.raises(ThermoLensInputError, match="over='pos' without positions="):
        ablation_sweep(m, CORRUPTED, "hook_resid_pre", over="pos")


def test_mean_ablation_averages_each_aligned_position_over_the_prompts_that_have_it(zoo_model):
    m = zoo_model
    prompts = CORRUPTED
    refs = CLEAN + ["The cat sat."]  # a short reference prompt lacks most positions
    name = "blocks.2.hook_resid_pre"
    a = ablation_sweep(m, prompts, "hook_resid_pre", over="pos", method="mean", reference=refs, layers=[2],
                       positions=[-1, 20], measure=LogitDifference(A, B))
    acts = [_act_alone(m, r, name) for r in refs]
    means = {-1: torch.stack([x[-1] for x in acts]).double().mean(0),
             20: torch.stack([x[20] for x in acts if x.shape[0] > 20]).double().mean(0)}
    assert sum(x.shape[0] > 20 for x in acts) == 3  # the short one is left out at position 20
    assert "at least 3 of 4" in a.reference and "aligned" in a.reference
    for i, d in enumerate(prompts):
        n = _tokens(m, d).shape[1]
        base = _ld_alone(m, d)
        for k, (q, at) in enumerate(((-1, n - 1), (20, 20))):
            def hook(x, hook=None, q=q, at=at):
                x[0, at] = means[q].to(x.dtype)
                return x
            want = _ld_alone(m, d, [(name, hook)]) - base
            assert a.per_prompt[i, 0, k].item() == pytest.approx(want, abs=TOL), (i, q)
    # every token (positions=None), aligned from each prompt's start: token t takes the mean of the
    # prompts (here: themselves) with a token t
    z = ablation_sweep(m, prompts, "attn.hook_z", method="mean", layers=[1], heads=[2], measure=LogitDifference(A, B))
    zname = "blocks.1.attn.hook_z"
    H = m.cfg.n_heads
    own = [_heads4(_act_alone(m, p, zname)[None], H)[0] for p in prompts]
    longest = max(x.shape[0] for x in own)
    mean_t = [torch.stack([x[t] for x in own if x.shape[0] > t]).double().mean(0) for t in range(longest)]
    for i, d in enumerate(prompts):
        n = own[i].shape[0]

        def hook(x, hook=None, n=n):
            _heads4(x, H)[0, :, 2] = torch.stack([mean_t[t][2] for t in range(n)]).to(x.dtype)
            return x
        want = _ld_alone(m, d, [(zname, hook)]) - _ld_alone(m, d)
        assert z.per_prompt[i, 0, 0].item() == pytest.approx(want, abs=TOL), i
    assert "aligned from its start" in z.alignment
    with pytest.raises(ThermoLensInputError, match="no reference prompt has position 20"):
        ablation_sweep(m, prompts, "hook_resid_pre", over="pos", method="mean", reference=["The cat sat.", "A dog."],
                       positions=[20], measure=LogitDifference(A, B), layers=[0])


def test_resample_takes_the_source_prompts_aligned_positions(zoo_model):
    m = zoo_model
    name = "blocks.1.hook_resid_pre"
    r = ablation_sweep(m, CORRUPTED, "hook_resid_pre", over="pos", method="resample", positions=[-1, -4],
                       layers=[1], seed=5, measure=LogitDifference(A, B))
    src = [int(v) for v in r.reference.split("source=[")[1].rstrip("]").split(",")]
    assert all(j != p for p, j in enumerate(src))
    for p, d in enumerate(CORRUPTED):
        other = _act_alone(m, CORRUPTED[src[p]], name)
        n = _tokens(m, d).shape[1]
        for k, q in enumerate((-1, -4)):
            def hook(x, hook=None, q=q, n=n, other=other):
                x[0, n + q] = other[other.shape[0] + q]
                return x
            want = _ld_alone(m, d, [(name, hook)]) - _ld_alone(m, d)
            assert r.per_prompt[p, 0, k].item() == pytest.approx(want, abs=TOL)


def test_zeroed_attention_scores_of_ragged_prompts_equal_each_prompt_alone(zoo_model):
    """A zeroed score row covers the prompt's own keys: a shorter prompt in a padded batch must not
    attend to its padding (which a zero over every key of the padded row would let it do)."""
    m = zoo_model
    z = ablation_sweep(m, CORRUPTED, "attn.hook_attn_scores", method="zero", layers=[0, 2], heads=[1],
                       measure=LogitDifference(A, B))
    q = ablation_sweep(m, CORRUPTED, "attn.hook_attn_scores", over=("head", "pos"), method="zero", layers=[2],
                       heads=[3], positions=[-1], measure=LogitDifference(A, B))
    for i, d in enumerate(CORRUPTED):
        base = _ld_alone(m, d)
        for li, layer in enumerate((0, 2)):
            def every_row(x, hook=None):
                x[:, 1] = 0.0
                return x
            want = _ld_alone(m, d, [(f"blocks.{layer}.attn.hook_attn_scores", every_row)]) - base
            assert z.per_prompt[i, li, 0].item() == pytest.approx(want, abs=TOL), (i, layer)

        def last_row(x, hook=None):
            x[:, 3, -1, :] = 0.0
            return x
        want = _ld_alone(m, d, [("blocks.2.attn.hook_attn_scores", last_row)]) - base
        assert q.per_prompt[i, 0, 0, 0].item() == pytest.approx(want, abs=TOL), i


def test_equal_length_cells_are_unchanged_and_equal_single_runs(bridge):
    """Prompts of one length: the positions and sources are the ones they always were."""
    m = bridge("gpt2")
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(1, 250, (4, 6), generator=g)
    refs = torch.randint(1, 250, (3, 6), generator=g)
    a = ablation_sweep(m, prompts, "attn.hook_z", method="mean", reference=refs, measure="last_block_gain",
                       layers=[1], positions=[0, -1])
    _, cache = m.run_with_cache(refs)
    mean = _heads4(cache["blocks.1.attn.hook_z"], 4).mean(0)  # [pos, head, d_head]
    g0 = tl.residual_gain(m, prompts)
    for h in range(4):
        def hook(z, hook=None, h=h):
            _heads4(z, 4)[:, [0, 5], h] = mean[[0, 5], h]
            return z
        g1 = tl.residual_gain(m, prompts, fwd_hooks=[("blocks.1.attn.hook_z", hook)])
        want = g1.block_gain[:, -1].double() - g0.block_gain[:, -1].double()
        np.testing.assert_allclose(a.per_prompt[:, 0, h].numpy(), want.numpy(), atol=TOL)
    assert a.alignment.startswith("every prompt has 6 tokens")


@pytest.mark.slow
def test_zero_ablated_residual_gives_named_nan_cells_not_an_error(zoo_model):
    """Zeroing the last block's hook_resid_pre at the last token makes the norm of its input zero
    there: the last block's gain of that cell is undefined. The sweep keeps it NaN, names the cell, and the other cells are numbers."""
    m = zoo_model
    with pytest.warns(ThermoLensWarning, match=r"layer 3, pos -1: prompts \[0, 1, 2\]"):
        s = ablation_sweep(m, CORRUPTED, "hook_resid_pre", over="pos", positions=[-1, 0], method="zero",
                           measure="last_block_gain")
    per = s.per_prompt.numpy()
    assert np.isnan(per[:, 3, 0]).all() and np.isfinite(per[:, :3]).all() and np.isfinite(per[:, 3, 1]).all()
    assert np.isnan(s.effect[3, 0].item()) and np.isnan(s.pvalue_adjusted[3, 0].item())
    assert any("layer 3, pos -1" in n for n in s.notes) and "note:" in repr(s)
    assert "Holm over the 7 cells with a p-value (1 of 8" in repr(s)
    back = SweepResult.from_json(s.to_json())
    assert back.notes == s.notes and back.alignment == s.alignment and torch.isnan(back.per_prompt[:, 3, 0]).all()
    # the finite cells equal their own runs: the last block's gain by hand, mean over tokens 1.. of
    # ||x_L|| / ||x_{L-1}|| (residual_gain itself refuses the run: block 1's own gain is undefined)
    def last_gain(text, hooks=()):
        with torch.inference_mode(), m.hooks(fwd_hooks=list(hooks)):
            _, cache = m.run_with_cache(_tokens(m, text))
        a, b = cache["blocks.3.hook_resid_pre"][0].double(), cache["blocks.3.hook_resid_post"][0].double()
        return float((b.norm(dim=-1) / a.norm(dim=-1))[1:].mean())

    for i, d in enumerate(CORRUPTED):
        def hook(x, hook=None):
            x[0, -1] = 0.0
            return x
        want = last_gain(d, [("blocks.1.hook_resid_pre", hook)]) - last_gain(d)
        assert per[i, 1, 0] == pytest.approx(want, abs=TOL)
        assert s.baseline[i].item() == pytest.approx(last_gain(d), abs=TOL)


def test_swapped_pairs_give_nan_fraction_with_a_note(bridge):
    m = bridge("gpt2")
    g = torch.Generator().manual_seed(4)
    a, b = torch.randint(1, 250, (2, 5), generator=g)
    with pytest.warns(ThermoLensWarning, match="no difference to restore"):
        s = patch_sweep(m, torch.stack([a, b]), torch.stack([b, a]), "attn.hook_z", measure="last_block_gain",
                        layers=[1])
    assert torch.isnan(s.fraction).all() and torch.isnan(s.fraction_low).all()
    assert torch.isfinite(s.effect).all()
    assert not np.isinf(s.to_frame()["fraction_restored"].to_numpy()).any()
    assert any("fraction restored is NaN" in n for n in s.notes)


def test_options_are_checked_before_anything_runs(bridge):
    m = bridge("gpt2")
    g = torch.Generator().manual_seed(5)
    clean, corr = torch.randint(1, 250, (2, 5), generator=g), torch.randint(1, 250, (2, 5), generator=g)
    cases = [
        (dict(batch_size="abc"), "batch_size must be a positive integer"),
        (dict(batch_size=float("nan")), "batch_size must be a positive integer"),
        (dict(batch_size=None), "batch_size must be a positive integer"),
        (dict(settings={"batch_size": 0}), "batch_size must be a positive integer"),
        (dict(settings={"bogus": 1}), "unknown option"),
        (dict(settings=5), "settings must be a thermo_lens.RunSettings"),
        (dict(level=float("nan")), "level must be a confidence level"),
        (dict(level=None), "level must be a confidence level"),
        (dict(start_at_layer="yes"), "start_at_layer must be True or False"),
        (dict(positions="-1"), "positions must be an int or a list of ints"),
        (dict(measure=lambda logits: "big"), "one real number per prompt"),
        (dict(measure=lambda logits: ["a", "b"]), "one real number per prompt"),
        (dict(measure=lambda logits: None), "one real number per prompt"),
    ]
    for kw, words in cases:
        with pytest.raises(ThermoLensInputError, match=words):
            patch_sweep(m, clean, corr, "attn.hook_z", layers=[0], **kw)
    for kw, words in ((dict(seed=-1), "seed must be an int >= 0"), (dict(seed=1.5), "seed must be an int"),
                      (dict(method=None), "unknown method"), (dict(batch_size="abc"), "batch_size")):
        with pytest.raises(ThermoLensInputError, match=words):
            ablation_sweep(m, corr, "attn.hook_z", layers=[0], **{"method": "resample", **kw})
    # a measure that is not a number for the prompts themselves is an error naming them, never a cell
    with pytest.raises(ThermoLensNumericsError, match=r"not a finite number for prompt\(s\) \[0, 1\]"):
        patch_sweep(m, clean, corr, "attn.hook_z", layers=[0], measure=lambda lg: lg[:, -1, 5] * float("nan"))
    # a mapping of settings works as the object would
    s = patch_sweep(m, clean, corr, "attn.hook_z", layers=[0], settings={"batch_size": 4}, measure="last_block_gain")
    t = patch_sweep(m, clean, corr, "attn.hook_z", layers=[0], batch_size=4, measure="last_block_gain")
    assert torch.equal(s.per_prompt, t.per_prompt)


@pytest.mark.parametrize("hook", ["attn.hook_v", "attn.hook_k"])
def test_key_value_hooks_sweep_their_kv_heads(bridge, hook):
    m = bridge("llama_gqa")
    n_kv = m.cfg.n_key_value_heads
    assert n_kv < m.cfg.n_heads
    g = torch.Generator().manual_seed(6)
    prompts = torch.randint(1, 250, (3, 5), generator=g)
    z = ablation_sweep(m, prompts, hook, method="zero", layers=[1], measure="last_block_gain")
    assert tuple(z.per_prompt.shape) == (3, 1, n_kv) and z.head_kind == "kv_head"
    assert list(z.to_frame()["kv_head"]) == list(range(n_kv))
    assert SweepResult.from_json(z.to_json()).head_kind == "kv_head"
    g0 = tl.residual_gain(m, prompts)
    for h in range(n_kv):
        def hook_fn(x, hook=None, h=h):
            x[:, :, h] = 0.0
            return x
        g1 = tl.residual_gain(m, prompts, fwd_hooks=[(f"blocks.1.{hook}", hook_fn)])
        want = g1.block_gain[:, -1].double() - g0.block_gain[:, -1].double()
        np.testing.assert_allclose(z.per_prompt[:, 0, h].numpy(), want.numpy(), atol=TOL)
    with pytest.raises(ThermoLensInputError, match="heads must be ints in 0..1"):
        ablation_sweep(m, prompts, hook, heads=[3], layers=[1])


@pytest.mark.slow
def test_plot_pos_is_a_swept_position_and_holm_counts_its_family(bridge):
    m = bridge("gpt2")
    g = torch.Generator().manual_seed(7)
    clean, corr = torch.randint(1, 250, (3, 5), generator=g), torch.randint(1, 250, (3, 5), generator=g)
    s = patch_sweep(m, clean, corr, "attn.hook_z", over=("head", "pos"), positions=[-1, 0, 2],
                    measure="last_block_gain", layers=[1])
    for pos, k in ((-1, 0), (0, 1), (2, 2), (4, 0)):  # 4 is the last token of these 5-token prompts
        heat = next(t for t in s.plot(pos=pos).data if t.type == "heatmap")
        np.testing.assert_allclose(np.asarray(heat.z, dtype=float), s.effect[:, :, k].numpy())
    from thermo_lens.views import ThermoLensViewError
    with pytest.raises(ThermoLensViewError, match="position 3 was not swept"):
        s.plot(pos=3)
    # cells after the block the measure reads have effect 0 exactly: no p, left out of Holm
    b = patch_sweep(m, clean, corr, "attn.hook_z", measure="block_gain:0", layers=[0, 1, 2])
    finite = np.isfinite(b.pvalue.numpy())
    assert finite.sum() == 4 and b.n_tested == 4
    np.testing.assert_allclose(b.pvalue_adjusted.numpy()[finite], tl.stats.holm(b.pvalue.numpy()[finite]))
    assert "Holm over the 4 cells with a p-value (8 of 12" in repr(b)
    assert b.to_frame()["holm_family"].iloc[0] == 4
    heat = next(t for t in b.plot().data if t.type == "heatmap")
    assert "over the 4 cells with a p-value" in heat.meta["definition"]


def test_prompt_frame_has_an_integer_prompt_and_its_text(zoo_model):
    m = zoo_model
    s = patch_sweep(m, CLEAN, CORRUPTED, "attn.hook_z", positions=[-1], measure=LogitDifference(A, B), layers=[0])
    df = s.prompt_frame()
    H = m.cfg.n_heads
    assert len(df) == 3 * H and df["prompt"].dtype.kind == "i" and list(df["prompt"][:H]) == [0] * H
    assert list(df["text"].unique()) == CORRUPTED
    np.testing.assert_allclose(df["effect"].to_numpy(), s.per_prompt.numpy().reshape(-1))
    g = tl.residual_gain(m, CORRUPTED).prompt_frame()
    assert set(("prompt", "text", "n_tokens")) <= set(g.columns) & set(df.columns)  # as the gain's frame
    assert list(df["n_tokens"][::H]) == list(g["n_tokens"])


def test_start_at_layer_is_found_through_a_forward_that_passes_keywords_on():
    """SAELens' HookedSAETransformer.forward(input, **kwargs) hands start_at_layer to
    HookedTransformer.forward; a forward without **kwargs or the name does not take it."""
    from thermo_lens.experiments.sweeps.start import _takes_start

    class Host(torch.nn.Module):
        def forward(self, input, return_type="logits", start_at_layer=None):
            return input

    class PassesOn(Host):
        def forward(self, input, **kwargs):
            return super().forward(input, **kwargs)

    class Stops(Host):
        def forward(self, input, return_type="logits"):
            return input

    class Bare(torch.nn.Module):
        def forward(self, input, **kwargs):
            return input
    assert _takes_start(Host()) and _takes_start(PassesOn())
    assert not _takes_start(Stops()) and not _takes_start(Bare())


def test_hooked_sae_transformer_sweeps_start_at_their_layer():
    """On the TransformerLens 3 + SAELens leg: no SAE attached, passes start at the cell's layer."""
    sae_lens = pytest.importorskip("sae_lens")
    HookedTransformerConfig = pytest.importorskip("transformer_lens").HookedTransformerConfig
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(n_layers=3, d_model=32, n_ctx=16, d_head=8, n_heads=4, d_vocab=50, act_fn="gelu",
                                  normalization_type="LN")
    m = sae_lens.HookedSAETransformer(cfg)
    g = torch.Generator().manual_seed(8)
    clean, corr = torch.randint(1, 50, (2, 6), generator=g), torch.randint(1, 50, (2, 6), generator=g)
    fast = patch_sweep(m, clean, corr, "attn.hook_z", measure="last_block_gain")
    full = patch_sweep(m, clean, corr, "attn.hook_z", measure="last_block_gain", start_at_layer=False)
    assert "starts at its layer" in fast.passes, fast.passes
    np.testing.assert_allclose(fast.per_prompt.numpy(), full.per_prompt.numpy(), atol=TOL)
