"""User hooks are correct by construction: every entry point, batched, equals one prompt at a time.

The randomized test draws prompts of mixed lengths, a random batch size and random patch
positions, then runs every activation-based entry point once on the whole list (batched, with a
:func:`thermo_lens.patch_from` patch, a head ablation and a hook that reads ``hook.ctx["batch"]``)
and once per
prompt (its own one-prompt patch and hook). The numbers must agree. Other tests check a hook
written for ``model.run_with_hooks`` unchanged, the error a hook that cannot be batched gets, and
that the hooks are recorded in every result's repr, frame and JSON.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
import torch

import thermo_lens as tl
from thermo_lens import ModelView
from thermo_lens.core.tokens import BatchInfo
from thermo_lens.core.errors import ThermoLensHookError
from thermo_lens.measures.ablation import head_ablation
from thermo_lens.core.tokens import tokenize, encode

WORDS = ("the cat sat on a mat while water froze and early birds caught worms near the capital of "
         "France where green ideas sleep furiously").split()


def _random_prompts(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) for _ in range(n)]


def _same_length(view, prompt: str, rng: random.Random) -> str:
    """Another prompt with the same token count (pairs whose activations line up position by position)."""
    n = len(encode(view, prompt, True))
    for _ in range(5000):
        cand = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 14)))
        if cand != prompt and len(encode(view, cand, True)) == n:
            return cand
    raise AssertionError("no prompt of the same length found")


class _ScaleByPrompt:
    """A hook that reads hook.ctx: scales each row's real tokens by a per-prompt factor."""

    def __init__(self, factors):
        self.factors = list(factors)

    def __call__(self, x, hook):
        info: BatchInfo = hook.ctx["batch"]
        for b, (i, n) in enumerate(zip(info.prompt_index.tolist(), info.lengths.tolist())):
            x[b, :n] *= self.factors[i]
        return x


def _zero_head_1(z, hook):
    """A zero-ablation (independent of the batch)."""
    z[:, :, 1] = 0.0
    return z


def _entry_points(model, prompts, hooks, batch_size):
    """Every entry point's per-prompt numbers, as a dict of tensors [prompt, ...]."""
    kw = dict(fwd_hooks=hooks, batch_size=batch_size, progress=False)
    out = {
        "residual_gain": tl.residual_gain(model, prompts, **kw).block_gain,
        "sheaf_traces": tl.sheaf_traces(model, prompts, **kw).trace,
        "anisotropy_profile": tl.anisotropy_profile(model, prompts, **kw).values,
    }
    attr = tl.gain_attribution(model, prompts, **kw)
    out["gain_attribution.head"] = attr.head
    out["gain_attribution.total"] = attr.total
    prof = tl.profile(model, prompts, **kw)
    out["profile.gain"] = prof.gain.block_gain
    out["profile.sheaf"] = prof.sheaf.trace
    out["profile.attribution"] = prof.attribution.head
    out["profile.anisotropy"] = prof.anisotropy.values
    abl = head_ablation(model, prompts, 1, heads=[0, 2], fwd_hooks=hooks)
    out["head_ablation"] = abl.block_gain  # [prompt, head], per prompt
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch,seed", [("gpt2", 0), ("llama_gqa", 1), ("neox", 2)])
def test_every_entry_point_batched_equals_one_prompt_at_a_time(bridge, arch, seed):
    model = bridge(arch)
    rng = random.Random(seed)
    P = 5
    corrupted, clean = _random_prompts(rng, P), _random_prompts(rng, P)
    batch_size = rng.randint(2, 4)
    positions = [rng.randint(1, 2), -1]
    point = f"blocks.{rng.randint(0, 1)}.hook_resid_pre"
    factors = [rng.uniform(0.5, 1.5) for _ in range(P)]

    def hooks_for(idx):
        patch = tl.patch_from(model, [clean[i] for i in idx], point, positions=positions)
        scale = _ScaleByPrompt([factors[i] for i in idx])
        return list(patch) + [("blocks.2.hook_resid_pre", scale), ("blocks.1.attn.hook_z", _zero_head_1)]

    batched = _entry_points(model, corrupted, hooks_for(range(P)), batch_size)
    single = [_entry_points(model, [corrupted[i]], hooks_for([i]), 1) for i in range(P)]
    for name, got in batched.items():
        want = torch.cat([s[name] for s in single])
        w = min(got.shape[-1], want.shape[-1]) if got.ndim == 3 and name == "anisotropy_profile" else None
        torch.testing.assert_close(got.double(), want.double(), rtol=2e-4, atol=1e-6, equal_nan=True,
                                   msg=lambda m, name=name, w=w: f"{name}: {m}")
    # ... and the hook changed the numbers (the test would pass trivially if it did nothing).
    clean_run = tl.residual_gain(model, corrupted, batch_size=batch_size, progress=False).block_gain
    assert not torch.allclose(clean_run, batched["residual_gain"])


