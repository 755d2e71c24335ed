"""The spectral signature's fast path: Gram products and Lanczos reading weights as stored (bf16,
transposed views of fused parameters), in blocks and panels, against float64 dense algebra; a model
read a layer at a time, without copies."""

import numpy as np
import pytest
import torch

import thermo_lens.measures.spectral.from_weights as from_weights
import thermo_lens.measures.spectral.kernels as kernels
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.model import ModelView
from thermo_lens.measures.spectral import HEAD_METRICS, HeadWeights, signature_from_weights, spectral_signature
from thermo_lens.measures.spectral.kernels import _GramOperator, _lanczos_sigma_max, gram_matrices


def _layouts(L, n, a, b, gen, dtype):
    """The same values ``[L, n, a, b]`` stored three ways: contiguous, as TransformerLens exposes a
    fused ``v_proj`` ``[n * b, a]`` (each head's ``[a, b]`` column-major), and as it exposes
    ``o_proj`` ``[a', n * a]`` (heads interleaved along rows)."""
    w = torch.randn(L, n, a, b, generator=gen).to(dtype)
    fused = w.mT.contiguous().reshape(L, n * b, a).reshape(L, n, b, a).mT  # v_proj-style view
    inter = w.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)  # o_proj-style view
    assert not fused.is_contiguous() and not inter.is_contiguous()
    assert torch.equal(fused, w) and torch.equal(inter, w)
    return {"contiguous": w, "fused": fused, "interleaved": inter}


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("block", [1, 3, None])
def test_gram_matrices_equal_float64_products_in_every_layout(stored, block, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    m, n = 40, 6
    if block is not None:  # blocks of 1 and 3 matrices (7 matrices: a partial last block)
        monkeypatch.setattr(kernels, "_BLOCK_ELEMENTS", block * m * n)
    for name, w in _layouts(1, 7, m, n, gen, stored).items():
        ref = w.double().mT @ w.double()
        ref_rows = w.double() @ w.double().mT
        for dtype, rtol in ((torch.float32, 2e-6), (torch.float64, 1e-13)):
            got = gram_matrices(w, dtype)
            assert got.dtype == dtype and got.shape == (1, 7, n, n), name
            torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=rtol * float(ref.abs().max()))
            rows = gram_matrices(w, dtype, rows=True)
            torch.testing.assert_close(rows.double(), ref_rows, rtol=rtol, atol=rtol * float(ref_rows.abs().max()))
    # The GPU's path (the stack converted at once) gives the same products.
    w = _layouts(1, 7, m, n, gen, stored)["fused"]
    for rows in (False, True):
        torch.testing.assert_close(gram_matrices(w, torch.float32, rows=rows, blocked=False),
                                   gram_matrices(w, torch.float32, rows=rows), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(50, 30), (30, 50), (1, 20), (20, 1)])
@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float32])
def test_gram_operator_is_W_T_W_in_panels_and_layouts(shape, stored, monkeypatch):
    gen = torch.Generator().manual_seed(1)
    monkeypatch.setattr(kernels, "_PANEL_ELEMENTS", 7 * shape[1])  # panels of 7 rows: a partial last one
    W = torch.randn(*shape, generator=gen).to(stored)
    for A in (W, W.mT.contiguous().mT):  # row-major and column-major storage of the same values
        x = torch.randn(A.shape[1], generator=gen)
        out = torch.full((A.shape[1],), float("nan"))
        got = _GramOperator(A, torch.float32)(x, out)
        assert got is out
        want = A.double().mT @ (A.double() @ x.double())
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def _hard_matrices(gen):
    n = 96
    U, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return {
        "gaussian": torch.randn(n, n, generator=gen, dtype=torch.float64) / n**0.5,
        "top two equal": (U * torch.tensor([3.0, 3.0] + [1.0] * (n - 2), dtype=torch.float64)) @ V.T,
        "top two 1e-6 apart": (U * torch.tensor([3.0, 3.0 - 3e-6] + [2.9] * (n - 2), dtype=torch.float64)) @ V.T,
        "rank one": torch.outer(U[:, 0], V[:, 0]) * 7.0,
        "rank deficient tall": torch.randn(n, 5, generator=gen, dtype=torch.float64) @ torch.randn(5, 40, generator=gen, dtype=torch.float64),
        "zero": torch.zeros(n, 30, dtype=torch.float64),
        "wide": torch.randn(30, n, generator=gen, dtype=torch.float64),
        "one row": torch.randn(1, n, generator=gen, dtype=torch.float64),
    }


