"""Sheaf benchmarks: ratios against baselines measured in the same run.

1. Exact spectrum of the sheaf Laplacian from its factors (``SheafLaplacian.eigenvalues``) vs
   dense assembly ``kron(M, W_V W_V^T)`` + ``torch.linalg.eigvalsh``, where dense is feasible.
2. The largest ``(n, d_model)`` each approach reaches within 10 s (sweeping upward).
3. Traces of every head of a GPT-2-small-geometry random model (12 layers, d_model 768, 12 heads)
   over the paper's 25 prompts (``sheaf_traces``: one pass, pattern reduced to its diagonal in the
   hook) vs a bare forward pass of the same batches (target <= 1.10x), and vs caching the full
   patterns with ``run_with_cache``.

Usage: ``python benchmarks/sheaf.py [--quick]`` (``--quick``: tiny sizes, a smoke run).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from thermo_lens.measures.sheaf import SheafLaplacian, sheaf_traces  # noqa: E402
from thermo_lens.core.tokens import tokenize  # noqa: E402

BUDGET_S = 10.0


def random_case(n: int, d_model: int, d_head: int, causal: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, n, generator=g, dtype=torch.float64)
    if causal:
        logits = logits.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    A = torch.softmax(logits, dim=-1)
    W = torch.randn(d_model, d_head, generator=g, dtype=torch.float64) / d_model**0.5
    return A, W


def time_factored(n, d, dh, convention, causal):
    A, W = random_case(n, d, dh, causal)
    t0 = time.perf_counter()
    ev = SheafLaplacian.from_pattern(A, W, convention).eigenvalues()
    return time.perf_counter() - t0, ev


def time_dense(n, d, dh, convention, causal):
    A, W = random_case(n, d, dh, causal)
    L = SheafLaplacian.from_pattern(A, W, convention)
    t0 = time.perf_counter()
    ev = torch.linalg.eigvalsh(torch.kron(L.M, W @ W.T))
    return time.perf_counter() - t0, ev


def d_head_for(d_model: int) -> int:
    return max(1, min(64, d_model // 4))


def spectrum_ratios(sizes, reps):
    print("1. exact spectrum: factors vs dense kron + torch.linalg.eigvalsh (float64)")
    print(f"   {'convention':<22}{'n':>6}{'d_model':>9}{'d_head':>8}{'n*d_model':>11}"
          f"{'dense s':>10}{'factored s':>12}{'ratio':>10}{'max |diff|':>12}")
    for convention, causal in (("directed (causal)", True), ("symmetrized", False)):
        conv = convention.split()[0]
        for n, d in sizes:
            dh = d_head_for(d)
            dense = [time_dense(n, d, dh, conv, causal) for _ in range(reps)]
            fact = [time_factored(n, d, dh, conv, causal) for _ in range(max(reps, 3))]
            td, tf = min(t for t, _ in dense), min(t for t, _ in fact)
            err = float((dense[0][1] - fact[0][1]).abs().max())
            print(f"   {convention:<22}{n:>6}{d:>9}{dh:>8}{n * d:>11}{td:>10.4f}{tf:>12.5f}"
                  f"{td / tf:>9.0f}x{err:>12.2e}")


def sweep(label, fn, steps, budget, max_rows):
    """Run ``fn(n, d)`` upward through ``steps`` while it fits in ``budget`` seconds."""
    best, last_t, last_rows = None, None, None
    for n, d in steps:
        rows = n * d
        if rows > max_rows:
            break
        if last_t is not None:  # skip a step predicted to run far past the budget
            exponent = 3 if label == "dense" else 1.5
            if last_t * (rows / last_rows) ** exponent > 4 * budget:
                break
        t = fn(n, d)
        print(f"   {label:<9} n={n:<6} d_model={d:<6} n*d_model={rows:<10} {t:8.3f} s")
        if t > budget:
            break
        best, last_t, last_rows = (n, d, t), t, rows
    return best


def reach(budget, max_dense_rows, max_factored_rows):
    print(f"2. largest (n, d_model) within {budget:g} s (symmetrized convention: M is a full n x n "
          "matrix; d_head = min(64, d_model/4))")
    steps, n, d = [], 8, 8
    while n * d <= max(max_dense_rows, max_factored_rows):
        steps.append((n, d))
        if n <= d:
            n *= 2
        else:
            d *= 2
    dense = sweep("dense", lambda n, d: time_dense(n, d, d_head_for(d), "symmetrized", False)[0], steps, budget, max_dense_rows)
    fact = sweep("factored", lambda n, d: time_factored(n, d, d_head_for(d), "symmetrized", False)[0], steps, budget, max_factored_rows)
    for label, b, cap in (("dense", dense, max_dense_rows), ("factored", fact, max_factored_rows)):
        if b:
            print(f"   -> {label}: n={b[0]}, d_model={b[1]} (n*d_model = {b[0] * b[1]}) in {b[2]:.2f} s"
                  f"{'' if b[0] * b[1] * 2 <= cap else f' (size cap {cap} rows reached)'}")
    if dense and fact:
        print(f"   reach ratio (rows of L, factored / dense): {fact[0] * fact[1] / (dense[0] * dense[1]):.0f}x")


def make_model(quick: bool, directory: str):
    from transformer_lens.model_bridge import TransformerBridge

    from _common import build_checkpoint

    path = build_checkpoint("gpt2", directory, quick, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return TransformerBridge.boot_transformers(str(path))


def paper_prompts(quick: bool) -> list[str]:
    from thermo_lens.core import prompts

    ps = list(prompts.get("paper25").prompts)
    return ps[:5] if quick else ps


def traces_ratio(quick: bool, reps: int):
    from thermo_lens.core.model import ModelView

    prompts = paper_prompts(quick)
    with tempfile.TemporaryDirectory() as tmp:
        view = ModelView(make_model(quick, tmp))
        bs = 8
        batches = [tokenize(view, prompts[i:i + bs], prepend_bos=True) for i in range(0, len(prompts), bs)]
        names = set(view.pattern_hook_names)

        def bare():
            for b in batches:
                view.run(b.tokens, b.mask)

        def traces():
            return sheaf_traces(view, prompts, batch_size=bs, progress=False)

        def cached():  # the naive way: cache every n x n pattern, then reduce
            for b in batches:
                with torch.inference_mode():
                    _, cache = view.model.run_with_cache(b.tokens, attention_mask=b.mask.long(),
                                                         names_filter=lambda n: n in names, return_type=None)
                for name in names:
                    torch.diagonal(cache[name], dim1=-2, dim2=-1).sum(-1)

        fns = {"bare forward": bare, "sheaf_traces": traces}
        for f in fns.values():  # warm-up
            f()
        times = {k: [] for k in fns}
        for _ in range(reps):  # interleaved, so both see the same machine noise; min of reps
            for k, f in fns.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cached()
        times["run_with_cache patterns"] = [time.perf_counter() - t0]
        med = {k: min(v) for k, v in times.items()}
        n_tok = sum(int(b.lengths.sum()) for b in batches)
        print(f"3. traces of all heads: {view.n_layers} layers x {view.n_heads} heads, d_model "
              f"{view.d_model}, {len(prompts)} prompts ({n_tok} real tokens, batch {bs}), min of {reps} "
              "interleaved runs (run_with_cache: 1 run)")
        for k, v in med.items():
            print(f"   {k:<26}{v:8.3f} s")
        print(f"   ratio sheaf_traces / bare forward: {med['sheaf_traces'] / med['bare forward']:.3f}x "
              "(target <= 1.10x)")
        print(f"   ratio run_with_cache patterns / bare forward: {med['run_with_cache patterns'] / med['bare forward']:.3f}x")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: steady ratios on a shared machine, where 2 "
                         "OpenMP threads oversubscribed swing timings by 2x; 0 = torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    for k in (64, 256):  # warm up LAPACK / the thread pool before anything is timed
        a = torch.randn(k, k, dtype=torch.float64)
        torch.linalg.eigvalsh(a + a.T)
    t0 = time.perf_counter()
    if args.quick:
        spectrum_ratios([(8, 16), (16, 16)], reps=1)
        reach(budget=0.2, max_dense_rows=512, max_factored_rows=4096)
        traces_ratio(quick=True, reps=1)
    else:
        spectrum_ratios([(16, 32), (32, 32), (32, 64)], reps=2)
        reach(budget=BUDGET_S, max_dense_rows=8192, max_factored_rows=2**24)
        traces_ratio(quick=False, reps=3)
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
