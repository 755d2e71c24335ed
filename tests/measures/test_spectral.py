"""Spectral signature vs numpy SVD on independent HF weight slices, dense OV products, algebra."""

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiers import examples

from conftest import ARCHS
from hf_slices import hf_all_head_weights, hf_all_qk_weights
from thermo_lens.core.passes import collect
from thermo_lens.measures.gain import residual_norms
from thermo_lens.core.errors import ThermoLensNumericsError
from thermo_lens.core.model import ModelView
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.measures.spectral import (
    HEAD_METRICS,
    SpectralSignature,
    matrix_spectral_norm,
    ov_norm_factored,
    signature_from_collected,
    signature_from_weights,
    spectral_signature,
)

ROOT = Path(__file__).resolve().parents[2]


def _numpy_reference(wv, wo, kv_head_of, wq=None, wk=None):
    """Per-head and per-layer metrics by the paper's protocol: np.linalg.norm(W, 2) head by head,
    the OV (and QK) products formed densely. wv [L, K, d_model, d_head], wo [L, H, d_head, d_model],
    wq [L, H, d_model, d_head], wk [L, K, d_model, d_head]."""
    wv, wo = np.asarray(wv, dtype=np.float64), np.asarray(wo, dtype=np.float64)
    L, K = wv.shape[:2]
    H = wo.shape[1]
    ref = {m: np.zeros((L, H)) for m in HEAD_METRICS}
    ref.update(W_V_norm_kv=np.zeros((L, K)), layer_W_V_norm=np.zeros(L), layer_W_O_norm=np.zeros(L))
    for l in range(L):
        for k in range(K):
            ref["W_V_norm_kv"][l, k] = np.linalg.norm(wv[l, k], 2)
        for h in range(H):
            v, o = wv[l, kv_head_of[h]], wo[l, h]
            ref["W_V_norm"][l, h] = np.linalg.norm(v, 2)
            ref["W_O_norm"][l, h] = np.linalg.norm(o, 2)
            ref["W_V_frobenius"][l, h] = np.linalg.norm(v, "fro")
            ref["W_O_frobenius"][l, h] = np.linalg.norm(o, "fro")
            ref["ov_norm"][l, h] = np.linalg.svd(v @ o, compute_uv=False)[0]
            if wq is not None:  # the dense d_model x d_model QK circuit of query head h
                q, k = np.asarray(wq[l, h], np.float64), np.asarray(wk[l, kv_head_of[h]], np.float64)
                ref["qk_norm"][l, h] = np.linalg.svd(q @ k.T, compute_uv=False)[0]
        ref["layer_W_V_norm"][l] = np.linalg.norm(np.concatenate(list(wv[l]), axis=1), 2)
        ref["layer_W_O_norm"][l] = np.linalg.norm(np.concatenate(list(wo[l]), axis=0), 2)
    ref["ratio"] = ref["W_V_norm"] / ref["W_O_norm"]
    ref["W_V_stable_rank"] = ref["W_V_frobenius"] ** 2 / ref["W_V_norm"] ** 2
    ref["W_O_stable_rank"] = ref["W_O_frobenius"] ** 2 / ref["W_O_norm"] ** 2
    return ref