@pytest.mark.slow
@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float32, torch.float64])
def test_lanczos_reads_stored_matrices_in_either_layout_to_machine_precision(stored, monkeypatch):
    monkeypatch.setattr(kernels, "_PANEL_ELEMENTS", 1000)  # several panels, even at this size
    for name, w in _hard_matrices(torch.Generator().manual_seed(3)).items():
        w = w.to(stored)  # the stored values (bf16: rounded); the reference is of those values
        dense = np.linalg.norm(w.double().numpy(), 2)
        for A in (w, w.mT, w.mT.contiguous(), w.mT.contiguous().mT):  # every orientation and layout
            for dtype, rtol in ((torch.float32, 2e-6), (torch.float64, 1e-12)):
                if dtype == torch.float32 and stored == torch.float64:
                    continue
                got = _lanczos_sigma_max(A, dtype=dtype)
                assert got is not None, name
                np.testing.assert_allclose(got, dense, rtol=rtol, atol=1e-30, err_msg=f"{name} {stored} {dtype}")


def _degenerate_weights(gen, L=3, K=2, group=2, d_model=48, d_head=8):
    """Weights with the cases that break naive methods: a zero head and a rank-1 head (layer 0), a
    layer whose value matrix has its top two singular values equal (1) and one where they are
    1e-6 apart (2)."""
    H = K * group
    wv = torch.randn(L, K, d_model, d_head, generator=gen, dtype=torch.float64) / d_model**0.5
    wo = torch.randn(L, H, d_head, d_model, generator=gen, dtype=torch.float64) / d_model**0.5
    wq = torch.randn(L, H, d_model, d_head, generator=gen, dtype=torch.float64) / d_model**0.5
    wk = torch.randn(L, K, d_model, d_head, generator=gen, dtype=torch.float64) / d_model**0.5
    wv[0, 0] = 0.0
    wq[0, 3] = torch.outer(torch.randn(d_model, generator=gen, dtype=torch.float64),
                           torch.randn(d_head, generator=gen, dtype=torch.float64))
    for l, s in ((1, [2.0, 2.0]), (2, [2.0, 2.0 - 2e-6])):
        V = wv[l].permute(1, 0, 2).reshape(d_model, K * d_head)
        U, S, Vh = torch.linalg.svd(V, full_matrices=False)
        S[:2] = torch.tensor(s, dtype=torch.float64)
        S[2:] = S[2:].clamp_max(1.0)
        wv[l] = (U * S @ Vh).reshape(d_model, K, d_head).permute(1, 0, 2)
    return wv, wo, wq, wk


