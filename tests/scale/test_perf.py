"""Speed-ups that must not change a number: length buckets, the spectral cache, thread safety,
low-precision weights, the CUDA path and the profile benchmark's smoke run."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import thermo_lens as tl
from thermo_lens.measures import spectral
from thermo_lens.core.tokens import MAX_PADDING, plan_batches
from thermo_lens.core.model import ModelView
from thermo_lens.measures.profile import profile
from thermo_lens.measures.spectral import signature_from_weights, spectral_signature
from thermo_lens.testing import boot, make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["The capital of France is", "Water freezes at a temperature of",
           "Birds of a feather flock", "The Voynich manuscript's undeciphered text",
           "a", "Colorless green ideas sleep furiously while the quantum teapot hums.",
           "def main(): return sum(range(10))", "The early bird catches the worm"]


def _same_profile(a, b):
    torch.testing.assert_close(a.gain.block_gain, b.gain.block_gain)
    torch.testing.assert_close(a.sheaf.trace, b.sheaf.trace)
    torch.testing.assert_close(a.anisotropy.values, b.anisotropy.values, equal_nan=True)
    for m in spectral.HEAD_METRICS + spectral.LAYER_METRICS:
        torch.testing.assert_close(getattr(a.spectral, m), getattr(b.spectral, m))


# ------------------------------------------------------------------------------ length buckets
@pytest.mark.parametrize("seed", range(5))
def test_buckets_pad_under_the_bound_and_cover_every_prompt_once(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 200, (97,), generator=gen).tolist()
    plan = plan_batches(lengths, 8)
    assert sorted(i for b in plan for i in b) == list(range(97))
    for b in plan:
        assert 1 <= len(b) <= 8
        real, padded = sum(lengths[i] for i in b), len(b) * max(lengths[i] for i in b)
        assert 1 - real / padded <= MAX_PADDING + 1e-12
    # the plain plans: caller's order / length-sorted fixed-size batches
    assert plan_batches(lengths, 8, sort_by_length=False)[0] == list(range(8))
    fixed = plan_batches(lengths, 8, max_padding=None)
    assert [len(b) for b in fixed] == [8] * 12 + [1]
    assert [lengths[i] for b in fixed for i in b] == sorted(lengths)


def test_buckets_of_equal_lengths_are_full():
    assert plan_batches([5] * 20, 8) == [list(range(8)), list(range(8, 16)), list(range(16, 20))]


@pytest.mark.slow
def test_bucketed_profile_equals_caller_order_batches(bridge):
    m = bridge("gpt2")
    p = profile(m, PROMPTS, batch_size=3)
    g = tl.residual_gain(m, PROMPTS, batch_size=3, sort_by_length=False)
    torch.testing.assert_close(p.gain.block_gain, g.block_gain)
    t = tl.sheaf_traces(m, PROMPTS, batch_size=1)
    torch.testing.assert_close(p.sheaf.trace, t.trace)


@pytest.mark.slow
def test_user_hooks_see_the_batches_of_the_clean_run(bridge):
    """The batch plan never depends on hooks (a paired difference then holds only the hooks' effect)."""
    sizes = []
    hooked = profile(bridge("gpt2"), PROMPTS, batch_size=3,
                     fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: sizes.append(x.shape[0]))])
    clean = profile(bridge("gpt2"), PROMPTS, batch_size=3)
    plan = clean.gain.provenance.batch_plan
    assert hooked.gain.provenance.batch_plan == plan and sizes == [len(b) for b in plan]


