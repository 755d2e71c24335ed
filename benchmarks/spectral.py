"""Benchmark: the spectral signature against its arithmetic floor, and against the paper's protocol.

    python benchmarks/spectral.py             # GPT-2-small, GQA and LLaMA-7B-width geometries (~2 min)
    python benchmarks/spectral.py --quick     # smoke run (seconds)

Everything runs in this process, on random weights, with one torch thread (``--threads``), in
CPU seconds (``time.process_time``); each row is the median of ``--repeats`` runs, the floor and
ours alternating so that both see the same machine load.

**Floor table.** The *floor* is the float32 per-head Gram products ``W^T W`` of ``W_Q``, ``W_K``,
``W_V`` and ``W_O^T`` (batched matmuls of weights already in float32): every exact method computes
them (each head's ``sigma_max`` and the factors of its OV and QK circuits come from them), so no
exact signature costs less. *Ours* is :func:`thermo_lens.measures.spectral.signature_from_weights` with
``W_Q`` / ``W_K`` from the model's stored weights (bf16 at 7B width, float32 elsewhere): every
per-head, KV-head, OV and QK norm plus the paper's whole-layer norms (``layer_norm_method="auto"``:
Lanczos on CPU). The table splits ours into the per-head part (``layer_norms=False``) and the
whole-layer part (the rest), gives the whole-layer part's Lanczos steps per matrix and the time of
one step against one read of the stored layer matrix (the memory-traffic floor of a step), the
*bound* (the ratio a method would reach whose only costs are the floor's Gram products and one
read of the stored layer matrix per Lanczos step: no exact Krylov method reads less), the
peak RSS growth of ours (sampled by a thread), and the largest relative difference from dense
float64 SVDs (every head and layer on the small geometries; at 7B width 8 heads per metric and
the whole-layer matrices of one layer).

**Baseline table.** Ours against the paper's protocol (a Python loop over heads calling
``np.linalg.norm(W, 2)``, which computes no OV norm: the ratio is conservative), factored OV norms
against ``svdvals`` of the dense ``d_model x d_model`` product, and the whole-layer ``W_V`` norm
against ``np.linalg.norm(W_layer, 2)``; slow baselines run on a subsample of heads / layers whose
time is scaled to the whole model (each head / layer is an independent computation of the same
size; the ``baseline on`` column says so).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PeakRSS, release_freed_memory  # noqa: E402
from _weights import StepCounter, dense_errors, random_weights  # noqa: E402

import thermo_lens.measures.spectral.kernels as kernels  # noqa: E402
from thermo_lens.measures.spectral import matrix_spectral_norm, ov_norm_factored, signature_from_weights  # noqa: E402

#: name -> (layers, heads, KV heads, d_model, d_head, stored dtype, spike rank); ``--quick`` shrinks them.
GEOMETRIES = {
    "GPT-2-small": (12, 12, 12, 768, 64, torch.float32, 0),
    "GQA (LLaMA-3-8B width, 8 layers)": (8, 32, 8, 4096, 128, torch.bfloat16, 0),
    "LLaMA-7B width (8 layers)": (8, 32, 32, 4096, 128, torch.bfloat16, 0),
    "LLaMA-7B width, spiked (8 layers)": (8, 32, 32, 4096, 128, torch.bfloat16, 8),
}
QUICK = {
    "GPT-2-small": (2, 4, 4, 64, 16, torch.float32, 0),
    "GQA (LLaMA-3-8B width, 8 layers)": (2, 4, 2, 96, 16, torch.bfloat16, 0),
    "LLaMA-7B width (8 layers)": (2, 4, 4, 128, 32, torch.bfloat16, 0),
    "LLaMA-7B width, spiked (8 layers)": (2, 4, 4, 128, 32, torch.bfloat16, 2),
}


def cpu(fn):
    """(CPU seconds, result) of one call."""
    gc.collect()
    c = time.process_time()
    out = fn()
    return time.process_time() - c, out


def gram_floor(w):
    """The floor: float32 per-head Gram products of every stored weight, a layer at a time (the
    conversion to float32 is outside the timed region)."""
    total = 0.0
    for name, W in w.items():
        buf = torch.empty(W.shape[1:], dtype=torch.float32)
        for l in range(W.shape[0]):
            buf.copy_(W[l])
            c = time.process_time()
            _ = buf @ buf.mT if name == "W_O" else buf.mT @ buf
            total += time.process_time() - c
    return total


def step_times(w, repeats=20):
    """(CPU s of one Lanczos step on layer 0's value matrix, CPU s of one plain read of it)."""
    W_V = w["W_V"][0]
    K, d_model, d_head = W_V.shape
    V = W_V.permute(1, 0, 2).reshape(d_model, K * d_head)  # row-major, as the whole-layer norms read it
    op = kernels._GramOperator(V, torch.float32)
    x, out = torch.randn(V.shape[1]), torch.empty(V.shape[1])
    t_step, _ = cpu(lambda: [op(x, out) for _ in range(repeats)])
    t_read, _ = cpu(lambda: [V.sum() for _ in range(repeats)])
    return t_step / repeats, t_read / repeats


def floor_table(names, geometries, repeats, check):
    print(f"\nthe arithmetic floor: float32 per-head Gram products of W_Q, W_K, W_V, W_O (CPU s, median of {repeats}, "
          f"{torch.get_num_threads()} torch thread(s))")
    print(f"  {'geometry':<35}{'stored':>9}{'floor s':>9}{'ours s':>8}{'ratio':>7}{'per-head s':>12}{'ratio':>7}"
          f"{'layer s':>9}{'ratio':>7}{'steps':>7}{'step/read':>15}{'bound':>7}{'peak RSS':>10}{'max rel err':>13}")
    rows = {}
    for name in names:
        L, H, K, d_model, d_head, dtype, spike = geometries[name]
        w = random_weights(L, H, K, d_model, d_head, dtype, spike)

        def ours(layer_norms=True, w=w):
            return signature_from_weights(w["W_V"], w["W_O"], W_Q=w["W_Q"], W_K=w["W_K"], layer_norms=layer_norms)

        signature_from_weights(w["W_V"][:1], w["W_O"][:1], W_Q=w["W_Q"][:1], W_K=w["W_K"][:1])  # warm up
        release_freed_memory()
        with PeakRSS() as mem:  # the first run: nothing freed earlier in this process to reuse
            sig = ours()
        floors, alls, heads, steps = [], [], [], []
        for _ in range(repeats):
            floors.append(gram_floor(w))
            with StepCounter() as count:
                alls.append(cpu(ours)[0])
            steps.append(count.n)
            heads.append(cpu(lambda: ours(layer_norms=False))[0])
        peak = mem.growth
        f, a, h = (statistics.median(x) for x in (floors, alls, heads))
        lay = a - h
        t_step, t_read = step_times(w)
        err = dense_errors(w, sig, full=check == "full" or d_model <= 1024) if check else float("nan")
        mats = 2 * L
        # The least any Krylov method could cost here: the floor plus, per whole-layer matrix, the
        # Lanczos steps it needs, each at least one plain read of the stored matrix.
        bound = (f + statistics.median(steps) * t_read) / f  # steps: all matrices together
        print(f"  {name:<35}{str(dtype).replace('torch.', ''):>9}{f:>9.3f}{a:>8.3f}{a / f:>6.2f}x{h:>12.3f}{h / f:>6.2f}x"
              f"{lay:>9.3f}{lay / f:>6.2f}x{statistics.median(steps) / mats:>7.1f}"
              f"{1e3 * t_step:>7.2f}/{1e3 * t_read:.2f} ms{bound:>6.2f}x{peak / 2**20:>7.0f} MiB{err:>13.1e}")
        rows[name] = dict(floor=f, ours=a, ratio=a / f, per_head=h / f, layer=lay / f, bound=bound)
        del w, sig
    print("  ratio = ours / floor; per-head: every per-head, KV-head, OV and QK norm (layer_norms=False); layer: the "
          "whole-layer norms (ours - per-head); steps: Lanczos steps per whole-layer matrix; step/read: one step "
          "against one plain read of the stored layer matrix (its memory-traffic floor); bound: (floor + steps x read "
          "per whole-layer matrix) / floor, the ratio of a method with no cost beyond the Gram products and one read "
          "of each layer matrix per Lanczos step")
    return rows


def model_row(quick, repeats):
    """``spectral_signature(model)`` on a random-weight bf16 LLaMA-7B-width model (8 layers; MLP
    and vocabulary shrunk, which the signature never reads) booted as a ``TransformerBridge``:
    the user's path, weights read from the model a layer at a time, against the same floor."""
    import tempfile

    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    from thermo_lens.core.model import ModelView
    from thermo_lens.measures.spectral import spectral_signature
    from thermo_lens.testing import make_tokenizer

    transformers.utils.logging.disable_progress_bar()
    L, H, d_model = (2, 4, 128) if quick else (8, 32, 4096)
    tok = make_tokenizer()
    cfg = transformers.LlamaConfig(hidden_size=d_model, num_hidden_layers=L, num_attention_heads=H,
                                   num_key_value_heads=H, intermediate_size=64, max_position_embeddings=256,
                                   vocab_size=len(tok), bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        model = TransformerBridge.boot_transformers(tmp, dtype=torch.bfloat16)
    view = ModelView(model)
    w = {n: torch.stack([view.stored_weights(n, l) for l in range(L)]) for n in ("W_V", "W_O", "W_Q", "W_K")}
    spectral_signature(model, cache=False, layers=[0])  # warm up
    release_freed_memory()
    with PeakRSS() as mem:
        sig = spectral_signature(model, cache=False)
    floors, alls, heads = [], [], []
    for _ in range(repeats):
        floors.append(gram_floor(w))
        alls.append(cpu(lambda: spectral_signature(model, cache=False))[0])
        heads.append(cpu(lambda: spectral_signature(model, cache=False, layer_norms=False))[0])
    f, a, h = (statistics.median(x) for x in (floors, alls, heads))
    err = dense_errors({n: t.float() for n, t in w.items()}, sig, full=quick)
    name = "model path: bridge, 7B width"
    print(f"  {name:<35}{'bfloat16':>9}{f:>9.3f}{a:>8.3f}{a / f:>6.2f}x{h:>12.3f}{h / f:>6.2f}x"
          f"{a - h:>9.3f}{(a - h) / f:>6.2f}x{'':>7}{'':>15}{mem.growth / 2**20:>7.0f} MiB{err:>13.1e}")


# ------------------------------------------------------------------------------ baselines


def timed(fn, repeats):
    """(median wall seconds, last result)."""
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
          f"{torch.get_num_threads()} torch threads, wall s; ours: median of {repeats}, baselines: median of "
          f"{base_repeats}; subsampled times scaled to the whole model)")
    print(f"  {'what':<27}{'baseline s':>11}{'ours s':>9}{'speed-up':>10}{'max rel err':>13}  baseline on")
    for what, tb, to, e, note in rows:
        print(f"  {what:<27}{tb:>11.3f}{to:>9.3f}{tb / to:>9.1f}x{e:>13.1e}  {note}")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny geometries, one repeat (smoke test)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0: torch's default)")
    p.add_argument("--only", action="append", choices=list(GEOMETRIES), help="floor table: only these geometries")
    p.add_argument("--check", choices=["sample", "full", "none"], default="sample",
                   help="dense float64 reference: every head and layer up to d_model 1024, a sample above (default)")
    p.add_argument("--skip-baselines", action="store_true", help="only the floor table")
    p.add_argument("--model", action="store_true",
                   help="floor table: also spectral_signature(model) on a bf16 LLaMA-7B-width bridge (8 layers)")
    p.add_argument("--skip-large", action="store_true", help="baseline table: only the GPT-2-small geometry")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    # On shared cores the load average says how far to trust the seconds (the ratios are measured
    # side by side, so both sides see the same load).
    print("load average (1, 5, 15 min):", ", ".join(f"{x:.1f}" for x in os.getloadavg()),
          f"on {os.cpu_count()} cores; torch {torch.__version__}")
    check = None if args.check == "none" else args.check
    if args.quick:
        floor_table(list(QUICK), QUICK, 1, check)
        model_row(True, 1)
        bench("quick", 2, 4, 64, 16, repeats=1, base_repeats=1, ours_layers=2, loop_heads=8,
              ov_heads=8, ov_fac_heads=8, dense_layers=2)
        return
    floor_table(args.only or list(GEOMETRIES), GEOMETRIES, args.repeats, check)
    if args.model:
        model_row(False, args.repeats)
    if args.skip_baselines:
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
