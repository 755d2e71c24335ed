"""Hook reductions vs the full cached activations; composition with user hooks; NaN errors."""

import pytest
import torch

from thermo_lens.core.passes import collect
from thermo_lens.core.errors import ThermoLensNumericsError
from thermo_lens.measures.anisotropy import anisotropy
from thermo_lens.measures.sheaf.traces import attention_diagonal
from thermo_lens.measures.gain import residual_norms
from thermo_lens.core.model import ModelView
from thermo_lens.core.tokens import tokenize

PROMPTS = ["The capital of France is Paris", "Water", "the early bird catches the worm, and the cat"]


def _cache_one(view, prompt, prepend_bos=True):
    batch = tokenize(view, [prompt], prepend_bos=prepend_bos)
    names = set(view.resid_hook_names) | set(view.pattern_hook_names)
    _, cache = view.model.run_with_cache(batch.tokens, names_filter=lambda n: n in names)
    return cache


@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa", "bert"])
def test_reductions_equal_cached_activations(arch, bridge):
    view = ModelView(bridge(arch))
    got = collect(view, PROMPTS, [residual_norms, anisotropy, attention_diagonal],
                  prepend_bos=True, batch_size=2)
    norms, aniso = got.stack("resid_norm"), got.stack("anisotropy")
    diag, mass = got.stack("attn_diag"), got.stack("attn_mass")
    L, P = view.n_layers, len(PROMPTS)
    assert norms.shape == (L + 1, P, int(got.lengths.max())) and norms.dtype == torch.float32
    assert aniso.shape == (L + 1, P) and diag.shape == (L, P, view.n_heads, norms.shape[-1])
    for p, prompt in enumerate(PROMPTS):
        cache = _cache_one(view, prompt)
        n = int(got.lengths[p])
        assert torch.isnan(norms[:, p, n:]).all()  # padding never holds a number
        for l, name in enumerate(view.resid_hook_names):
            x = cache[name][0].double()
            torch.testing.assert_close(norms[l, p, :n].double(), x.norm(dim=-1), rtol=1e-5, atol=1e-5)
            u = x[1:] / x[1:].norm(dim=-1, keepdim=True)
            cos = u @ u.T
            m = u.shape[0]
            expected = (cos.sum() - m) / (m * (m - 1)) if m >= 2 else float("nan")
            if m >= 2:
                assert aniso[l, p].item() == pytest.approx(float(expected), abs=1e-5)
            else:
                assert torch.isnan(aniso[l, p])
        for l in range(L):
            a = cache[view.pattern_hook_name(l)][0].double()
            torch.testing.assert_close(diag[l, p, :, :n].double(), torch.diagonal(a, dim1=-2, dim2=-1), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(mass[l, p].double(), a.sum(dim=(-1, -2)), rtol=1e-5, atol=1e-5)


def test_user_hook_composes_and_changes_result(bridge):
    view = ModelView(bridge("gpt2"))
    base = collect(view, PROMPTS, [residual_norms], prepend_bos=True).stack("resid_norm")
    calls = []

    def ablate_head0(z, hook):
        calls.append(hook.name)
        z[:, :, 0] = 0.0
        return z

    ablated = collect(view, PROMPTS, [residual_norms], prepend_bos=True,
                      fwd_hooks=[("blocks.1.attn.hook_z", ablate_head0)]).stack("resid_norm")
    assert calls, "the user's hook never ran"
    mask = ~torch.isnan(base)
    torch.testing.assert_close(ablated[:2][mask[:2]], base[:2][mask[:2]])  # upstream unchanged
    assert not torch.allclose(ablated[2:][mask[2:]], base[2:][mask[2:]])  # downstream changed


def test_nan_names_the_layer(bridge):
    view = ModelView(bridge("gpt2"))

    def poison(x, hook):
        return x * float("nan")

    with pytest.raises(ThermoLensNumericsError, match=r"blocks\.1\.hook_resid_post \(layer 1\)"):
        collect(view, PROMPTS, [residual_norms], prepend_bos=True,
                fwd_hooks=[("blocks.1.hook_resid_post", poison)])


def test_bad_batch_size(bridge):
    with pytest.raises(ValueError, match="batch_size"):
        collect(bridge("gpt2"), PROMPTS, [residual_norms], prepend_bos=True, batch_size=0)


def test_length_sorted_batches_give_the_callers_order(bridge):
    view = ModelView(bridge("gpt2"))
    prompts = PROMPTS + ["a", "the cat sat on the mat and the early bird"]
    red = [residual_norms, attention_diagonal]
    fast = collect(view, prompts, red, prepend_bos=True, batch_size=2)  # no user hooks: by length
    plain = collect(view, prompts, red, prepend_bos=True, batch_size=2, sort_by_length=False)
    widths = lambda c: sum(p.shape[-1] for p in c.recorder._parts[("resid_norm", 0)])  # noqa: E731
    assert widths(fast) < widths(plain)  # less padding
    assert torch.equal(fast.lengths, plain.lengths)
    for name in ("resid_norm", "attn_diag", "attn_mass"):
        a, b = fast.stack(name), plain.stack(name)
        w = min(a.shape[-1], b.shape[-1])
        torch.testing.assert_close(a[..., :w], b[..., :w], equal_nan=True, rtol=1e-5, atol=1e-6)
