"""The device path of the spectral signature, run on the CPU: every layer's whole-layer matrices
stepped together by one batched Lanczos iteration, and the per-head eigenproblems of many layers in
one batched call. It equals the per-matrix path and float64 dense algebra, on several geometries
(GQA, MQA, d_head and head counts that make the layer matrices non-square), and its op count per
Lanczos step does not grow with the number of layers."""

import numpy as np
import pytest
import torch

import thermo_lens.measures.spectral.from_weights as from_weights
import thermo_lens.measures.spectral.layer_norms as layer_norms_mod
from thermo_lens.core.census import OpCensus
from thermo_lens.core.errors import ThermoLensNumericsError
from thermo_lens.measures.spectral import signature_from_weights, spectral_signature
from thermo_lens.measures.spectral.kernels import _lanczos_sigma_max
from thermo_lens.measures.spectral.lanczos import CHECK_EVERY, lanczos_sigma_max_batched

#: (layers, heads, KV heads, d_model, d_head)
GEOMETRIES = {
    "square (GPT-2-like)": (3, 4, 4, 64, 16),
    "GQA": (3, 8, 2, 64, 16),
    "MQA, d_head 32": (2, 6, 1, 96, 32),
    "d_head 24": (2, 4, 4, 48, 24),
    "heads narrower than d_model": (3, 4, 4, 64, 8),
}


def _weights(L, H, K, d_model, d_head, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def mk(*shape):
        return (torch.randn(*shape, generator=gen) / d_model**0.5).to(dtype)
    return mk(L, K, d_model, d_head), mk(L, H, d_head, d_model), mk(L, H, d_model, d_head), mk(L, K, d_model, d_head)


def _signature(w, batched, monkeypatch, **kw):
    monkeypatch.setattr(from_weights, "batched", lambda device: batched)
    wv, wo, wq, wk = w
    return signature_from_weights(wv, wo, W_Q=wq, W_K=wk, **kw)


def _numpy_reference(w):
    """Every metric from float64 numpy SVDs of the stored values (dense products, whole layers)."""
    wv, wo, wq, wk = (t.double().numpy() for t in w)
    L, K, d_model, d_head = wv.shape
    H = wo.shape[1]
    kv = np.arange(H) // (H // K)

    def s(A):
        return np.linalg.svd(A, compute_uv=False)[..., 0]
    return {
        "W_V_norm": s(wv)[:, kv], "W_O_norm": s(wo), "ov_norm": s(wv[:, kv] @ wo),
        "qk_norm": s(wq @ wk[:, kv].transpose(0, 1, 3, 2)), "W_V_frobenius": np.linalg.norm(wv, axis=(2, 3))[:, kv],
        "W_O_stable_rank": np.linalg.norm(wo, axis=(2, 3)) ** 2 / s(wo) ** 2,
        "layer_W_V_norm": s(wv.transpose(0, 2, 1, 3).reshape(L, d_model, K * d_head)),
        "layer_W_O_norm": s(wo.reshape(L, H * d_head, d_model)),
    }


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b) / np.abs(b)))


@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_batched_path_equals_the_per_matrix_path_and_float64_svds(geometry, stored, monkeypatch):
    w = _weights(*GEOMETRIES[geometry], stored)
    per = _signature(w, False, monkeypatch)
    bat = _signature(w, True, monkeypatch)
    assert bat.layer_norm_method == per.layer_norm_method == "lanczos"
    names = [*per.head_metrics, *per.kv_head_metrics, "layer_W_V_norm", "layer_W_O_norm", "layer_ratio"]
    assert set(bat.head_metrics) == set(per.head_metrics) and "qk_norm" in names
    for m in names:
        assert _rel(getattr(bat, m), getattr(per, m)) <= 1e-6, m
    ref = _numpy_reference(w)
    for m, want in ref.items():
        assert _rel(getattr(bat, m), want) <= 2e-6, m
        assert _rel(getattr(bat, m), want) <= max(2 * _rel(getattr(per, m), want), 1e-6), m  # as accurate


def test_float64_batched_path_meets_float64_svds_to_1e_12(monkeypatch):
    w = _weights(*GEOMETRIES["GQA"], torch.float64)
    bat = _signature(w, True, monkeypatch, dtype=torch.float64)
    for m, want in _numpy_reference(w).items():
        assert _rel(getattr(bat, m), want) <= 1e-12, m


def test_layers_taken_in_groups_when_the_stacks_exceed_their_budget(monkeypatch):
    """A stack budget of one matrix: every layer its own batched iteration (and, for GQA, the value
    and output stacks apart), with the same numbers; chunks of one layer for the reads too."""
    for geometry in ("square (GPT-2-like)", "GQA"):
        w = _weights(*GEOMETRIES[geometry], torch.bfloat16)
        whole = _signature(w, True, monkeypatch)
        monkeypatch.setattr(layer_norms_mod, "_HOST_STACK_BYTES", 1)
        monkeypatch.setattr(from_weights, "_CHUNK_ELEMENTS", 1)
        monkeypatch.setattr(from_weights, "_GRAM_ELEMENTS_CPU", 1)
        split = _signature(w, True, monkeypatch)
        monkeypatch.undo()
        for m in ("layer_W_V_norm", "layer_W_O_norm", *whole.head_metrics):
            torch.testing.assert_close(getattr(split, m), getattr(whole, m), rtol=1e-6, atol=0)


