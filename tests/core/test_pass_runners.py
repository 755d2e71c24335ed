"""The pass engine's runners and compositions against independent computations.

* :class:`~thermo_lens.core.passes.from_layer.FromLayer`: a pass that starts at block ``l`` from the
  residual ``x_l`` of ``run_with_cache`` gives the residual norms of ``x_l .. x_L`` of the cache
  (and of a full pass), and never runs the earlier blocks.
* :func:`~thermo_lens.core.passes.stacked.run_stacked`: each copy's rows equal the same prompts run alone
  under the copy's condition as a plain ``fwd_hooks`` hook.
* :func:`~thermo_lens.core.passes.capture.capture`: per prompt, the real tokens of ``run_with_cache``.
* ``patch_from`` takes the run settings: batched clean runs equal one prompt per pass (float
  rounding), and the clean run's own ``fwd_hooks`` run and are recorded.
* ``cache=`` is documented once: every public entry point with the parameter carries the fragment.
"""

from __future__ import annotations

import inspect
from importlib.metadata import version

import pytest
import torch

import thermo_lens as tl
from test_hosts import host_model  # noqa: F401  (the session fixture)
from thermo_lens.measures.gain import residual_norms
from thermo_lens.core.model import ModelView
from thermo_lens.core.passes import collect
from thermo_lens.core.passes.cached import CACHE_DOC, documents_cache
from thermo_lens.core.passes.capture import capture
from thermo_lens.core.passes.from_layer import FromLayer, start_support
from thermo_lens.core.passes.stacked import StackedRows, run_stacked
from thermo_lens.core.settings import RunSettings
from thermo_lens.core.tokens import tokenize

PROMPTS = ["The capital of France is Paris", "Water", "the early bird catches the worm, and the cat"]


@pytest.mark.parametrize("host", ["HookedTransformer", "TransformerBridge"])
@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa"])
def test_from_layer_runner_equals_the_cache_from_its_layer_on(host_model, host, arch):  # noqa: F811
    m = host_model(host, arch)
    if host == "TransformerBridge" and int(version("transformer_lens").split(".")[0]) < 4:
        pytest.skip("TransformerLens 3's bridge refuses start_at_layer (the sweeps fall back to full passes)")
    view = ModelView(m)
    assert start_support(view, ()) is None
    batch = tokenize(view, PROMPTS, prepend_bos=True)
    names = view.resid_hook_names
    _, cache = m.run_with_cache(batch.tokens, attention_mask=batch.mask.long(), names_filter=lambda n: n in names)
    start = 1
    ran: list[int] = []
    handle = m.blocks[0].register_forward_hook(lambda *a: ran.append(1))

    def later_norms(view_, rec):  # the states a pass from block `start` computes
        for l in range(start, view.n_layers + 1):
            rec.add(names[l], ("norm", l), lambda x, batch: x.double().norm(dim=-1))
    try:
        got = collect(view, PROMPTS, [later_norms], prepend_bos=True, batch_size=2, progress=False,
                      runner=FromLayer(view, start, cache[names[start]]))
    finally:
        handle.remove()
    assert ran == [], "a pass from block 1 ran block 0"
    norms = got.stack("norm")  # [state, prompt, pos]: x_start .. x_L
    for p in range(len(PROMPTS)):
        n = int(batch.lengths[p])
        for l in range(start, view.n_layers + 1):
            want = cache[names[l]][p, :n].double().norm(dim=-1)
            torch.testing.assert_close(norms[l - start, p, :n].double(), want, rtol=1e-5, atol=1e-5)