def _close(got, want, rtol=2e-5, atol=1e-7):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------ real layouts
@pytest.mark.parametrize("arch", ARCHS)
def test_every_head_equals_numpy_svd_of_independent_hf_slices(arch, bridge, hf_model):
    view = ModelView(bridge(arch))
    sig = spectral_signature(bridge(arch))
    wv, wo = hf_all_head_weights(arch, hf_model(arch))  # from the HF state dict, not the bridge
    wq, wk = hf_all_qk_weights(arch, hf_model(arch))
    group = view.n_heads // view.n_kv_heads
    ref = _numpy_reference(wv, wo, [h // group for h in range(view.n_heads)], wq, wk)
    assert set(sig.head_metrics) == set(HEAD_METRICS)  # every registered head metric, qk_norm included
    L, H, K = view.n_layers, view.n_heads, view.n_kv_heads
    for m in HEAD_METRICS:
        t = getattr(sig, m)
        assert t.shape == (L, H) and t.dtype == torch.float32, m
        _close(t, ref[m])
    _close(sig.W_V_norm_kv, ref["W_V_norm_kv"])
    assert sig.W_V_norm_kv.shape == (L, K)
    _close(sig.layer_W_V_norm, ref["layer_W_V_norm"])
    _close(sig.layer_W_O_norm, ref["layer_W_O_norm"])
    _close(sig.trace_proxy, ref["layer_W_V_norm"] ** 2, rtol=5e-5)
    _close(sig.layer_ratio, ref["layer_W_V_norm"] / ref["layer_W_O_norm"], rtol=5e-5)
    # Definition recorded; geometry from the config (Gemma: d_head 16 != d_model / n_heads).
    assert (sig.weights, sig.dtype, sig.layer_norm_method) == ("raw", "float32", "lanczos")  # CPU "auto"
    assert sig.d_head == view.d_head and sig.rho == pytest.approx(view.n_heads / view.d_head)
    assert sig.model["post_ln"] == view.post_ln and sig.means()["rho"] == sig.rho


@pytest.mark.parametrize("arch", ["llama_gqa", "falcon"])
def test_kv_heads_are_reported_and_mapped_explicitly(arch, bridge, hf_model):
    view = ModelView(bridge(arch))
    sig = spectral_signature(view)
    wv, wo = hf_all_head_weights(arch, hf_model(arch))
    K, H = wv.shape[1], wo.shape[1]
    assert sig.n_kv_heads == K < H  # llama_gqa: 2 KV heads for 4; falcon: 1 (multi-query)
    assert sig.kv_head_of.tolist() == [h // (H // K) for h in range(H)]
    for k in range(K):
        _close(sig.W_V_norm_kv[:, k], [np.linalg.norm(wv[l, k].double().numpy(), 2) for l in range(len(wv))])
        _close(sig.W_V_frobenius_kv[:, k], [np.linalg.norm(wv[l, k].double().numpy()) for l in range(len(wv))])
    for h in range(H):
        k = h // (H // K)
        assert torch.equal(sig.W_V_norm[:, h], sig.W_V_norm_kv[:, k])
        assert torch.equal(sig.W_V_stable_rank[:, h], sig.W_V_stable_rank_kv[:, k])
        dense = [np.linalg.norm(wv[l, k].double().numpy() @ wo[l, h].double().numpy(), 2) for l in range(len(wv))]
        _close(sig.ov_norm[:, h], dense)  # query head h's OV uses its KV head's W_V
    frame = sig.to_frame("kv_head")
    assert len(frame) == sig.n_layers * K and set(frame.kv_head) == set(range(K))
    assert sig.to_frame()["kv_head"].tolist()[:H] == sig.kv_head_of.tolist()


def test_processed_weights_warn_and_change_the_numbers(checkpoint_dir):
    from transformer_lens.model_bridge import TransformerBridge

    b = TransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # raw weights: no warning at all
        raw = spectral_signature(b)
    assert raw.weights == "raw"
    b.enable_compatibility_mode(disable_warnings=True)
    with pytest.warns(UserWarning, match="processed weights.*LayerNorm.*from_pretrained_no_processing"):
        proc = spectral_signature(b)
    assert proc.weights == "processed" and proc.to_frame()["weights"].eq("processed").all()
    assert not torch.allclose(proc.W_V_norm, raw.W_V_norm)  # ln_1 folded into W_V


def test_bf16_model_gives_float32_results(checkpoint_dir, hf_model):
    from transformer_lens.model_bridge import TransformerBridge

    b = TransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")), dtype=torch.bfloat16)
    sig = spectral_signature(b)
    assert sig.model["dtype"] == "bfloat16" and sig.dtype == "float32"
    assert all(getattr(sig, m).dtype == torch.float32 for m in HEAD_METRICS)
    assert sig.layer_W_V_norm.dtype == torch.float32
    # Against numpy on the HF checkpoint rounded to bf16 (what the bf16 model holds), upcast.
    wv, wo = (w.to(torch.bfloat16).float() for w in hf_all_head_weights("gpt2", hf_model("gpt2")))
    wq, wk = (w.to(torch.bfloat16).float() for w in hf_all_qk_weights("gpt2", hf_model("gpt2")))
    ref = _numpy_reference(wv, wo, list(range(4)), wq, wk)
    for m in HEAD_METRICS:
        _close(getattr(sig, m), ref[m])


def test_float64_option(bridge, hf_model):
    sig = spectral_signature(bridge("neox"), dtype=torch.float64)
    assert sig.dtype == "float64"
    assert all(getattr(sig, m).dtype == torch.float64 for m in HEAD_METRICS)
    assert sig.layer_W_V_norm.dtype == torch.float64
    wv, wo = hf_all_head_weights("neox", hf_model("neox"))
    ref = _numpy_reference(wv, wo, list(range(4)), *hf_all_qk_weights("neox", hf_model("neox")))
    for m in HEAD_METRICS:  # float32 weights, float64 algebra: agreement to float64 round-off
        _close(getattr(sig, m), ref[m], rtol=1e-11, atol=0)
    assert spectral_signature(bridge("neox"), dtype="float64").dtype == "float64"


# ------------------------------------------------------------------------------ algebra
_shapes = st.tuples(
    st.integers(1, 2),  # layers
    st.sampled_from([1, 2]),  # kv heads
    st.sampled_from([1, 2]),  # query heads per kv head
    st.integers(1, 9),  # d_model (may be < d_head)
    st.integers(1, 6),  # d_head
)


def _random_weights(shape, seed, dtype=torch.float64):
    L, K, g, d, dh = shape
    gen = torch.Generator().manual_seed(seed)
    # Heavy-tailed scales per head so norms span orders of magnitude.
    sv = torch.exp(2 * torch.randn(L, K, 1, 1, generator=gen, dtype=dtype))
    so = torch.exp(2 * torch.randn(L, K * g, 1, 1, generator=gen, dtype=dtype))
    wv = torch.randn(L, K, d, dh, generator=gen, dtype=dtype) * sv
    wo = torch.randn(L, K * g, dh, d, generator=gen, dtype=dtype) * so
    return wv, wo


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_shapes, st.integers(0, 2**31 - 1))
def test_factored_ov_equals_dense_and_bounds_hold(shape, seed):
    wv, wo = _random_weights(shape, seed)
    sig = signature_from_weights(wv, wo, dtype=torch.float64)
    L, K, g, d, dh = shape
    kv = torch.arange(K * g) // g
    dense = torch.linalg.matrix_norm(wv[:, kv] @ wo, ord=2)  # [L, H], d_model x d_model formed
    torch.testing.assert_close(sig.ov_norm, dense, rtol=1e-10, atol=1e-300)
    torch.testing.assert_close(ov_norm_factored(wv[:, kv], wo), dense, rtol=1e-10, atol=1e-300)
    assert (sig.ov_norm <= sig.W_V_norm * sig.W_O_norm * (1 + 1e-12)).all()
    r = min(d, dh)
    for sr in (sig.W_V_stable_rank, sig.W_O_stable_rank, sig.W_V_stable_rank_kv):
        assert ((sr >= 1 - 1e-12) & (sr <= r + 1e-9)).all()
    torch.testing.assert_close(sig.W_V_norm_kv, torch.linalg.matrix_norm(wv, ord=2), rtol=1e-12, atol=0)
    # Whole-layer norm: at least every head's, at most the root of the sum of squares.
    assert (sig.layer_W_V_norm[:, None] >= sig.W_V_norm_kv * (1 - 1e-12)).all()
    assert (sig.layer_W_O_norm <= sig.W_O_norm.square().sum(1).sqrt() * (1 + 1e-12)).all()


@settings(max_examples=examples(40), deadline=None)
@given(_shapes, st.integers(0, 2**31 - 1),
       st.floats(0.01, 100.0) | st.floats(-100.0, -0.01))
def test_scaling_W_V_scales_its_norms_by_abs_c(shape, seed, c):
    wv, wo = _random_weights(shape, seed)
    a = signature_from_weights(wv, wo, dtype=torch.float64)
    b = signature_from_weights(c * wv, wo, dtype=torch.float64)
    for m in ("W_V_norm", "W_V_frobenius", "ov_norm", "ratio", "W_V_norm_kv", "layer_W_V_norm"):
        torch.testing.assert_close(getattr(b, m), abs(c) * getattr(a, m), rtol=1e-10, atol=0)
    torch.testing.assert_close(b.trace_proxy, c * c * a.trace_proxy, rtol=1e-10, atol=0)
    for m in ("W_O_norm", "W_O_frobenius", "W_O_stable_rank", "layer_W_O_norm"):
        assert torch.equal(getattr(b, m), getattr(a, m))
    torch.testing.assert_close(b.W_V_stable_rank, a.W_V_stable_rank, rtol=1e-10, atol=0)


def test_hand_made_heads_with_known_answers():
    # W_V = diag(3, 1) on the first two coordinates, W_O = 2 * e_1 -> known norms exactly.
    d_model, d_head = 4, 2
    wv = torch.zeros(1, 1, d_model, d_head)
    wv[0, 0, 0, 0], wv[0, 0, 1, 1] = 3.0, 1.0
    wo = torch.zeros(1, 2, d_head, d_model)
    wo[0, 0, 0, 0] = 2.0  # head 0 reads v's first coordinate: OV = 6
    wo[0, 1, 1, 3] = 5.0  # head 1 reads v's second coordinate: OV = 5, not 3 * 5
    threads = torch.get_num_threads()
    sig = signature_from_weights(wv, wo)
    assert torch.get_num_threads() == threads  # small heads run single-threaded, then restore
    assert sig.W_V_norm.tolist() == [[3.0, 3.0]] and sig.W_O_norm.tolist() == [[2.0, 5.0]]
    assert sig.ov_norm.tolist() == [[6.0, 5.0]]
    assert sig.W_V_stable_rank[0, 0].item() == pytest.approx(10 / 9)
    assert sig.W_O_stable_rank.tolist() == [[1.0, 1.0]]
    assert sig.ratio[0].tolist() == pytest.approx([1.5, 0.6])
    assert sig.layer_W_O_norm.item() == pytest.approx(5.0)  # rows of the two heads are orthogonal
    assert sig.trace_proxy.item() == pytest.approx(9.0)


@pytest.mark.slow
def test_lanczos_layer_norm_equals_dense_svd():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(3, 120, 90, generator=gen, dtype=torch.float64)
    dense = np.array([np.linalg.norm(m.numpy(), 2) for m in w])
    got, method = matrix_spectral_norm(w, "lanczos")
    assert method == "lanczos"
    np.testing.assert_allclose(got.numpy(), dense, rtol=1e-12)
    wide, _ = matrix_spectral_norm(w.mT.contiguous().float(), "lanczos")  # m < n side, float32
    np.testing.assert_allclose(wide.numpy(), dense, rtol=2e-6)
    assert matrix_spectral_norm(w, "auto")[1] == "lanczos"  # CPU: Lanczos, whatever the size
    gram, method = matrix_spectral_norm(w, "gram")
    assert method == "gram"
    np.testing.assert_allclose(gram.numpy(), dense, rtol=1e-12)
    gram32, _ = matrix_spectral_norm(w.mT.contiguous().float(), "gram")  # m < n side, float32
    np.testing.assert_allclose(gram32.numpy(), dense, rtol=2e-6)
    wv, wo = _random_weights((2, 2, 2, 9, 4), 0)
    lan = signature_from_weights(wv, wo, dtype=torch.float64, layer_norm_method="lanczos")
    svd = signature_from_weights(wv, wo, dtype=torch.float64, layer_norm_method="svd")
    assert lan.layer_norm_method == "lanczos" and svd.layer_norm_method == "svd"
    torch.testing.assert_close(lan.layer_W_V_norm, svd.layer_W_V_norm, rtol=1e-12, atol=0)
    torch.testing.assert_close(lan.layer_W_O_norm, svd.layer_W_O_norm, rtol=1e-12, atol=0)


@pytest.mark.parametrize("method", ["lanczos", "gram", pytest.param("svd", marks=pytest.mark.slow), "auto"])
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_matrix_spectral_norm_of_half_precision_weights_is_reduced_in_float32(method, half):
    # A bf16 model's stored weights: every method reduces in float32 (Lanczos to bf16's own
    # precision was ~1% off; LAPACK has no bf16 eigen/SVD routine), against float64 SVDs of the
    # same (rounded) values.
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(2, 150, 110, generator=gen) / 12).to(half)
    dense = np.linalg.svd(w.double().numpy(), compute_uv=False)[:, 0]
    got, _ = matrix_spectral_norm(w, method)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.double().numpy(), dense, rtol=2e-6)