def _dense_reference(wv, wo, wq, wk, kv):
    """float64 numpy SVDs of the d_model x d_model circuits and the whole-layer matrices."""
    wv, wo, wq, wk = (np.asarray(w, dtype=np.float64) for w in (wv, wo, wq, wk))
    L, K, d_model, d_head = wv.shape
    H = wo.shape[1]
    ref = {m: np.zeros((L, H)) for m in ("W_V_norm", "W_O_norm", "ov_norm", "qk_norm", "W_V_frobenius",
                                         "W_O_frobenius")}
    ref.update(layer_W_V_norm=np.zeros(L), layer_W_O_norm=np.zeros(L))
    for l in range(L):
        for h in range(H):
            v, o, q, k = wv[l, kv[h]], wo[l, h], wq[l, h], wk[l, kv[h]]
            ref["W_V_norm"][l, h] = np.linalg.norm(v, 2)
            ref["W_O_norm"][l, h] = np.linalg.norm(o, 2)
            ref["W_V_frobenius"][l, h] = np.linalg.norm(v)
            ref["W_O_frobenius"][l, h] = np.linalg.norm(o)
            ref["ov_norm"][l, h] = np.linalg.svd(v @ o, compute_uv=False)[0]
            ref["qk_norm"][l, h] = np.linalg.svd(q @ k.T, compute_uv=False)[0]
        ref["layer_W_V_norm"][l] = np.linalg.norm(np.concatenate(list(wv[l]), axis=1), 2)
        ref["layer_W_O_norm"][l] = np.linalg.norm(np.concatenate(list(wo[l]), axis=0), 2)
    return ref


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", ["contiguous", "views"])
def test_signature_of_stored_weights_equals_dense_float64_svd(stored, layout, monkeypatch):
    # Every per-head, OV, QK and whole-layer norm within 2e-6 (float32 results) of float64 dense
    # SVDs of the stored values, whatever the layout, with every layer its own chunk and panels of
    # a few rows; degenerate, near-degenerate, zero and rank-1 cases included.
    monkeypatch.setattr(from_weights, "_CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(kernels, "_PANEL_ELEMENTS", 100)
    monkeypatch.setattr(kernels, "_BLOCK_ELEMENTS", 500)
    gen = torch.Generator().manual_seed(11)
    wv, wo, wq, wk = (w.to(stored) for w in _degenerate_weights(gen))
    if layout == "views":  # as TransformerLens exposes fused HF parameters: v_proj, o_proj, ...
        wv, wq, wk = (w.mT.contiguous().mT for w in (wv, wq, wk))
        wo = wo.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
    kv = [h // 2 for h in range(wo.shape[1])]
    sig = signature_from_weights(wv, wo, W_Q=wq, W_K=wk)
    ref = _dense_reference(wv.double(), wo.double(), wq.double(), wk.double(), kv)
    for m, want in ref.items():
        np.testing.assert_allclose(getattr(sig, m).double().numpy(), want, rtol=2e-6, atol=1e-30, err_msg=m)
    assert sig.W_V_norm[0, 0] == 0 and sig.ov_norm[0, 0] == 0 and sig.layer_norm_method == "lanczos"
    # The dense methods (the GPU's "svd" and "gram") read the same stored weights.
    for method in ("svd", "gram"):
        other = signature_from_weights(wv, wo, W_Q=wq, W_K=wk, layer_norm_method=method)
        assert other.layer_norm_method == method
        for m in ("layer_W_V_norm", "layer_W_O_norm"):
            np.testing.assert_allclose(getattr(other, m).double().numpy(), ref[m], rtol=2e-6, err_msg=m)


def test_head_weights_never_convert_a_whole_chunk_for_the_registered_metrics():
    gen = torch.Generator().manual_seed(2)
    wv, wo, wq, wk = (w.to(torch.bfloat16) for w in _degenerate_weights(gen))
    w = HeadWeights(wv, wo, torch.tensor([0, 0, 1, 1]), W_Q=wq, W_K=wk, dtype=torch.float32)
    from thermo_lens.core.registry import metrics

    for m in metrics(result="SpectralSignature", computed=True):
        m.compute(w)  # type: ignore[misc]
    assert not [k for k in w._cache if k.startswith("weights_")]  # only Gram matrices and factors
    # A metric that reads the weights themselves gets them in the compute dtype.
    assert w.W_V.dtype == torch.float32 and torch.equal(w.W_V, wv.float())
    assert w.W_Q is not None and w.W_Q.dtype == torch.float32
    assert HeadWeights(wv, wo, torch.tensor([0, 0, 1, 1])).W_K is None


def test_model_is_read_a_layer_at_a_time_as_stored_without_copies(bridge, monkeypatch):
    model = bridge("llama_gqa")
    view = ModelView(model)
    whole = spectral_signature(model, cache=False)
    monkeypatch.setattr(from_weights, "_CHUNK_ELEMENTS", 1)  # every layer its own chunk
    seen: list[tuple[str, int]] = []
    shares: list[bool] = []
    stored = ModelView.stored_weights

    def spy(self, name, layer, **kw):
        seen.append((name, layer))
        return stored(self, name, layer, **kw)

    init = HeadWeights.__init__

    def check(self, W_V, W_O, *args, **kwargs):
        # A layer's W_V reaches the Gram products as a view of the model's own parameter.
        param = model.blocks[len(shares)].attn.W_V
        shares.append(W_V.untyped_storage().data_ptr() == param.untyped_storage().data_ptr())
        init(self, W_V, W_O, *args, **kwargs)

    monkeypatch.setattr(ModelView, "stored_weights", spy)
    monkeypatch.setattr(HeadWeights, "__init__", check)
    monkeypatch.setattr(ModelView, "W_V", lambda *a, **k: pytest.fail("stacked copy of every layer"))
    layered = spectral_signature(model, cache=False)
    L = view.n_layers
    assert sorted(seen) == sorted((n, l) for n in ("W_V", "W_O", "W_Q", "W_K") for l in range(L))
    assert shares == [True] * L
    for m in HEAD_METRICS + ("W_V_norm_kv", "layer_W_V_norm", "layer_W_O_norm"):
        torch.testing.assert_close(getattr(layered, m), getattr(whole, m), rtol=1e-6, atol=0)


def test_stored_weights_are_the_stacked_weights_of_one_layer(bridge):
    view = ModelView(bridge("gemma"))
    for name in ("W_V", "W_K", "W_Q", "W_O"):
        stacked = getattr(view, name)(torch.float32)
        for l in range(view.n_layers):
            w = view.stored_weights(name, l)
            assert w.dtype == view.dtype and torch.equal(w.float(), stacked[l]), (name, l)
    assert torch.equal(view.stored_weights("W_V", -1).float(), view.W_V()[-1])
    with pytest.raises(ThermoLensInputError, match="W_Q.*W_O"):
        view.stored_weights("W_U", 0)
    with pytest.raises(ThermoLensInputError, match="out of range"):
        view.stored_weights("W_V", view.n_layers)


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float32])
def test_lanczos_reads_a_layer_stored_head_after_head_in_place(stored, monkeypatch):
    """TransformerLens' W_V [kv_head, d_model, d_head] (heads one after another): the layer's value
    matrix [d_model, kv_head * d_head] is no view of it, so the whole-layer norm reads the heads'
    panels W_V[h]^T in place; same value as the dense matrix, no copy of the layer."""
    from thermo_lens.measures.spectral import layer_norms as ln
    from thermo_lens.measures.spectral.kernels import RowPanels

    gen = torch.Generator().manual_seed(5)
    W_V = (torch.randn(6, 80, 16, generator=gen) / 80**0.5).to(stored)
    got = ln._value_matrix(W_V)
    assert isinstance(got, RowPanels) and all(P.data_ptr() == W_V[h].data_ptr() for h, P in enumerate(got.panels))
    dense = W_V.double().permute(1, 0, 2).reshape(80, 96)
    torch.testing.assert_close(got.dense().mT.double(), dense)
    want = np.linalg.norm(dense.numpy(), 2)
    np.testing.assert_allclose(_lanczos_sigma_max(got, dtype=torch.float32), want, rtol=2e-6)
    # a fused v_proj (the HF / bridge layout) is a view: read as it is
    fused = W_V.permute(1, 0, 2).reshape(80, 96).contiguous().reshape(80, 6, 16).permute(1, 0, 2)
    view = ln._value_matrix(fused)
    assert isinstance(view, torch.Tensor) and view.data_ptr() == fused.data_ptr()
    # through layer_norms, both layouts give the dense value
    W_O = torch.randn(1, 6, 16, 80, generator=gen).to(stored)
    for wv in (W_V[None], fused[None]):
        lv, _, method = ln.layer_norms(wv, W_O, torch.float32, "lanczos")
        assert method == "lanczos"
        np.testing.assert_allclose(float(lv[0]), want, rtol=2e-6)