def test_run_with_hooks_style_patch_works_unchanged_in_one_batch(bridge):
    """A hook written for model.run_with_hooks on the same prompt list (x[:] = clean cache)."""
    model = bridge("gpt2")
    view = ModelView(model)
    clean = ["The capital of France is Paris and", "Water freezes at zero", "the early bird catches the worm"]
    corrupted = [_same_length(view, c, random.Random(k)) for k, c in enumerate(clean)]
    tc, tx = (tokenize(view, p, prepend_bos=True) for p in (clean, corrupted))
    assert torch.equal(tc.lengths, tx.lengths)  # pairwise equal lengths, so the caches line up
    point = "blocks.1.hook_resid_pre"
    _, cache = model.run_with_cache(tc.tokens, attention_mask=tc.mask.long())
    clean_act = cache[point]

    def patch(x, hook):  # exactly what one writes for model.run_with_hooks(corrupted tokens)
        x[:] = clean_act
        return x

    g = tl.residual_gain(model, corrupted, fwd_hooks=[(point, patch)], token_scope="last")
    # reference: run_with_hooks + cache on the same tokens, block gain from the dense activations
    # (clone: the in-place patch also rewrites blocks.0.hook_resid_post, the same tensor, so a
    # run_with_cache cache, which stores views, would show the patched values there)
    c2 = {}
    grab = [(f"blocks.{l}.hook_resid_{w}", lambda x, hook, k=f"blocks.{l}.hook_resid_{w}": c2.__setitem__(k, x.clone()))
            for l in range(view.n_layers) for w in ("pre", "post")]
    model.run_with_hooks(tx.tokens, attention_mask=tx.mask.long(), fwd_hooks=[(point, patch)] + grab)
    last = tx.lengths - 1
    L = view.n_layers
    # x_l is the stream block l reads (blocks.{l}.hook_resid_pre, after the patch), x_L the last
    # block's output: the patch at blocks.1.hook_resid_pre lands in block 0's gain, and block 1 is
    # measured against the input it read.
    states = [c2[f"blocks.{l}.hook_resid_pre"] for l in range(L)] + [c2[f"blocks.{L - 1}.hook_resid_post"]]
    for l in range(L):
        pre = states[l][torch.arange(3), last].double().norm(dim=-1)
        post = states[l + 1][torch.arange(3), last].double().norm(dim=-1)
        torch.testing.assert_close(g.block_gain[:, l].double(), post / pre, rtol=1e-5, atol=0)
    # the gains telescope under the hook: prod_l G_l = ||x_L|| / ||x_0|| (token scope 'last')
    torch.testing.assert_close(g.block_gain.double().prod(1), torch.as_tensor(g.summaries["total_amplification"].values,
                                                                              dtype=torch.float64), rtol=1e-5, atol=0)
    # one prompt at a time with its own clean activation gives the same numbers
    for i in range(3):
        gi = tl.residual_gain(model, [corrupted[i]], token_scope="last",
                              fwd_hooks=tl.patch_from(model, [clean[i]], point))
        torch.testing.assert_close(gi.block_gain[0], g.block_gain[i], rtol=1e-5, atol=0)
    # and the patched block 1 is measured against the input it actually read (the patched one)
    assert torch.allclose(g.norms_in[:, 1], torch.as_tensor(
        [float(clean_act[i, last[i]].norm()) for i in range(3)]), rtol=1e-5)