def test_run_stacked_copies_equal_each_condition_alone(bridge):
    m = bridge("gpt2")
    view = ModelView(m)
    ps = tl.inputs.as_prompts(PROMPTS)
    H = view.n_heads
    point = "blocks.1.attn.hook_z"

    def zero_head(head):  # the condition of copy head+1, as a plain hook
        def hook(z, hook=None):
            z.view(z.shape[0], z.shape[1], H, -1)[:, :, head] = 0.0
            return z
        return hook

    def edit(x, rows: StackedRows):
        z4 = x.view(x.shape[0], x.shape[1], H, -1)
        for b, c in enumerate(rows.copy):
            if c > 0:
                z4[b, :, c - 1] = 0.0

    got = run_stacked(view, ps, 1 + H, [(point, edit)], [residual_norms], RunSettings(prepend_bos=True), 2 * len(PROMPTS))
    assert len(got.batch_plan) == (1 + H + 1) // 2  # two whole copies per pass
    norms = got.stack("resid_norm")  # [L+1, copy * prompt, pos]
    P = len(PROMPTS)
    for c in range(1 + H):
        hooks = [] if c == 0 else [(point, zero_head(c - 1))]
        alone = collect(view, PROMPTS, [residual_norms], prepend_bos=True, fwd_hooks=hooks,
                        batch_size=1, progress=False).stack("resid_norm")
        w = alone.shape[-1]
        torch.testing.assert_close(norms[:, c * P:(c + 1) * P, :w], alone, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("point", ["blocks.0.attn.hook_z", "blocks.1.hook_resid_pre", "blocks.0.attn.hook_pattern"])
def test_capture_keeps_each_prompts_real_tokens_of_run_with_cache(bridge, point):
    m = bridge("gpt2")
    view = ModelView(m)
    square = point.endswith("hook_pattern")
    kept, got = capture(view, PROMPTS, [point], RunSettings(prepend_bos=True, batch_size=2),
                        position_dims=lambda name: (2, 3) if square else (1,))
    for p, text in enumerate(PROMPTS):
        _, cache = m.run_with_cache(text, prepend_bos=True)
        want = cache[point][0]
        assert kept[point][p].shape == want.shape
        torch.testing.assert_close(kept[point][p], want, rtol=1e-5, atol=1e-5)
    assert got.provenance().batch_plan  # the clean run is a pass like any other: provenance recorded


def test_patch_from_takes_the_run_settings(bridge):
    m = bridge("gpt2")
    clean = ["the cat sat on the mat", "green ideas sleep", "early birds caught worms today"]
    one = tl.patch_from(m, clean, "blocks.1.hook_resid_pre", positions=[-1])
    batched = tl.patch_from(m, clean, "blocks.1.hook_resid_pre", positions=[-1], batch_size=3)
    for a, b in zip(one._clean["blocks.1.hook_resid_pre"], batched._clean["blocks.1.hook_resid_pre"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert one.prepend_bos == batched.prepend_bos

    def double(x, hook=None):
        return x * 2.0
    hooked = tl.patch_from(m, clean, "blocks.1.hook_resid_pre", positions=[-1],
                           fwd_hooks=[("blocks.1.hook_resid_pre", double)])
    for a, b in zip(one._clean["blocks.1.hook_resid_pre"], hooked._clean["blocks.1.hook_resid_pre"]):
        torch.testing.assert_close(b, 2.0 * a, rtol=1e-5, atol=1e-5)
    assert "clean run under fwd_hooks" in hooked.description and "double" in hooked.description
    with pytest.raises(tl.errors.ThermoLensInputError):
        tl.patch_from(m, clean, "blocks.1.hook_resid_pre", fwd_hooks=[("blocks.1.hook_nothing", double)])


def test_the_cache_argument_is_documented_once():
    with_cache = [f for f in (getattr(tl, n) for n in tl.__all__)
                  if callable(f) and "cache" in getattr(inspect.signature(f), "parameters", {})
                  and inspect.signature(f).parameters["cache"].default is None]
    assert len(with_cache) >= 6, [f.__name__ for f in with_cache]
    words = CACHE_DOC.split()
    for f in with_cache:
        flat = " ".join((f.__doc__ or "").split())
        assert " ".join(words) in flat, f.__name__

    def bare(cache=None):
        """No cache line."""
    with pytest.raises(AssertionError, match="no 'cache: <CACHE_DOC>' line"):
        documents_cache(bare)
