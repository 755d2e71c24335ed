"""Shared by the spectral benchmarks (``spectral.py`` on the CPU, ``gpu.py`` on a device): random
stacked attention weights, a counter of Lanczos steps, and float64 references for the signature."""

from __future__ import annotations

import torch

import thermo_lens.measures.spectral.kernels as kernels


def random_weights(L, H, K, d_model, d_head, dtype, spike=0, seed=0, device="cpu"):
    """``W_V, W_O, W_Q, W_K`` stored in ``dtype`` on ``device``, generated there a layer at a time
    (no float32 copy of the whole model), Gaussian with entries of variance ``1 / d_model`` (a
    square layer matrix has its top singular values crowded at the Marchenko-Pastur edge ~2, the
    slowest case for Krylov methods). ``spike``: plus a rank-``spike`` term on each whole-layer
    matrix with singular values 6 to 3 (top singular values that stand apart from the bulk)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shapes = {"W_V": (K, d_model, d_head), "W_O": (H, d_head, d_model), "W_Q": (H, d_model, d_head),
              "W_K": (K, d_model, d_head)}
    out = {}
    for name, (n, a, b) in shapes.items():
        w = torch.empty(L, n, a, b, dtype=dtype, device=device)
        for l in range(L):
            x = torch.randn(n, a, b, generator=gen, device=device) / d_model**0.5
            if spike:
                # the layer matrix: heads side by side ([a, n * b]) or stacked ([n * a, b], W_O)
                M = x.reshape(n * a, b) if name == "W_O" else x.permute(1, 0, 2).reshape(a, n * b)
                U = torch.linalg.qr(torch.randn(M.shape[0], spike, generator=gen, device=device))[0]
                V = torch.linalg.qr(torch.randn(M.shape[1], spike, generator=gen, device=device))[0]
                M = M + (U * torch.linspace(6, 3, spike, device=device)) @ V.T
                x = M.reshape(n, a, b) if name == "W_O" else M.reshape(a, n, b).permute(1, 0, 2)
            w[l] = x
        out[name] = w
    return out


class StepCounter:
    """Counts Lanczos steps: ``n``, the steps each matrix took to stop, summed over matrices (one
    product of the per-matrix operator = one step = one read of the matrix; on the batched path,
    the step at which each matrix stopped, plus one); ``batched``, the batched steps executed (all
    matrices of a stack at once, up to the last to stop)."""

    def __enter__(self):
        from thermo_lens.measures.spectral import lanczos

        self.n, self.batched = 0, 0
        self._orig = kernels._GramOperator.__call__
        self._batched = lanczos.lanczos_sigma_max_batched

        def counted(op, x, out):
            self.n += 1
            return self._orig(op, x, out)

        def counted_batched(M, *a, **k):
            sigma, stopped = self._batched(M, *a, **k)
            self.n += int((stopped + 1).sum())
            self.batched += int(stopped.max()) + 1
            return sigma, stopped

        kernels._GramOperator.__call__ = counted
        lanczos.lanczos_sigma_max_batched = counted_batched
        return self

    def __exit__(self, *exc):
        from thermo_lens.measures.spectral import lanczos

        kernels._GramOperator.__call__ = self._orig
        lanczos.lanczos_sigma_max_batched = self._batched


def layer_sigma64(w, l):
    """float64 ``sigma_max`` of layer ``l``'s whole value matrix ``[d_model, kv_head * d_head]`` and
    output matrix ``[head * d_head, d_model]``, from the largest eigenvalue of the smaller Gram
    matrix (not the Lanczos iteration the signature uses)."""
    W_V, W_O = w["W_V"][l].double(), w["W_O"][l].double()
    K, d_model, d_head = W_V.shape
    out = []
    for M in (W_V.permute(1, 0, 2).reshape(d_model, K * d_head), W_O.reshape(-1, d_model)):
        G = M.mT @ M if M.shape[1] <= M.shape[0] else M @ M.mT
        out.append(float(torch.linalg.eigvalsh(G)[-1].sqrt()))
    return out


def dense_errors(w, sig, full):
    """Largest relative difference of ``sig`` from float64 dense SVDs: every head and layer when
    ``full``, else 8 heads per metric and the whole-layer matrices of layer 0."""
    W_V, W_O, W_Q, W_K = (w[n].double() for n in ("W_V", "W_O", "W_Q", "W_K"))
    L, H = W_O.shape[:2]
    kv = sig.kv_head_of
    heads = [(l, h) for l in range(L) for h in range(H)]
    if not full:
        heads = heads[:: max(1, len(heads) // 8)][:8]
    err = 0.0

    def rel(got, want):
        return abs(float(got) - float(want)) / abs(float(want))

    for l, h in heads:
        v, o, q, k = W_V[l, kv[h]], W_O[l, h], W_Q[l, h], W_K[l, kv[h]]
        # The OV / QK circuits' sigma_max from float64 QR factors (v = Q_v R_v, o^T = Q_o R_o:
        # sigma(v o) = sigma(R_v R_o^T)), not from the Gram eigendecompositions ours uses.
        ov = torch.linalg.matrix_norm(torch.linalg.qr(v)[1] @ torch.linalg.qr(o.mT)[1].mT, ord=2)
        qk = torch.linalg.matrix_norm(torch.linalg.qr(q)[1] @ torch.linalg.qr(k)[1].mT, ord=2)
        for name, want in (("W_V_norm", torch.linalg.matrix_norm(v, ord=2)), ("W_O_norm", torch.linalg.matrix_norm(o, ord=2)),
                           ("ov_norm", ov), ("qk_norm", qk), ("W_V_frobenius", v.norm())):
            err = max(err, rel(sig.head_metrics[name][l, h], want))
    for l in range(L if full else 1):
        for got, want in zip((sig.layer_W_V_norm[l], sig.layer_W_O_norm[l]), layer_sigma64(w, l)):
            err = max(err, rel(got, want))
    return err