# ------------------------------------------------------------------------------ spectral cache
@pytest.mark.slow
def test_cache_reuses_then_sees_an_in_place_edit_of_W_V(tmp_path):
    model = boot("gpt2", tmp_path / "m")
    first = profile(model, PROMPTS[:3])
    again = profile(model, PROMPTS[:3])
    assert again.spectral is first.spectral  # cache hit: same weights, same arguments
    before = first.spectral.W_V_norm.clone()
    w_before = ModelView(model).W_V()
    with torch.no_grad():  # in place, through the TransformerLens W_V view of the fused weight
        model.blocks[1].attn.W_V[2].mul_(3.0)
    w_after = ModelView(model).W_V()
    torch.testing.assert_close(w_after[1, 2], 3.0 * w_before[1, 2])  # the edit reached the model
    torch.testing.assert_close(w_after[0], w_before[0])
    edited = profile(model, PROMPTS[:3])
    fresh = spectral_signature(model, cache=False)
    assert edited.spectral is not first.spectral
    torch.testing.assert_close(edited.spectral.W_V_norm[1, 2], 3.0 * before[1, 2])
    torch.testing.assert_close(edited.spectral.W_V_norm[0], before[0])
    for m in spectral.HEAD_METRICS + spectral.LAYER_METRICS:
        torch.testing.assert_close(getattr(edited.spectral, m), getattr(fresh, m))
    # sheaf traces use ||W_V||_F^2 of the edited head too
    torch.testing.assert_close(edited.sheaf.W_V_frob_sq[1, 2], 9.0 * first.sheaf.W_V_frob_sq[1, 2])


def test_cache_sees_a_dot_data_edit_and_clear_cache(tmp_path):
    model = boot("llama_gqa", tmp_path / "m")
    a = spectral_signature(model)
    params = dict(model.blocks[0].attn.named_parameters())
    name = next(n for n in params if "v_proj" in n or n.startswith("v."))
    params[name].data.mul_(2.0)  # .data: no version bump, but the sampled values change
    b = spectral_signature(model)
    torch.testing.assert_close(b.W_V_norm_kv[0], 2.0 * a.W_V_norm_kv[0])
    spectral.clear_cache()
    assert spectral_signature(model) is not b


def test_cache_key_includes_the_arguments(bridge):
    m = bridge("gemma")
    a = spectral_signature(m)
    b = spectral_signature(m, dtype=torch.float64)
    c = spectral_signature(m, layer_norms=False)
    assert b.dtype == "float64" and c.layer_W_V_norm is None and a.layer_W_V_norm is not None
    assert spectral_signature(m) is a


# ------------------------------------------------------------------------------ threads
def test_spectral_never_touches_the_global_thread_count(bridge, monkeypatch):
    def refuse(n):
        raise AssertionError("spectral code must not call torch.set_num_threads")

    monkeypatch.setattr(torch, "set_num_threads", refuse)
    gen = torch.Generator().manual_seed(0)
    wv, wo = torch.randn(2, 2, 40, 8, generator=gen), torch.randn(2, 4, 8, 40, generator=gen)
    signature_from_weights(wv, wo)
    spectral_signature(bridge("llama_gqa"), cache=False)


@pytest.mark.slow
def test_two_profiles_in_threads_equal_the_sequential_ones(bridge):
    models = [bridge("gpt2"), bridge("llama_gqa")]
    spectral.clear_cache()
    sequential = [profile(m, PROMPTS, batch_size=3) for m in models]
    spectral.clear_cache()
    results, errors = [None, None], []

    def run(i):
        try:
            for _ in range(2):
                results[i] = profile(models[i], PROMPTS, batch_size=3)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for got, want in zip(results, sequential):
        _same_profile(got, want)


# ------------------------------------------------------------------------------ precision, devices
def test_bf16_weights_give_float32_norms_of_the_bf16_values(tmp_path):
    make_checkpoint("llama_gqa", tmp_path / "m", dtype=torch.bfloat16)
    model = boot("llama_gqa", tmp_path / "m", dtype=torch.bfloat16)
    view = ModelView(model)
    assert view.dtype == torch.bfloat16
    sig = spectral_signature(model, cache=False)
    assert sig.dtype == "float32" and sig.W_V_norm.dtype == torch.float32
    ref = signature_from_weights(view.W_V(torch.float64), view.W_O(torch.float64), view.kv_head_of,
                                 W_Q=view.W_Q(torch.float64), W_K=view.W_K(torch.float64), dtype=torch.float64)
    assert "qk_norm" in spectral.HEAD_METRICS
    for m in spectral.HEAD_METRICS + spectral.LAYER_METRICS:
        torch.testing.assert_close(getattr(sig, m), getattr(ref, m).float(), rtol=2e-5, atol=1e-7)
    p = profile(model, PROMPTS[:4])
    assert p.gain.block_gain.dtype == torch.float32 and torch.isfinite(p.gain.block_gain).all()


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="CUDA not available: the GPU path (weights and the forward pass on the "
                           "device, norms reduced in float32) is checked only on a machine with one")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_profile_equals_cpu(tmp_path, dtype):
    cpu = boot("llama_gqa", tmp_path / "m")
    gpu = boot("llama_gqa", tmp_path / "m", device="cuda", dtype=dtype)
    a, b = profile(cpu, PROMPTS), profile(gpu, PROMPTS)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=3e-2, atol=1e-3)
    torch.testing.assert_close(b.gain.block_gain, a.gain.block_gain, **tol)
    torch.testing.assert_close(b.sheaf.trace, a.sheaf.trace, **tol)
    assert b.spectral.dtype == "float32"
    torch.testing.assert_close(b.spectral.ov_norm, a.spectral.ov_norm, **tol)