def test_batched_lanczos_stops_where_the_per_matrix_path_can_and_finds_invariant_subspaces():
    gen = torch.Generator().manual_seed(3)
    r, n = 50, 40
    M = torch.randn(5, r, n, generator=gen, dtype=torch.float64)
    M[1] = torch.randn(r, 2, generator=gen, dtype=torch.float64) @ torch.randn(2, n, generator=gen, dtype=torch.float64)
    M[2] = 0  # a zero matrix: an invariant subspace at once
    M[3, :, :3] *= 10  # a gap: fast convergence
    sigma, steps = lanczos_sigma_max_batched(M)
    want = torch.linalg.svdvals(M)[:, 0].numpy()
    np.testing.assert_allclose(sigma, want, rtol=1e-12, atol=1e-300)
    per = np.array([_lanczos_sigma_max(m) for m in M])
    np.testing.assert_allclose(sigma, per, rtol=1e-12, atol=0)
    # Found at the step it occurred (rank 2: within the first few), not at the next check.
    assert steps[2] == 0 and steps[1] < CHECK_EVERY - 1
    assert steps[3] < n  # converged before the Krylov space is exhausted
    unconverged, _ = lanczos_sigma_max_batched(M[:1].float(), max_steps=3)
    assert np.isnan(unconverged).all()


def test_model_path_batched_equals_per_matrix(bridge, monkeypatch):
    model = bridge("llama_gqa")
    per = spectral_signature(model, cache=False)
    monkeypatch.setattr(from_weights, "batched", lambda device: True)
    bat = spectral_signature(model, cache=False)
    for m in (*per.head_metrics, *per.kv_head_metrics, "layer_W_V_norm", "layer_W_O_norm"):
        torch.testing.assert_close(getattr(bat, m), getattr(per, m), rtol=1e-6, atol=0)


def test_nan_weights_raise_on_the_batched_path(monkeypatch):
    w = list(_weights(*GEOMETRIES["GQA"], torch.float32))
    w[1][1, 2, 0, 5] = float("nan")
    with pytest.raises(ThermoLensNumericsError, match="W_O has NaN/inf at layer 1, head 2"):
        _signature(w, True, monkeypatch)


def _census(L, batched, monkeypatch):
    """Ops and syncs of a signature of ``L`` copies of one layer (every matrix then stops at the same
    Lanczos step, whatever ``L``)."""
    one = _weights(1, 4, 4, 64, 16, torch.float32, seed=5)
    w = [t.expand(L, *t.shape[1:]).contiguous() for t in one]
    monkeypatch.setattr(from_weights, "batched", lambda device: batched)
    with OpCensus() as c:
        signature_from_weights(w[0], w[1], W_Q=w[2], W_K=w[3])
    return c


def test_device_path_op_count_does_not_grow_with_the_number_of_layers(monkeypatch):
    """The device path dispatches the same ops for 2 layers as for 8 (one batched product per
    Lanczos step for all matrices, the per-head eigenproblems of all layers in one call) and reads
    the device a fixed number of times: once per Lanczos check, plus the Cholesky and finiteness
    flags. The per-matrix path (the CPU's) grows with the layers."""
    two, eight = _census(2, True, monkeypatch), _census(8, True, monkeypatch)
    assert eight.total == two.total, (two.total, eight.total)
    assert eight.syncs == two.syncs and eight.sync_ops == two.sync_ops
    # Square 64 x 64 layer matrices: at most 64 steps, a check every CHECK_EVERY; 3 Cholesky flags, 1
    # finiteness flag.
    assert eight.syncs <= 64 // CHECK_EVERY + 4, eight.sync_ops
    assert set(eight.sync_ops) <= {"Tensor.numpy", "aten._local_scalar_dense", "aten.is_nonzero"}, eight.sync_ops
    per_two, per_eight = _census(2, False, monkeypatch), _census(8, False, monkeypatch)
    assert per_eight.total > 3 * per_two.total / 2 and per_eight.syncs > 3 * per_two.syncs / 2
    assert eight.total < per_two.total


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: the device path runs on the CPU above")
@pytest.mark.parametrize("geometry", ["square (GPT-2-like)", "GQA", "MQA, d_head 32"])
def test_on_cuda_the_default_is_the_batched_path_equal_to_the_per_matrix_path_and_float64(geometry, monkeypatch):
    from thermo_lens.measures.spectral import lanczos

    w = _weights(*GEOMETRIES[geometry], torch.bfloat16)
    dev = [t.cuda() for t in w]
    calls = []
    orig = lanczos.lanczos_sigma_max_batched
    monkeypatch.setattr(lanczos, "lanczos_sigma_max_batched", lambda M, *a, **k: calls.append(M.shape) or orig(M, *a, **k))
    with OpCensus() as c:
        bat = signature_from_weights(dev[0], dev[1], W_Q=dev[2], W_K=dev[3])
    assert calls, "the device path did not run"
    assert c.syncs <= 2 * (64 // CHECK_EVERY) + 6, c.sync_ops
    monkeypatch.setattr(from_weights, "batched", lambda device: False)
    per = signature_from_weights(dev[0], dev[1], W_Q=dev[2], W_K=dev[3])
    for m in ("layer_W_V_norm", "layer_W_O_norm"):
        assert _rel(getattr(bat, m), getattr(per, m)) <= 1e-6, m
    for m, want in _numpy_reference(w).items():
        assert _rel(getattr(bat, m), want) <= 2e-6, m