@pytest.mark.slow
def test_lanczos_meets_1e_5_on_a_crowded_gaussian_spectrum():
    """The slowest case for the stopping rule: a square Gaussian matrix, its top singular values
    crowded at the Marchenko-Pastur edge (theta creeps up for dozens of steps); the result must
    still be within 1e-5 of a float64 SVD (it stops ~1e-6 below)."""
    gen = torch.Generator().manual_seed(11)
    for n in (512, 1024):
        W = torch.randn(n, n, generator=gen) / n**0.5
        want = np.linalg.norm(W.double().numpy(), 2)
        got = _lanczos_sigma_max(W, dtype=torch.float32)
        assert got is not None and got <= want * (1 + 1e-6)  # a Ritz value: from below
        np.testing.assert_allclose(got, want, rtol=1e-5)


# ------------------------------------------------------------------ top eigenvalue by squaring (GPU)

def _psd_with_spectrum(lams: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    n = lams.shape[-1]
    Q = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))[0]
    return (Q * lams) @ Q.T


@pytest.mark.parametrize("n", [1, 2, 3, 64, 128, pytest.param(256, marks=pytest.mark.slow)])
def test_top_eigenvalue_by_squaring_meets_its_bound_on_hard_spectra(n):
    """The CUDA path of the per-head norms: within SQUARING_TOLERANCE (relative) of float64
    eigvalsh on spectra with no gap, exact ties, a near-tie, one dominant eigenvalue, rank one,
    a Marchenko-Pastur bulk, tiny and huge scales, and zero matrices; never above lambda_max."""
    gen = torch.Generator().manual_seed(n)
    spectra = [torch.ones(n), torch.linspace(1, 2, n), torch.cat([torch.full((min(n, 2),), 3.0), torch.ones(n - min(n, 2))]),
               torch.cat([torch.tensor([1.0]), torch.full((n - 1,), 1 - 1e-12)]),
               torch.cat([torch.tensor([1e3]), torch.rand(n - 1, generator=gen)]),
               torch.cat([torch.tensor([5.0]), torch.zeros(n - 1)]),
               torch.linalg.svdvals(torch.randn(n, n, generator=gen, dtype=torch.float64)).square()]
    mats = [_psd_with_spectrum(s.double(), gen) for s in spectra]
    W = torch.randn(n, 2 * n, generator=gen, dtype=torch.float64)
    mats.append(W @ W.T)  # a Gram matrix as the heads' are
    G = torch.stack(mats)
    G = torch.cat([G, G * 1e-30, G * 1e30, torch.zeros(1, n, n, dtype=torch.float64)])
    want = torch.linalg.eigvalsh(G)[..., -1].clamp_min(0)
    got = kernels._top_eigenvalue_by_squaring(G)
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert got[-1] == 0
    rel = ((want - got) / want.clamp_min(1e-300))[:-1]
    assert float(rel.max()) <= kernels.SQUARING_TOLERANCE, float(rel.max())
    assert float(rel.min()) >= -1e-14  # a Rayleigh quotient: never above lambda_max (up to rounding)