def test_a_hook_that_cannot_be_batched_gets_a_clear_error(bridge):
    model = bridge("gpt2")
    prompts = ["one two three four five", "six seven", "eight nine ten eleven"]
    full = torch.zeros(3, 9, ModelView(model).d_model)

    def patch(x, hook):
        x[:] = full  # rows of the whole list: fails in a batch of 2
        return x

    with pytest.raises(ThermoLensHookError) as err:
        tl.sheaf_traces(model, prompts, batch_size=2, fwd_hooks=[("blocks.0.hook_resid_pre", patch)], progress=False,
                        sort_by_length=False)
    msg = str(err.value)
    for words in ("patch", "blocks.0.hook_resid_pre", "batch 1/2", "prompts [0, 1]", "lengths",
                  "hook.ctx['batch'].prompt_index", "patch_from", "batch_size=len(prompts)"):
        assert words in msg, words

    def wrong_shape(x, hook):
        return x[:, :1]

    with pytest.raises(ThermoLensHookError, match=r"returned shape .* activation of shape"):
        tl.residual_gain(model, prompts, fwd_hooks=[("blocks.1.hook_resid_pre", wrong_shape)])


def test_sort_by_length_true_with_hooks_is_refused(bridge):
    with pytest.raises(tl.ThermoLensInputError, match="sort_by_length=True"):
        tl.residual_gain(bridge("gpt2"), ["a b", "c"], sort_by_length=True,
                         fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: None)])


def test_hooks_see_the_plan_a_clean_run_uses_and_their_prompts_by_index(bridge):
    """Prompts that fit one batch: one batch in the caller's order (a run_with_hooks-style hook sees
    the same rows). More: length buckets, with or without hooks (the plan never depends on them);
    hook.ctx['batch'].prompt_index names each row's prompt; sort_by_length=False keeps the order."""
    seen = []

    def spy(x, hook):
        seen.append(hook.ctx["batch"].prompt_index.tolist())

    model = bridge("gpt2")
    prompts = ["a much longer prompt than the others here", "b", "c d e", "f g"]
    g = tl.residual_gain(model, prompts, batch_size=2, fwd_hooks=[("blocks.0.hook_resid_pre", spy)])
    clean = tl.residual_gain(model, prompts, batch_size=2)
    assert g.provenance.batch_plan == clean.provenance.batch_plan and len(seen) == len(g.provenance.batch_plan) > 1
    assert [list(b) for b in g.provenance.batch_plan] == seen and sorted(sum(seen, [])) == [0, 1, 2, 3]
    seen.clear()
    tl.residual_gain(model, prompts, batch_size=2, sort_by_length=False, fwd_hooks=[("blocks.0.hook_resid_pre", spy)])
    assert seen == [[0, 1], [2, 3]]
    seen.clear()
    tl.residual_gain(model, prompts, batch_size=4, fwd_hooks=[("blocks.0.hook_resid_pre", spy)])
    assert seen == [[0, 1, 2, 3]]


def test_patch_from_reads_its_clean_run_only_up_to_the_deepest_block_it_patches(bridge):
    """The clean pass of patch_from stops after the deepest block named (later blocks, the final
    norm and the unembedding never run), and keeps exactly run_with_cache's states."""
    model = bridge("gpt2")
    clean = ["the cat sat on the mat", "green ideas"]
    ran: list[int] = []
    handle = model.blocks[-1].register_forward_hook(lambda *a: ran.append(1))
    try:
        patch = tl.patch_from(model, clean, "blocks.0.hook_resid_post")
        assert ran == [], "the clean run went past the block it reads"
        model.run_with_cache(clean[0])
        assert ran, "the forward hook on the last block does not fire: this test would prove nothing"
    finally:
        handle.remove()
    for i, text in enumerate(clean):
        _, cache = model.run_with_cache(text)
        torch.testing.assert_close(patch._clean["blocks.0.hook_resid_post"][i], cache["blocks.0.hook_resid_post"][0],
                                   rtol=0, atol=0)


def test_patch_from_checks_its_inputs(bridge):
    model = bridge("gpt2")
    with pytest.raises(tl.ThermoLensInputError, match="no hook point 'blocks.0.hook_nothing'.*closest: 'blocks.0"):
        tl.patch_from(model, ["a b"], "blocks.0.hook_nothing")
    with pytest.raises(tl.ThermoLensInputError, match="heads"):
        tl.patch_from(model, ["a b"], "blocks.0.attn.hook_z", heads=[9])
    patch = tl.patch_from(model, ["a b c"], "blocks.0.hook_resid_pre")  # every position: equal lengths needed
    with pytest.raises(ThermoLensHookError, match="positions"):
        tl.residual_gain(model, ["a much longer prompt"], fwd_hooks=patch)