def test_ov_norm_factored_of_half_precision_weights_is_reduced_in_float32():
    gen = torch.Generator().manual_seed(4)
    wv = (torch.randn(3, 40, 8, generator=gen) / 6).bfloat16()
    wo = (torch.randn(3, 8, 40, generator=gen) / 6).bfloat16()
    dense = np.linalg.svd(wv.double().numpy() @ wo.double().numpy(), compute_uv=False)[:, 0]
    got = ov_norm_factored(wv, wo)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.double().numpy(), dense, rtol=2e-6)


@pytest.mark.slow
def test_lanczos_converges_on_hard_spectra_and_falls_back_when_it_cannot():
    from thermo_lens.measures.spectral.kernels import _lanczos_sigma_max

    gen = torch.Generator().manual_seed(3)
    n = 200
    U, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    cases = {
        "gaussian (unseparated top)": torch.randn(n, n, generator=gen, dtype=torch.float64) / n**0.5,
        "top two equal": (U * torch.tensor([3.0, 3.0] + [1.0] * (n - 2), dtype=torch.float64)) @ V.T,
        "top two 1e-6 apart": (U * torch.tensor([3.0, 3.0 - 3e-6] + [2.9] * (n - 2), dtype=torch.float64)) @ V.T,
        "rank one": torch.outer(U[:, 0], V[:, 0]) * 7.0,
        "zero": torch.zeros(n, 50, dtype=torch.float64),
        "wide": torch.randn(40, n, generator=gen, dtype=torch.float64),
    }
    for name, w in cases.items():
        dense = np.linalg.norm(w.numpy(), 2)
        for dtype, rtol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
            got = _lanczos_sigma_max(w.to(dtype))
            assert got is not None, name
            np.testing.assert_allclose(got, dense, rtol=rtol, atol=1e-30, err_msg=f"{name} {dtype}")
    # Not converged within the step budget: None, and matrix_spectral_norm falls back to the
    # exact Gram eigenvalue and says so in the method.
    hard = cases["gaussian (unseparated top)"]
    assert _lanczos_sigma_max(hard, max_steps=3) is None
    import thermo_lens.measures.spectral.kernels as sp

    orig = sp._lanczos_sigma_max
    sp._lanczos_sigma_max = lambda w, **kw: orig(w, max_steps=3, **kw)
    try:
        got, method = matrix_spectral_norm(hard[None].repeat(2, 1, 1), "lanczos")
    finally:
        sp._lanczos_sigma_max = orig
    assert method == "lanczos (gram for 2 of 2)"
    np.testing.assert_allclose(got.numpy(), np.linalg.norm(hard.numpy(), 2), rtol=1e-12)