# ------------------------------------------------------------------------------ benchmark smoke run
@pytest.mark.slow  # like the other benchmark smoke runs: a subprocess building five models (~25 s)
def test_profile_benchmark_runs_quick():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile.py"), "--quick"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    for part in ("GPT-2-small geometry", "deeper-narrower", "GQA", "LLaMA-7B geometry", "streaming"):
        assert part in text, part
    assert "profile (cold)" in text and "x [" in text and "peak RSS" in text
    assert "profile (warm, no attr.)" in text and "spectral alone (cold)" in text and "min/min" in text


@pytest.mark.slow  # a subprocess building two tiny models (~20 s)
def test_gpu_benchmark_runs_quick_on_the_cpu(tmp_path):
    """benchmarks/gpu.py's code runs where there is no GPU (--device cpu --quick), every part, and
    writes its JSON; without CUDA the default device is a clear refusal."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick", "--trace",
                          "--trace-file", str(tmp_path / "trace.txt"), "--json", str(tmp_path / "g.json")],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    for part in ("ceilings:", "spectral signature, LLaMA-7B geometry", "whole-layer norms by lanczos",
                 "LLaMA-3.2-1B geometry on cpu", "LLaMA-2-7B geometry on cpu", "profile (warm, no attr.)"):
        assert part in out.stdout, part
    import json

    got = json.loads((tmp_path / "g.json").read_text())
    assert set(got) >= {"device", "versions", "ceilings", "spectral_7b", "profile"} and "failures" not in got
    assert "tl:attr_total" in (tmp_path / "trace.txt").read_text()
    if not torch.cuda.is_available():
        no = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py")], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
        assert no.returncode == 2 and "no CUDA device here" in no.stderr


# ------------------------------------------------------------------------------ streaming memory
@pytest.mark.slow
def test_freed_activation_memory_is_handed_back_every_few_batches(bridge, monkeypatch):
    # glibc keeps freed activation blocks pinned behind the small per-batch results; collect
    # trims every TRIM_EVERY batches on CPU (RSS was +0.6 MiB per prompt without it). The trim
    # changes no number.
    from thermo_lens.core.passes import memory as hooks

    m = bridge("gpt2")
    prompts = [f"prompt number {i} " + "x " * (i % 5) for i in range(17)]
    plain = profile(m, prompts, batch_size=1, progress=False)
    calls = []
    monkeypatch.setattr(hooks, "release_freed_memory", lambda: calls.append(1))
    trimmed = profile(m, prompts, batch_size=1, progress=False)
    assert len(calls) == 17 // hooks.TRIM_EVERY
    assert torch.equal(plain.gain.block_gain, trimmed.gain.block_gain)
    hooks.release_freed_memory()  # the real one runs (or is a no-op off glibc) without error


def test_progress_bar_counts_prompts_with_rate_and_eta(bridge, capsys):
    """A long run's bar counts prompts (rate in prompts/s, an ETA), whatever the batches' sizes."""
    prompts = ["a b c d e f", "x", "the cat sat", "one two", "hello world again", "z y"]
    tl.residual_gain(bridge("gpt2"), prompts, batch_size=2, progress=True)
    err = capsys.readouterr().err
    assert "prompt/s" in err or "s/prompt" in err
    assert f"/{len(prompts)} [" in err and "<" in err  # n/total [elapsed<remaining, rate]
