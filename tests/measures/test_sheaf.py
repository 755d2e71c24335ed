"""Sheaf Laplacian: the factored object vs the dense coboundary delta^T delta built here from its
definition; per-head traces from the in-hook diagonal vs the full cached pattern and HF weights."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples

from hf_slices import hf_all_head_weights, hf_head_weights
from thermo_lens.core.passes import collect
from thermo_lens.measures.sheaf.traces import attention_diagonal
from thermo_lens.measures.gain import residual_norms
from thermo_lens.core.model import ModelView
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.tokens import tokenize
from thermo_lens.measures.sheaf import (
    DENSE_LIMIT,
    LayerSheafLaplacian,
    SheafLaplacian,
    SheafTraces,
    attention_pattern,
    laplacian_from_collected,
    sheaf_laplacian,
    sheaf_traces,
    traces_from_collected,
)

PROMPT = "The capital of France is Paris"
PROMPTS = ["The capital of France is Paris", "Water", "the early bird catches the worm, and the cat"]
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- the definition
def coboundary(A, W_V, convention):
    """Dense delta from the definition: node stalks R^{d_model}, one edge per unordered pair
    {i, j} (i < j) with stalk R^{d_head}; restriction of token i to edge {i, j} is
    F_i = sqrt(c_ij) W_V^T, (delta x)_{ij} = F_j x_j - F_i x_i."""
    A, W_V = np.asarray(A, dtype=np.float64), np.asarray(W_V, dtype=np.float64)
    n, (d, dh) = A.shape[0], W_V.shape
    edges = [(i, j) for i in range(n) for j in range(i + 1, n)]
    delta = np.zeros((len(edges) * dh, n * d))
    for e, (i, j) in enumerate(edges):
        if convention == "directed":
            c_i, c_j = A[i, j], A[j, i]  # each end weighted by its own attention to the other
        else:
            c_i = c_j = (A[i, j] + A[j, i]) / 2
        rows = slice(e * dh, (e + 1) * dh)
        delta[rows, j * d:(j + 1) * d] += np.sqrt(c_j) * W_V.T
        delta[rows, i * d:(i + 1) * d] -= np.sqrt(c_i) * W_V.T
    return delta


def random_case(n, d, dh, causal, sparse, low_rank, seed):
    rng = np.random.default_rng(seed)
    logits = 2.0 * rng.standard_normal((n, n))
    if causal:
        logits[np.triu_indices(n, 1)] = -np.inf
    if sparse:  # some exact zeros (and possibly one-hot rows); the diagonal always survives
        drop = rng.random((n, n)) < 0.4
        np.fill_diagonal(drop, False)
        logits[drop] = -np.inf
    A = np.exp(logits - logits.max(axis=1, keepdims=True))
    A /= A.sum(axis=1, keepdims=True)
    if low_rank and min(d, dh) > 1:
        r = int(rng.integers(1, min(d, dh)))
        W = rng.standard_normal((d, r)) @ rng.standard_normal((r, dh))
    else:
        W = rng.standard_normal((d, dh))
    return A, W


cases = st.tuples(
    st.integers(1, 6), st.integers(1, 6), st.integers(1, 5), st.booleans(), st.booleans(),
    st.booleans(), st.integers(0, 2**32 - 1),
)


@settings(max_examples=examples(60), deadline=None)
@given(cases, st.sampled_from(["directed", "symmetrized"]))
def test_factored_laplacian_equals_dense_coboundary(case, convention):
    A, W = random_case(*case)
    n, d = A.shape[0], W.shape[0]
    L = SheafLaplacian.from_pattern(torch.tensor(A), torch.tensor(W), convention)
    delta = coboundary(A, W, convention)
    ref = delta.T @ delta
    scale = max(1.0, np.abs(ref).max())

    # factorisation: kron(M, W_V W_V^T) is delta^T delta
    np.testing.assert_allclose(L.dense().numpy(), ref, atol=1e-12 * scale)
    # trace, and the definitions page's (§3) identity Tr L = (n - sum_i A_ii) ||W_V||_F^2 (both conventions)
    assert L.trace() == pytest.approx(np.trace(ref), rel=1e-12, abs=1e-12)
    assert L.trace() == pytest.approx((n - np.trace(A)) * (W ** 2).sum(), rel=1e-12, abs=1e-12)
    # the definitions page's (§3) M: M_ii = sum_{j != i} c_ij (= 1 - A_ii when directed), M_ij = -sqrt(c_ij c_ji)
    M = L.M.numpy()
    off_mass = 1 - np.diag(A) if convention == "directed" else (A.sum(0) + A.sum(1)) / 2 - np.diag(A)
    np.testing.assert_allclose(np.diag(M), off_mass, atol=1e-12)
    off = -np.sqrt(A * A.T) if convention == "directed" else -(A + A.T) / 2
    np.testing.assert_allclose(M[~np.eye(n, dtype=bool)], off[~np.eye(n, dtype=bool)], atol=1e-15)
    # the full spectrum from the factors vs numpy on the dense matrix
    ev_ref = np.linalg.eigvalsh(ref)
    ev = L.eigenvalues().numpy()
    assert ev.shape == (n * d,) and np.all(np.diff(ev) >= 0)
    np.testing.assert_allclose(ev, ev_ref, atol=1e-10 * scale)
    # matvec without forming L, on both input layouts (and numpy in -> numpy out)
    rng = np.random.default_rng(case[-1] + 1)
    x = rng.standard_normal(n * d)
    np.testing.assert_allclose((L @ torch.tensor(x)).numpy(), ref @ x, atol=1e-11 * scale)
    y = L @ x.reshape(n, d)
    assert isinstance(y, np.ndarray) and y.shape == (n, d)
    np.testing.assert_allclose(y.reshape(-1), ref @ x, atol=1e-11 * scale)
    # restriction maps rebuild the same coboundary
    maps = L.restriction_maps()
    assert len(maps) == n * (n - 1)
    delta2 = np.zeros_like(delta)
    dh = W.shape[1]
    for e, (i, j) in enumerate((a, b) for a in range(n) for b in range(a + 1, n)):
        delta2[e * dh:(e + 1) * dh, j * d:(j + 1) * d] = maps[j, i].numpy().T
        delta2[e * dh:(e + 1) * dh, i * d:(i + 1) * d] = -L.restriction_map(i, j).numpy().T
    np.testing.assert_allclose(delta2, delta, atol=1e-14)
    # Frobenius norm from the factors
    assert L.norm() == pytest.approx(np.linalg.norm(ref), rel=1e-9, abs=1e-12)
    # the spectral gap lambda_2 and the kernel, where the spectrum is unambiguous
    if n * d >= 2:
        gap = L.spectral_gap()
        assert gap.value == pytest.approx(ev_ref[1], abs=1e-10 * scale)
        small = ev_ref[(ev_ref > 1e-12 * scale) & (ev_ref < 1e-6 * scale)]
        if small.size == 0:
            assert gap.kernel_dim == L.kernel_dim == int((ev_ref <= 1e-12 * scale).sum())
            nz = ev_ref[ev_ref > 1e-12 * scale]
            np.testing.assert_allclose(L.nonzero_eigenvalues().numpy(), nz, atol=1e-10 * scale)
            if nz.size:
                assert gap.smallest_nonzero == pytest.approx(nz[0], rel=1e-8)


@settings(max_examples=examples(30), deadline=None)
@given(cases)
def test_causal_directed_spectrum_is_diagonal_products(case):
    """thermo_lens.definitions §3: causal attention makes M = diag(1 - A_ii); spectrum {(1 - A_ii) sigma_k^2} + 0."""
    n, d, dh, _, sparse, low_rank, seed = case
    A, W = random_case(n, d, dh, True, sparse, low_rank, seed)
    L = SheafLaplacian.from_pattern(A, W)
    assert L.is_causal and L.is_diagonal
    np.testing.assert_array_equal(L.M.numpy(), np.diag(np.diag(L.M.numpy())))
    s = np.linalg.svd(W, compute_uv=False)
    s2 = np.concatenate([s ** 2, np.zeros(max(d - s.size, 0))])
    expected = np.sort(np.outer(1 - np.diag(A), s2).ravel())
    np.testing.assert_allclose(L.eigenvalues().numpy(), expected, atol=1e-12 * max(1, expected.max()))
    gap = L.spectral_gap()
    # kernel: whole stalks of tokens with A_ii = 1 (token 0 always), plus ker W_V^T in the others
    one_hot, rank = int((np.diag(A) == 1.0).sum()), np.linalg.matrix_rank(W)
    assert one_hot >= 1
    kernel = one_hot * d + (n - one_hot) * (d - rank)
    assert gap.kernel_dim == kernel
    if kernel >= 2:  # always so for d_model >= 2: the gap is trivially 0, and it says why
        assert gap.value == 0.0 and "trivially" in gap.reason
        assert "Token(s) [0" in gap.reason
        if n >= 2:
            assert "diag(1 - A_ii)" in gap.reason
        if d > rank:
            assert "kernel of dimension d_model - rank(W_V)" in gap.reason
    elif n * d >= 2:
        assert gap.value == pytest.approx(np.sort(expected)[1]) and gap.value > 0


@settings(max_examples=examples(30), deadline=None)
@given(cases)
def test_symmetrized_is_graph_laplacian_kron_stalk(case):
    """symmetrized: L = L_graph(w) (x) W_V W_V^T, w = (A + A^T)/2; same trace as directed."""
    A, W = random_case(*case)
    n = A.shape[0]
    Ls = SheafLaplacian.from_pattern(A, W, "symmetrized")
    Ld = SheafLaplacian.from_pattern(A, W, "directed")
    w = (A + A.T) / 2
    L_graph = np.diag(w.sum(axis=1)) - w  # textbook D - W (self-loops cancel)
    np.testing.assert_allclose(Ls.M.numpy(), L_graph, atol=1e-15)
    np.testing.assert_allclose(Ls.dense().numpy(), np.kron(L_graph, W @ W.T), atol=1e-12 * max(1, np.abs(W).max() ** 2))
    assert Ls.trace() == pytest.approx(Ld.trace(), rel=1e-12, abs=1e-13)
    if n >= 2:
        assert Ls.spectral_gap().graph_gap == pytest.approx(np.linalg.eigvalsh(L_graph)[1], abs=1e-12)


def test_gap_reasons_and_values_by_hand():
    # Hand-made: 3 tokens, causal, W_V = [[2, 0], [0, 1], [0, 0]] (d_model 3, d_head 2, sigma = 2, 1)
    A = torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.5, 0.25, 0.25]])
    W = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    L = SheafLaplacian.from_pattern(A, W)
    # M = diag(0, 0.25, 0.75), sigma^2 = 4, 1, 0 -> nonzero spectrum {0.25, 0.75, 1, 3}
    torch.testing.assert_close(L.nonzero_eigenvalues(), torch.tensor([0.25, 0.75, 1.0, 3.0], dtype=torch.float64))
    assert L.trace() == pytest.approx((3 - 2.0) * 5.0)
    gap = L.spectral_gap()
    assert gap.value == 0.0 and gap.kernel_dim == 9 - 4 and gap.smallest_nonzero == pytest.approx(0.25)
    assert "Token(s) [0]" in gap.reason and "3 - 2 = 1" in gap.reason
    assert float(gap) == 0.0 and "lambda_2" in repr(gap)
    value, why = gap  # unpacks as (value, reason)
    assert value == 0.0 and why == gap.reason
    # Bidirectional, full-rank W_V with d_head >= d_model: kernel 0, a genuine gap
    B = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    Lb = SheafLaplacian.from_pattern(B, torch.eye(2))
    # M = [[0.5, -0.5], [-0.5, 0.5]] has eigenvalues 0, 1 -> kernel dim 2 (the constant sections)
    assert Lb.spectral_gap().kernel_dim == 2 and Lb.spectral_gap().value == 0.0
    # Directed, non-symmetric, 3 tokens, d_model = 1: M = sum over the 3 edges of u u^T is full
    # rank, so L has no kernel and lambda_2 is genuine.
    C = np.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [0.1, 0.7, 0.2]])
    M = np.array([[0.8, -np.sqrt(0.30), -np.sqrt(0.03)],
                  [-np.sqrt(0.30), 0.9, -np.sqrt(0.21)],
                  [-np.sqrt(0.03), -np.sqrt(0.21), 0.8]])
    mu = np.linalg.eigvalsh(M)
    g = SheafLaplacian.from_pattern(C, 2 * torch.eye(1)).spectral_gap()
    assert mu[0] > 0.03
    assert g.kernel_dim == 0 and g.value == pytest.approx(4 * mu[1]) and g.smallest_nonzero == pytest.approx(4 * mu[0])
    assert "genuine" in g.reason


def test_dense_refuses_large_and_says_how_to_override():
    A = torch.full((5, 5), 0.2)
    L = SheafLaplacian.from_pattern(A, torch.randn(6, 3))
    with pytest.raises(ThermoLensInputError, match=r"max_size=30"):
        L.dense(max_size=10)
    assert L.dense(max_size=30).shape == (30, 30)
    big = SheafLaplacian.from_pattern(torch.full((65, 65), 1 / 65), torch.randn(64, 8))
    assert big.size == 65 * 64 > DENSE_LIMIT
    with pytest.raises(ThermoLensInputError, match=r"\.dense\(max_size=4160\)"):
        big.dense()
    # ... while the factored methods still work at that size
    assert big.eigenvalues().shape == (65 * 64,)
    assert big.trace() == pytest.approx((65 - 1) * float(big.W_V.pow(2).sum()))


def test_bad_inputs_get_clear_errors():
    W = torch.randn(4, 2)
    with pytest.raises(ThermoLensInputError, match="square"):
        SheafLaplacian.from_pattern(torch.rand(3, 4), W)
    with pytest.raises(ThermoLensInputError, match=r"pattern\[b, h\]"):
        SheafLaplacian.from_pattern(torch.rand(1, 2, 3, 3), W)
    with pytest.raises(ThermoLensInputError, match="negative"):
        SheafLaplacian.from_pattern(torch.tensor([[1.0, -0.1], [0.5, 0.5]]), W)
    with pytest.raises(ThermoLensInputError, match="NaN"):
        SheafLaplacian.from_pattern(torch.tensor([[1.0, float("nan")], [0.5, 0.5]]), W)
    with pytest.raises(ThermoLensInputError, match=r"\[d_model, d_head\]"):
        SheafLaplacian.from_pattern(torch.eye(2), torch.randn(2, 4, 2))
    with pytest.raises(ThermoLensInputError, match="'directed'.*'symmetrized'"):
        SheafLaplacian.from_pattern(torch.eye(2), W, convention="undirected")
    L = SheafLaplacian.from_pattern(torch.tensor([[1.0, 0.0], [0.5, 0.5]]), W)
    with pytest.raises(ThermoLensInputError, match="no edge"):
        L.restriction_map(1, 1)
    with pytest.raises(ThermoLensInputError, match="out of range"):
        L.restriction_map(0, 2)
    with pytest.raises(ThermoLensInputError, match="expected n \\* d_model"):
        L @ torch.randn(7)
    with pytest.raises(ThermoLensInputError, match=r"\[\.\.\., 2, 4\]"):
        L @ torch.randn(3, 4)
    with pytest.raises(ThermoLensInputError, match="i != j"):
        L.restriction_maps()[0, 0]


def test_json_round_trip_and_frames():
    A, W = random_case(4, 5, 2, True, False, False, 7)
    L = SheafLaplacian.from_pattern(A, W, layer=2, head=1, tokens=("a", "b", "c", "d"))
    L2 = SheafLaplacian.from_json(L.to_json())
    assert torch.equal(L2.pattern, L.pattern) and torch.equal(L2.W_V, L.W_V)
    assert (L2.layer, L2.head, L2.tokens, L2.convention) == (2, 1, ("a", "b", "c", "d"), "directed")
    assert torch.equal(L2.eigenvalues(), L.eigenvalues())
    df = L.to_frame()
    assert list(df["token"]) == ["a", "b", "c", "d"]
    assert df["trace_contribution"].sum() == pytest.approx(L.trace())
    assert "layer 2, head 1" in repr(L) and "directed" in repr(L)


# ---------------------------------------------------------------------------- multi-head
def test_layer_block_diagonal_and_shared_stalks():
    rng = np.random.default_rng(3)
    H, n, d, dh = 3, 4, 5, 2
    A = np.stack([random_case(n, d, dh, h != 1, False, False, 10 + h)[0] for h in range(H)])
    W = rng.standard_normal((H, d, dh))
    LL = LayerSheafLaplacian.from_patterns(torch.tensor(A), torch.tensor(W), layer=0)
    refs = [coboundary(A[h], W[h], "directed") for h in range(H)]
    blocks = [r.T @ r for r in refs]
    dense = np.zeros((H * n * d, H * n * d))
    for h, b in enumerate(blocks):
        dense[h * n * d:(h + 1) * n * d, h * n * d:(h + 1) * n * d] = b
    np.testing.assert_allclose(LL.dense().numpy(), dense, atol=1e-12)
    assert LL.trace() == pytest.approx(sum(np.trace(b) for b in blocks), rel=1e-12)
    assert LL.trace() == pytest.approx(sum(LL[h].trace() for h in range(H)), rel=1e-12)
    np.testing.assert_allclose(LL.eigenvalues().numpy(), np.linalg.eigvalsh(dense), atol=1e-10)
    x = rng.standard_normal(H * n * d)
    np.testing.assert_allclose((LL @ torch.tensor(x)).numpy(), dense @ x, atol=1e-11)
    assert LL.spectral_gap().kernel_dim == sum(LL[h].kernel_dim for h in range(H))
    # Shared token stalks, edge stalk R^{H d_head}: delta stacks the heads' coboundaries row-wise,
    # so L = sum_h L_h (not block-diagonal); the trace is still the sum of head traces.
    delta_shared = np.concatenate(refs, axis=0)
    shared = LL.dense(structure="shared_stalks").numpy()
    np.testing.assert_allclose(shared, delta_shared.T @ delta_shared, atol=1e-12)
    assert np.trace(shared) == pytest.approx(LL.trace(), rel=1e-12)
    with pytest.raises(ThermoLensInputError, match="direct_sum"):
        LL.dense(structure="other")
    LL2 = LayerSheafLaplacian.from_json(LL.to_json())
    assert LL2.trace() == LL.trace() and len(LL2) == H


# ---------------------------------------------------------------------------- from a model
def _cached_patterns(view, prompt, prepend_bos=True):
    batch = tokenize(view, [prompt], prepend_bos=prepend_bos)
    names = set(view.pattern_hook_names)
    _, cache = view.model.run_with_cache(batch.tokens, names_filter=lambda n: n in names)
    return [cache[view.pattern_hook_name(l)][0].double() for l in range(view.n_layers)]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa", "bert"])
def test_model_laplacian_matches_cache_and_hf_weights(arch, bridge, hf_model):
    view = ModelView(bridge(arch))
    layer, head = 1, 3
    L = sheaf_laplacian(view, PROMPT, layer, head)
    A = _cached_patterns(view, PROMPT)[layer][head].numpy()
    W_all, _, meta = hf_head_weights(arch, hf_model(arch), layer)
    kv = head // (meta["n"] // meta["nkv"])
    W = W_all[kv].double().numpy()
    assert L.kv_head == kv and (L.layer, L.head) == (layer, head)
    np.testing.assert_allclose(L.pattern.numpy(), A, atol=1e-6)
    np.testing.assert_allclose(L.W_V.numpy(), W, atol=1e-6)
    delta = coboundary(L.pattern.numpy(), W, "directed")
    ref = delta.T @ delta
    np.testing.assert_allclose(L.dense().numpy(), ref, atol=1e-9)
    np.testing.assert_allclose(L.eigenvalues().numpy(), np.linalg.eigvalsh(ref), atol=1e-9)
    assert L.trace() == pytest.approx((A.shape[0] - np.trace(A)) * (W ** 2).sum(), rel=1e-5)
    assert L.is_diagonal == (arch != "bert")  # causal -> M diagonal; BERT couples tokens
    assert L.tokens is not None and len(L.tokens) == A.shape[0]
    assert L.model["weights"] == "raw" and L.prepend_bos is True


def test_model_layer_laplacian_is_sum_of_heads(bridge, hf_model):
    view = ModelView(bridge("llama_gqa"))
    LL = sheaf_laplacian(view, PROMPT, -1)  # last layer, all heads
    assert isinstance(LL, LayerSheafLaplacian) and LL.layer == 2 and LL.n_heads == 4
    pats = _cached_patterns(view, PROMPT)[2]
    W_all = hf_head_weights("llama_gqa", hf_model("llama_gqa"), 2)[0].double()
    expected = sum((pats.shape[-1] - torch.trace(pats[h])) * W_all[h // 2].pow(2).sum() for h in range(4))
    assert LL.trace() == pytest.approx(float(expected), rel=1e-5)
    assert [h.kv_head for h in LL.heads] == [0, 0, 1, 1]
    torch.testing.assert_close(LL.eigenvalues(), torch.sort(torch.cat([LL[h].eigenvalues() for h in range(4)])).values)
    # the same Laplacian from a pass that also ran other reductions (profile-style)
    got = collect(view, [PROMPT], [attention_pattern(2), residual_norms], prepend_bos=True)
    again = laplacian_from_collected(got, 2, 1, convention="symmetrized")
    assert again.convention == "symmetrized" and again.trace() == pytest.approx(LL[1].trace(), rel=1e-12)


def test_model_laplacian_bad_inputs(bridge):
    m = bridge("gpt2")
    with pytest.raises(ThermoLensInputError, match="one prompt string"):
        sheaf_laplacian(m, [PROMPT], 0, 0)
    with pytest.raises(ThermoLensInputError, match="layer=3 is out of range"):
        sheaf_laplacian(m, PROMPT, 3, 0)
    with pytest.raises(ThermoLensInputError, match="head=4 is out of range"):
        sheaf_laplacian(m, PROMPT, 0, 4)
    with pytest.raises(ThermoLensInputError, match="convention"):
        sheaf_laplacian(m, PROMPT, 0, 0, convention="sym")
    got = collect(m, [PROMPT], [residual_norms], prepend_bos=True)
    with pytest.raises(ThermoLensInputError, match=r"attention_pattern\(1, 2\)"):
        laplacian_from_collected(got, 1, 2)


# ---------------------------------------------------------------------------- traces, one pass
@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa", "bert", "falcon"])
def test_traces_from_hook_diagonal_equal_full_cached_pattern(arch, bridge, hf_model):
    view = ModelView(bridge(arch))
    t = sheaf_traces(view, PROMPTS, batch_size=2)  # two batches of different padded widths
    W_V, _ = hf_all_head_weights(arch, hf_model(arch))  # [L, n_kv, d_model, d_head], from HF
    group = view.n_heads // W_V.shape[1]
    wv2 = W_V.double().pow(2).sum(dim=(-1, -2))[:, torch.arange(view.n_heads) // group]  # [L, H]
    assert t.trace.shape == (len(PROMPTS), view.n_layers, view.n_heads)
    torch.testing.assert_close(t.W_V_frob_sq, wv2, rtol=1e-6, atol=0)
    for p, prompt in enumerate(PROMPTS):
        pats = _cached_patterns(view, prompt)
        n = pats[0].shape[-1]
        assert int(t.n_tokens[p]) == n
        for l in range(view.n_layers):
            off = n - torch.diagonal(pats[l], dim1=-2, dim2=-1).sum(-1)  # [H]
            torch.testing.assert_close(t.off_diagonal_mass[p, l], off, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(t.trace[p, l], off * wv2[l], rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(t.attention_mass[p, l], pats[l].sum(dim=(-1, -2)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(t.layer_trace, t.trace.sum(-1))
    torch.testing.assert_close(t.mean_layer_trace, t.trace.sum(-1).mean(0))
    assert t.model["post_ln"] == (arch == "bert")


def test_traces_agree_with_laplacian_and_collected(bridge):
    view = ModelView(bridge("gpt2"))
    t = sheaf_traces(view, PROMPTS, prepend_bos=False)
    L = sheaf_laplacian(view, PROMPTS[2], 2, None, prepend_bos=False)
    assert float(t.layer_trace[2, 2]) == pytest.approx(L.trace(), rel=1e-5)
    # pure function on a shared pass gives the same numbers
    got = collect(view, PROMPTS, [residual_norms, attention_diagonal], prepend_bos=False)
    t2 = traces_from_collected(got)
    torch.testing.assert_close(t2.trace, t.trace)
    assert t2.prepend_bos is False and t.prepend_bos is False
    with pytest.raises(ThermoLensInputError, match="attention_diagonal"):
        traces_from_collected(collect(view, PROMPTS, [residual_norms], prepend_bos=False))


def test_paper_printed_formula_is_zero_and_warns(bridge):
    view = ModelView(bridge("llama_gqa"))
    with pytest.warns(UserWarning, match="identically 0 for softmax"):
        paper = sheaf_traces(view, PROMPTS, formula="paper_printed")
    good = sheaf_traces(view, PROMPTS)
    assert paper.formula == "paper_printed" and "identically 0" in paper.definition
    assert paper.trace.abs().max() <= 1e-5 * good.trace.abs().max()
    assert good.trace.min() > 0
    torch.testing.assert_close(paper.off_diagonal_mass, good.off_diagonal_mass)
    with pytest.raises(ThermoLensInputError, match="off_diagonal_mass"):
        sheaf_traces(view, PROMPTS, formula="printed")


def test_user_hook_composes(bridge):
    view = ModelView(bridge("gpt2"))

    def only_self(pattern, hook):  # every token attends only to itself in layer 0
        eye = torch.eye(pattern.shape[-1], dtype=pattern.dtype)
        return eye.expand_as(pattern).clone()

    t = sheaf_traces(view, PROMPTS, fwd_hooks=[("blocks.0.attn.hook_pattern", only_self)])
    assert torch.all(t.trace[:, 0] == 0)
    assert torch.all(t.trace[:, 1:] > 0)


def test_traces_result_frame_json_repr(bridge):
    view = ModelView(bridge("llama_gqa"))
    t = sheaf_traces(view, PROMPTS)
    df = t.to_frame()
    assert len(df) == len(PROMPTS) * view.n_layers * view.n_heads
    assert {"prompt", "text", "layer", "head", "kv_head", "trace", "formula", "prepend_bos", "weights", "dtype", "post_ln"} <= set(df.columns)
    # prompt is the index in the prompt list (as in the gain, attribution and sweep frames), text the prompt
    assert df["prompt"].dtype.kind == "i" and df["prompt"].equals(df["prompt_index"])
    assert list(df.drop_duplicates("prompt")["text"]) == list(t.prompts)
    row = df[(df.prompt_index == 2) & (df.layer == 1) & (df["head"] == 3)].iloc[0]
    assert row.trace == pytest.approx(float(t.trace[2, 1, 3])) and row.kv_head == 1
    t2 = SheafTraces.from_json(t.to_json())
    assert torch.equal(t2.trace, t.trace) and t2.prompts == t.prompts and t2.model == t.model
    json.loads(t.to_json())
    r = repr(t)
    assert "off_diagonal_mass" in r and "BOS=True" in r and "weights raw" in r
    assert t.mean_trace == pytest.approx(float(t.mean_layer_trace.mean()))


@pytest.mark.slow
def test_benchmark_script_runs_quick():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sheaf.py"), "--quick"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ratio" in out.stdout


def test_processed_weights_warn_and_are_recorded(bridge):
    view = ModelView(bridge("gpt2"))
    view.weights_processed = True  # as after compatibility mode (the view only; the bridge is untouched)
    with pytest.warns(UserWarning, match="weights are processed"):
        t = sheaf_traces(view, PROMPTS[:1])
    assert t.model["weights"] == "processed" and "weights processed" in repr(t)
    with pytest.warns(UserWarning, match="weights are processed"):
        L = sheaf_laplacian(view, PROMPT, 0, 0)
    assert L.model["weights"] == "processed"


def test_gap_is_zero_whatever_the_mask_and_row_sums_fix_the_spectrum():
    """lambda_2 = 0 for any head with d_head < d_model, causal or not (the W_V^T kernel in every
    stalk); the row-sum weighting c_ij = A_ij is a choice: the column-sum reading c_ij = A_ji has the
    same trace and a different spectrum (both from the dense coboundary of the definition)."""
    for causal in (True, False):
        A, W = random_case(5, 4, 2, causal=causal, sparse=False, low_rank=False, seed=3)
        L = SheafLaplacian.from_pattern(torch.tensor(A), torch.tensor(W))
        ev = np.linalg.eigvalsh(coboundary(A, W, "directed").T @ coboundary(A, W, "directed"))
        assert abs(ev[1]) < 1e-10 and L.spectral_gap().value == 0.0
        assert "whatever the attention mask" in L.spectral_gap().reason
        assert "row-sum weighting" in L.spectral_gap().reason
    # column-sum reading: token i's end of edge {i, j} weighted by A_ji. Bidirectional, so the
    # readings differ off the diagonal too.
    A, W = random_case(5, 3, 3, causal=False, sparse=False, low_rank=False, seed=7)
    row = coboundary(A, W, "directed")
    col = coboundary(A.T, W, "directed")  # c_ij = (A^T)_ij = A_ji
    L_row, L_col = row.T @ row, col.T @ col
    assert np.trace(L_row) == pytest.approx(np.trace(L_col))
    assert not np.allclose(np.linalg.eigvalsh(L_row), np.linalg.eigvalsh(L_col), atol=1e-6)
    lib = SheafLaplacian.from_pattern(torch.tensor(A), torch.tensor(W))
    np.testing.assert_allclose(np.sort(lib.eigenvalues().numpy()), np.linalg.eigvalsh(L_row), atol=1e-9)
    # causal: the row reading has M = diag(1 - A_ii), the column reading diag(sum_{j > i} A_ji)
    A, W = random_case(4, 3, 2, causal=True, sparse=False, low_rank=False, seed=1)
    row = coboundary(A, W, "directed")
    col = coboundary(A.T, W, "directed")
    assert np.trace(row.T @ row) == pytest.approx(np.trace(col.T @ col))
    assert not np.allclose(np.linalg.eigvalsh(row.T @ row), np.linalg.eigvalsh(col.T @ col), atol=1e-6)