def test_gram_factors_keep_float32_accuracy_on_rank_deficient_and_uneven_heads():
    # Heads whose Gram matrices are singular or badly conditioned: zero heads, rank-1 heads,
    # d_model < d_head, singular values over 6 decades. float32 against float64 dense SVDs.
    gen = torch.Generator().manual_seed(5)
    L, H, d_model, d_head = 2, 4, 48, 16
    wv = torch.randn(L, H, d_model, d_head, generator=gen, dtype=torch.float64)
    wo = torch.randn(L, H, d_head, d_model, generator=gen, dtype=torch.float64)
    wv[0, 0] = 0.0  # a pruned head
    wv[0, 1] = torch.outer(torch.randn(d_model, generator=gen, dtype=torch.float64),
                           torch.randn(d_head, generator=gen, dtype=torch.float64))  # rank 1
    u, _, vh = torch.linalg.svd(wv[1, 2], full_matrices=False)
    wv[1, 2] = (u * torch.logspace(0, -6, d_head, dtype=torch.float64)) @ vh  # condition 1e6
    wo[1, 3] = wo[1, 3] * 1e-4
    wo[1, 3, :, :8] = 0.0
    sig = signature_from_weights(wv.float(), wo.float())
    dense_ov = torch.linalg.matrix_norm(wv @ wo, ord=2)
    dense_v = torch.linalg.matrix_norm(wv, ord=2)
    dense_o = torch.linalg.matrix_norm(wo, ord=2)
    np.testing.assert_allclose(sig.ov_norm.double(), dense_ov, rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(sig.W_V_norm.double(), dense_v, rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(sig.W_O_norm.double(), dense_o, rtol=2e-6, atol=1e-30)
    assert sig.ov_norm[0, 0] == 0 and sig.W_V_norm[0, 0] == 0


# ------------------------------------------------------------------------------ result object
def test_frame_json_repr_summary_and_collected(bridge):
    b = bridge("gemma")
    sig = spectral_signature(b)
    df = sig.to_frame()
    assert list(df.columns[:3]) == ["layer", "head", "kv_head"] and len(df) == 3 * 4
    row = df[(df["layer"] == 2) & (df["head"] == 3)].iloc[0]
    assert row.ov_norm == pytest.approx(sig.ov_norm[2, 3].item())
    assert row.W_O_stable_rank == pytest.approx(sig.W_O_stable_rank[2, 3].item())
    layers = sig.to_frame("layer")
    assert layers.trace_proxy.tolist() == pytest.approx(sig.trace_proxy.tolist())
    assert layers.mean_ov_norm.tolist() == pytest.approx(sig.ov_norm.mean(1).tolist())
    s = sig.means()
    assert s["rho"] == 4 / 16 and s["d_head"] == 16  # true d_head, not d_model // n_heads = 8
    assert s["ov_norm"] == pytest.approx(sig.ov_norm.double().mean().item())
    assert s["layer_W_V_norm"] == pytest.approx(sig.layer_W_V_norm.double().mean().item())
    assert sig.to_row()["model"] == s["model"] and "rho=n_heads/d_head=0.25" in repr(sig)
    back = SpectralSignature.from_json(sig.to_json())
    for m in HEAD_METRICS + ("kv_head_of", "layer_W_V_norm", "trace_proxy"):
        assert torch.equal(getattr(back, m), getattr(sig, m))
    assert back.model == sig.model and back.weights == "raw" and repr(back) == repr(sig)
    skipped = spectral_signature(b, layer_norms=False)
    assert skipped.layer_W_V_norm is None and skipped.layer_norm_method == "skipped"
    assert torch.equal(skipped.ov_norm, sig.ov_norm) and "per layer" not in repr(skipped)
    assert SpectralSignature.from_json(skipped.to_json()).trace_proxy is None
    col = collect(b, ["The capital of France"], [residual_norms], prepend_bos=True)
    assert torch.equal(signature_from_collected(col).ov_norm, sig.ov_norm)


# ------------------------------------------------------------------------------ bad input
def test_bad_input_gets_clear_errors(bridge):
    wv, wo = torch.randn(2, 2, 6, 3), torch.randn(2, 4, 3, 6)
    with pytest.raises(ThermoLensInputError, match="float32 or torch.float64"):
        spectral_signature(bridge("gpt2"), dtype=torch.float16)
    with pytest.raises(ThermoLensInputError, match="4-D.*W\\[None\\]"):
        signature_from_weights(wv[0], wo)
    with pytest.raises(ThermoLensInputError, match="disagree"):
        signature_from_weights(wv, wo[..., :5])
    with pytest.raises(ThermoLensInputError, match="not a multiple"):
        signature_from_weights(torch.randn(2, 3, 6, 3), wo)
    with pytest.raises(ThermoLensInputError, match="kv_head_of"):
        signature_from_weights(wv, wo, kv_head_of=[0, 1, 2, 0])
    with pytest.raises(ThermoLensInputError, match="must be a torch.Tensor"):
        signature_from_weights(wv.numpy(), wo)
    with pytest.raises(ThermoLensInputError, match="layer_norm_method"):
        signature_from_weights(wv, wo, layer_norm_method="power")
    with pytest.raises(ThermoLensInputError, match="per must be"):
        signature_from_weights(wv, wo).to_frame("token")
    with pytest.raises(ThermoLensInputError, match="Collected"):
        signature_from_collected(bridge("gpt2"))
    with pytest.raises(TypeError, match="not load models by name"):
        spectral_signature("gpt2")
    bad = wo.clone()
    bad[1, 2, 0, 0] = float("nan")
    with pytest.raises(ThermoLensNumericsError, match="W_O has NaN/inf at layer 1, head 2"):
        signature_from_weights(wv, bad)
    # An explicit, non-default mapping is honoured.
    sig = signature_from_weights(wv, wo, kv_head_of=[1, 0, 1, 0])
    assert torch.equal(sig.W_V_norm[:, 0], sig.W_V_norm_kv[:, 1])


@pytest.mark.slow
def test_benchmark_script_runs_quick():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "spectral.py"), "--quick"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ov" in out.stdout.lower() and "x" in out.stdout