def test_top_eigenvalue_keeps_dtype_and_batch_shape_and_agrees_with_eigvalsh_in_float32():
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(3, 5, 128, 64, generator=gen)
    G = W.mT @ W  # [3, 5, 64, 64] float32
    want = torch.linalg.eigvalsh(G.double())[..., -1]
    for got in (kernels.top_eigenvalue(G), kernels._top_eigenvalue_by_squaring(G)):
        assert got.dtype == torch.float32 and got.shape == (3, 5)
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    assert kernels.top_eigenvalue(torch.zeros(2, 0, 0)).shape == (2,)


def test_per_head_norms_by_squaring_equal_the_cpu_path(monkeypatch):
    """Every per-head metric computed with the CUDA kernel (squaring), here on the CPU, equals the
    eigvalsh path to 1e-6."""
    gen = torch.Generator().manual_seed(1)
    L, H, K, d_model, d_head = 2, 4, 2, 96, 16
    w = dict(W_V=torch.randn(L, K, d_model, d_head, generator=gen), W_O=torch.randn(L, H, d_head, d_model, generator=gen),
             W_Q=torch.randn(L, H, d_model, d_head, generator=gen), W_K=torch.randn(L, K, d_model, d_head, generator=gen))
    a = signature_from_weights(w["W_V"], w["W_O"], W_Q=w["W_Q"], W_K=w["W_K"], layer_norms=False)
    monkeypatch.setattr(kernels, "top_eigenvalue", kernels._top_eigenvalue_by_squaring)
    import thermo_lens.measures.spectral.heads as heads
    monkeypatch.setattr(heads, "top_eigenvalue", kernels._top_eigenvalue_by_squaring)
    b = signature_from_weights(w["W_V"], w["W_O"], W_Q=w["W_Q"], W_K=w["W_K"], layer_norms=False)
    for m in HEAD_METRICS:
        torch.testing.assert_close(b.head_metrics[m], a.head_metrics[m], rtol=1e-6, atol=1e-7, msg=m)
