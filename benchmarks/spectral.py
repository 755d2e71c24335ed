"""Benchmark: batched spectral signature vs the paper's per-head numpy loop; factored OV norms vs
SVD of the dense d_model x d_model product. Ratios are measured in this process, on random weights.

    python benchmarks/spectral.py            # GPT-2-small geometry + a 7B-class geometry
    python benchmarks/spectral.py --quick    # smoke run (seconds)

Rows (median of --repeats runs, wall-clock seconds, CPU):

* ``per-head norms``: :func:`thermo_lens.spectral.signature_from_weights` (every head's
  sigma_max / Frobenius / stable rank of W_V and W_O, **plus** the OV norms, batched) vs the paper's
  protocol, a Python loop over heads calling ``np.linalg.norm(W, 2)`` and ``np.linalg.norm(W)``
  (which computes no OV norm at all: the ratio is conservative).
* ``OV norms``: :func:`ov_norm_factored` (d_head x d_head Gram square roots, one eigvalsh) vs
  ``torch.linalg.svdvals(W_V @ W_O)`` on the dense d_model x d_model product (batched torch, the
  strongest dense baseline). The maximum relative difference is printed (target <= 1e-4).
* ``layer W_V norms``: the paper's whole-layer sigma_max of [d_model, H*d_head] (our
  :func:`matrix_spectral_norm`, "auto": Lanczos on CPU, batched SVD on GPU) vs
  ``np.linalg.norm(W_layer, 2)`` per layer.

Baselines run once and, where they are slow, on a subsample of heads / layers whose time is
scaled to the whole model (every head / layer is an independent computation of the same size); the
table says so in its ``baseline on`` column. On the large geometry (32 x 32 x 4096 x 128) a dense
4096 x 4096 SVD takes ~1 min on 2 cores, so the dense OV and whole-layer baselines run on one head /
one layer, the numpy loop on 8 heads, and ours on 2 of the 32 layers (scaled by 16).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from thermo_lens.spectral import matrix_spectral_norm, ov_norm_factored, signature_from_weights  # noqa: E402


def timed(fn, repeats):
    """(median seconds, last result)."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def paper_loop(wv, wo):
    """The paper's protocol: one numpy call per head and matrix."""
    L, H = wo.shape[:2]
    out = np.zeros((4, L, H))
    for l in range(L):
        for h in range(H):
            v, o = wv[l, h], wo[l, h]
            out[0, l, h] = np.linalg.norm(v, 2)
            out[1, l, h] = np.linalg.norm(o, 2)
            out[2, l, h] = np.linalg.norm(v) ** 2 / out[0, l, h] ** 2
            out[3, l, h] = np.linalg.norm(o) ** 2 / out[1, l, h] ** 2
    return out