def test_patch_by_head_changes_only_that_head(bridge):
    model = bridge("gpt2")
    clean, corr = ["the cat sat on the mat"], ["a dog lay on the rug"]
    point = "blocks.0.attn.hook_z"
    patch = tl.patch_from(model, clean, point, heads=[2], positions=[-1])
    got = {}

    def spy(x, hook):
        got["z"] = x.clone()

    tl.residual_gain(model, corr, fwd_hooks=list(patch) + [(point, spy)])
    view = ModelView(model)
    tc, tx = tokenize(view, clean, prepend_bos=True), tokenize(view, corr, prepend_bos=True)
    _, cc = model.run_with_cache(tc.tokens)
    _, cx = model.run_with_cache(tx.tokens)
    z, zc, zx = got["z"][0], cc[point][0], cx[point][0]
    n, nc = int(tx.lengths[0]), int(tc.lengths[0])
    torch.testing.assert_close(z[n - 1, 2], zc[nc - 1, 2])  # patched: head 2, last token
    torch.testing.assert_close(z[:n - 1], zx[:n - 1])  # other positions untouched
    torch.testing.assert_close(z[n - 1, [0, 1, 3]], zx[n - 1, [0, 1, 3]])  # other heads untouched


# ---------------------------------------------------------------------------- provenance
@pytest.mark.slow
def test_hooks_are_recorded_in_repr_frame_json_and_report(bridge, tmp_path):
    model = bridge("gpt2")
    prompts = ["the cat sat on the mat", "water froze near the capital"]
    patch = tl.patch_from(model, ["green ideas sleep on the mat", "early birds caught worms"],
                          "blocks.1.hook_resid_pre", positions=[-1])

    def ablate_head_1(z, hook):
        z[:, :, 1] = 0.0
        return z

    hooks = list(patch) + [("blocks.0.attn.hook_z", ablate_head_1)]
    results = [tl.residual_gain(model, prompts, fwd_hooks=hooks), tl.sheaf_traces(model, prompts, fwd_hooks=hooks),
               tl.anisotropy_profile(model, prompts, fwd_hooks=hooks), tl.gain_attribution(model, prompts, fwd_hooks=hooks)]
    for r in results:
        rec = r.provenance.hooks
        assert [h.hook_point for h in rec] == ["blocks.1.hook_resid_pre", "blocks.0.attn.hook_z"]
        assert rec[1].function.endswith("ablate_head_1") and "patch_from 2 clean prompt(s)" in rec[0].source
        assert "ablate_head_1" in repr(r) and "patch_from" in repr(r)
        assert "ablate_head_1" in r.to_frame()["hooks"].iloc[0]
        back = type(r).from_json(r.to_json())
        assert back.provenance.hooks == rec
    clean = tl.residual_gain(model, prompts)
    assert clean.hooks == () and "none (clean run)" in repr(clean)
    prof = tl.profile(model, prompts, fwd_hooks=hooks, name="ablated")
    assert "ablate_head_1" in prof.meta["hooks"] and "ablate_head_1" in repr(prof)
    text = tl.write_report({"ablated": prof}, tmp_path / "r.html", panel=None).read_text(encoding="utf-8")
    assert "ablate_head_1" in text and "user hooks" in text
    assert "head_term" in text  # the attribution heatmap beside the spectral ones


def test_results_stored_before_provenance_still_load(bridge):
    g = tl.residual_gain(bridge("gpt2"), ["the cat sat", "on the mat"])
    data = __import__("json").loads(g.to_json())
    fields = data["fields"]
    prov = fields.pop("provenance")["fields"]
    model = prov["model"]
    fields.update(prompts=prov["prompts"], lengths=prov["lengths"], truncated=prov["truncated"],
                  prepend_bos=prov["prepend_bos"], model=model, dtype="float32", weights="raw", post_ln=False)
    fields.pop("norms_in")
    old = tl.gain.GainResult.from_json(__import__("json").dumps(data))
    assert old.prompts == g.prompts and torch.equal(old.lengths, g.lengths) and old.hooks == ()
    torch.testing.assert_close(old.block_gain, g.block_gain)


def test_frames_merge_on_layer_and_head(bridge):
    """gain, spectral, sheaf and attribution frames all number blocks 0..L-1 (blocks.{layer})."""
    model = bridge("llama_gqa")
    prompts = ["the cat sat on the mat", "water froze near the capital of France"]
    prof = tl.profile(model, prompts)
    L, H = prof.spectral.n_layers, prof.spectral.n_heads
    gain = prof.gain.to_frame()
    spec = prof.spectral.to_frame()
    sheaf = prof.sheaf.to_frame()
    attr = prof.attribution.to_frame()
    for df in (gain, spec, sheaf, attr):
        assert sorted(df["layer"].unique()) == list(range(L))
    # block `layer`'s gain comes from blocks.{layer}.hook_resid_pre -> hook_resid_post
    per_layer = gain.groupby("layer")["block_gain"].mean()
    m = per_layer.rename("gain").reset_index().merge(spec[["layer", "head", "W_V_norm"]], on="layer")
    assert len(m) == L * H
    np.testing.assert_allclose(m.groupby("layer")["gain"].first().to_numpy(),
                               prof.gain.block_gain.double().mean(0).numpy(), rtol=1e-6)
    h = (attr.groupby(["layer", "head"])["head_term"].mean().reset_index()
         .merge(sheaf.groupby(["layer", "head"])["trace"].mean().reset_index(), on=["layer", "head"])
         .merge(spec[["layer", "head", "ov_norm"]], on=["layer", "head"]))
    assert len(h) == L * H
    np.testing.assert_allclose(h["head_term"].to_numpy(), prof.attribution.mean_head.numpy().ravel(), rtol=1e-9)
    # norm_in / norm_out are the block's input and output: norm_out of layer l = norm_in of layer l + 1
    g = prof.gain
    np.testing.assert_allclose(gain.query("layer == 1")["norm_in"].to_numpy(),
                               gain.query("layer == 0")["norm_out"].to_numpy(), rtol=1e-6)
    assert g.token_scope == "all_but_first"
    # with a per-token mean scope, block_gain is the mean of ratios, not norm_out / norm_in
    assert not np.allclose(gain["block_gain"], gain["norm_out"] / gain["norm_in"], rtol=1e-7)
    last = tl.residual_gain(model, prompts, token_scope="last").to_frame()
    np.testing.assert_allclose(last["block_gain"], last["norm_out"] / last["norm_in"], rtol=1e-5)
    assert isinstance(gain, pd.DataFrame)


def test_no_stale_batch_context_after_a_run(bridge):
    """hook.ctx persists in TransformerLens; a patch used outside thermo-lens must not read an old batch."""
    model = bridge("gpt2")
    patch = tl.patch_from(model, ["the cat sat"], "blocks.0.hook_resid_pre", positions=[-1])
    tl.residual_gain(model, ["a dog lay"], fwd_hooks=patch)
    assert "batch" not in model.hook_dict["blocks.0.hook_resid_pre"].ctx
    assert "Patch(" in repr(patch) and "tensor" not in repr(patch)
    with pytest.raises(ThermoLensHookError, match="outside a thermo-lens run"):
        model.run_with_hooks(model.to_tokens("a dog lay"), fwd_hooks=list(patch))


def test_sae_like_hook_objects_record_their_source(bridge):
    """A hook that is a method of an SAE-like object (a ``cfg`` with release / sae_id / hook_name,
    as SAELens' SAE has) records where its reconstruction comes from."""
    from types import SimpleNamespace

    class TinySAE:
        def __init__(self):
            self.cfg = SimpleNamespace(release="my-release", sae_id="blocks.0.hook_resid_pre", d_sae=64,
                                       hook_name="blocks.0.hook_resid_pre")

        def splice(self, x, hook):
            return x  # stands in for decode(encode(x))

    sae = TinySAE()
    g = tl.residual_gain(bridge("gpt2"), ["the cat sat"], fwd_hooks=[("blocks.0.hook_resid_pre", sae.splice)])
    (rec,) = g.hooks
    assert rec.function.endswith("TinySAE.splice")
    assert "release=my-release" in rec.source and "sae_id=blocks.0.hook_resid_pre" in rec.source

    def custom(x, hook):
        return x
    custom.thermo_lens_source = "mean ablation over the paper25 prompts"
    g2 = tl.residual_gain(bridge("gpt2"), ["the cat sat"], fwd_hooks=[("blocks.0.hook_resid_pre", custom)])
    assert g2.hooks[0].source == "mean ablation over the paper25 prompts"