def bench(name, L, H, d_model, d_head, *, repeats, base_repeats, ours_layers, loop_heads, ov_heads,
          ov_fac_heads, dense_layers):
    """One geometry. Our signature runs on ``ours_layers`` layers; the baselines on ``loop_heads``
    heads / ``ov_heads`` heads / ``dense_layers`` layers; every time is scaled to the whole model
    (each head / layer is an independent computation of the same size)."""
    gen = torch.Generator().manual_seed(0)
    Ls = min(L, max(ours_layers, dense_layers))  # only generate what is timed
    wv = torch.randn(Ls, H, d_model, d_head, generator=gen) / d_model**0.5
    wo = torch.randn(Ls, H, d_head, d_model, generator=gen) / d_model**0.5
    n_heads, n_gen = L * H, Ls * H
    signature_from_weights(wv[:1, :2, :8], wo[:1, :2, :, :8])  # warm up LAPACK / torch linalg
    rows = []

    # 1. per-head signature (all heads of `ours_layers` layers) vs the paper's numpy loop.
    lo = min(L, ours_layers)
    t_ours, sig = timed(lambda: signature_from_weights(wv[:lo], wo[:lo], layer_norms=False), repeats)
    m = min(lo * H, loop_heads)
    wv_np, wo_np = wv[:lo].flatten(0, 1)[:m, None].numpy(), wo[:lo].flatten(0, 1)[:m, None].numpy()
    t_base, ref = timed(lambda: paper_loop(wv_np, wo_np), base_repeats)
    got = np.stack([sig.W_V_norm.flatten()[:m].numpy(), sig.W_O_norm.flatten()[:m].numpy(),
                    sig.W_V_stable_rank.flatten()[:m].numpy(), sig.W_O_stable_rank.flatten()[:m].numpy()])
    err = float(np.max(np.abs(got - ref[:, :, 0]) / ref[:, :, 0]))
    note = "all" if m == n_heads else f"{m}/{n_heads} heads"
    rows.append(("per-head norms (+OV)", t_base * n_heads / m, t_ours * L / lo, err,
                 note + ("" if lo == L else f" (ours on {lo}/{L} layers)")))

    # 2. OV norms: factored vs SVD of the dense d_model x d_model product (batched torch).
    V, O = wv.reshape(n_gen, d_model, d_head), wo.reshape(n_gen, d_head, d_model)
    k, kf = min(n_gen, ov_heads), min(n_gen, ov_fac_heads)
    t_fac, ov = timed(lambda: ov_norm_factored(V[:kf], O[:kf]), repeats)
    t_den, dense = timed(lambda: torch.linalg.svdvals(V[:k] @ O[:k])[..., 0], base_repeats)
    err = float(((ov[:k] - dense).abs() / dense).max())
    rows.append(("OV norms", t_den * n_heads / k, t_fac * n_heads / kf, err,
                 "all" if k == n_heads else f"{k}/{n_heads} heads (ours on {kf}/{n_heads})"))

    # 3. the paper's whole-layer norms: sigma_max of [d_model, H*d_head] (W_V) per layer.
    m = min(L, dense_layers)
    WVl = wv.permute(0, 2, 1, 3).reshape(Ls, d_model, H * d_head)
    t_lay, (lv, method) = timed(lambda: matrix_spectral_norm(WVl[:m]), repeats)
    a = WVl[:m].numpy()
    t_lb, lref = timed(lambda: np.array([np.linalg.norm(x, 2) for x in a]), base_repeats)
    err = float(np.max(np.abs(lv.numpy() - lref) / lref))
    rows.append((f"layer W_V norms ({method})", t_lb * L / m, t_lay * L / m, err,
                 "all" if m == L else f"{m}/{L} layers (both)"))

    print(f"\n{name}: {L} layers x {H} heads, d_model={d_model}, d_head={d_head} (float32, "
          f"{torch.get_num_threads()} torch threads; ours: median of {repeats}, baselines: median of "
          f"{base_repeats}; subsampled times scaled to the whole model)")
    print(f"  {'what':<27}{'baseline s':>11}{'ours s':>9}{'speed-up':>10}{'max rel err':>13}  baseline on")
    for what, tb, to, e, note in rows:
        print(f"  {what:<27}{tb:>11.3f}{to:>9.3f}{tb / to:>9.1f}x{e:>13.1e}  {note}")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny geometry, one repeat (smoke test)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-large", action="store_true", help="only the GPT-2-small geometry")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    # On shared cores, MKL/OpenMP threads stall when another process holds a core (batched small
    # LAPACK calls slow down 10-100x); the load average says how far to trust the seconds.
    print("load average (1, 5, 15 min):", ", ".join(f"{x:.1f}" for x in os.getloadavg()),
          f"on {os.cpu_count()} cores")
    if args.quick:
        bench("quick", 2, 4, 64, 16, repeats=1, base_repeats=1, ours_layers=2, loop_heads=8,
              ov_heads=8, ov_fac_heads=8, dense_layers=2)
        return
    rows = bench("GPT-2-small geometry", 12, 12, 768, 64, repeats=args.repeats, base_repeats=args.repeats,
                 ours_layers=12, loop_heads=48, ov_heads=24, ov_fac_heads=144, dense_layers=4)
    ov = rows[1]
    print(f"  OV target: >= 20x on GPT-2-small, rel err <= 1e-4 -> {ov[1] / ov[2]:.1f}x, {ov[3]:.1e}")
    if not args.skip_large:
        bench("7B-class geometry (random weights)", 32, 32, 4096, 128, repeats=args.repeats,
              base_repeats=1, ours_layers=2, loop_heads=8, ov_heads=1, ov_fac_heads=32,
              dense_layers=1)

if __name__ == "__main__":
    main()
