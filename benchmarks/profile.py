"""Benchmark: the whole battery, ``profile()``, against a bare forward pass of the same prompts.

Every ratio is measured in this process, methods interleaved within each repeat, medians (and the
spread: min..max of the per-repeat ratios) over ``--repeats``. Models have random weights and are
built locally from configs (no downloads), with the tiny offline byte-level tokenizer of
``thermo_lens.testing`` (a small vocabulary, so prompts are longer in tokens than with a real
tokenizer). Prompts: the paper's 25 (``thermo_lens.core.prompts.get("paper25")``). All on CPU.

Models:

* ``GPT-2-small geometry``: GPT-2, 12 layers x d_model 768, 12 heads.
* ``deeper-narrower``: GPT-2, 24 layers x d_model 512, 8 heads.
* ``GQA``: LLaMA, 12 layers x d_model 768, 12 query heads / 4 KV heads.
* ``1B-class``: LLaMA-3.2-1B geometry, 16 layers x d_model 2048, 32 query heads / 8 KV heads of 64,
  MLP 8192, vocabulary 128,256 (tied embeddings), float32: 1.24B parameters, 5 GB. A full forward
  costs about 2.4 GFLOP per token, so this row runs the first ``--prompts-1b`` prompts (default 5)
  with 2 repeats and without the "best bare" forwards (its ratios to "best bare" are to the same
  batches): about three minutes on one thread, including building the checkpoint.

Embedding and unembedding have the real models' vocabulary sizes (50,257 for the GPT-2 ones,
32,000 for the LLaMA GQA row, 128,256 for the 1B-class row; the byte-level tokenizer uses only the
first ids), so a full forward pays the real ``d_model x d_vocab`` unembedding per token
(``--quick``: the tokenizer's own vocabulary).

``min/min (CPU)``: the fastest repeat of a method over the fastest bare repeat: on a shared
machine, noise only ever adds time, so this ratio is the least disturbed by other processes
(the per-repeat ratios above it can spread by +-20% on a busy 2-core VM).

Times are CPU seconds of this process (``time.process_time``; with one torch thread, the work
done), so that other processes on a shared machine do not enter the ratios; wall-clock seconds
and the wall-clock ratio are printed alongside. Per model, rows (and ratios to
``bare, same batches``):

* ``bare, same batches``: ``run_with_hooks(return_type=None)`` of exactly the padded batches
  ``profile()`` runs (:func:`thermo_lens.core.tokens.plan_batches`), tokenization excluded.
* ``bare, to the last block``: the same batches, the pass ended after the last block's
  ``hook_resid_post`` (no final norm, no unembedding), as ``profile()`` ends its own pass: no
  metric reads the logits. Against it, the last summary line gives the measurements' own cost.
* ``bare, best``: the faster of one prompt at a time and the plain length-sorted batches of
  ``--batch-size`` (the "best bare forward of the same prompts").
* ``profile (cold)``: ``profile()`` with the spectral cache cleared first: the cost of profiling
  a model once (tokenization, the pass, the spectral signature, result building).
* ``profile (warm)``: ``profile()`` again on the same weights (a notebook or study re-profiling:
  the spectral signature comes from the cache).
* ``profile (warm, no attr.)``: the same with ``attribution=False``: the per-head gain
  attribution's own cost is the difference (one extra ``d_model x n_heads*d_head`` matmul per
  token and layer, ``s W_O^T``, about 1/12 of a GPT-2 block's matmul work, plus its reductions).
* ``spectral alone (cold)``: ``spectral_signature`` with the cache cleared (the weights-only part
  of a first profile).
* ``attribution matmul alone``: only the ``[scoped tokens, d_model] x [d_model, head*d_head]``
  products ``s W_O^T`` the exact attribution needs, one per layer and batch, on random inputs of
  the same shapes: the floor of the attribution's cost (no exact per-head split of the squared-norm
  change does less work; see the README's performance section).

Then, from two extra warm profiles (not the timed ones), the CPU time spent inside thermo-lens'
own hooks, per reduction, as a share of the bare pass to the last block: a decomposition of
the overhead that does not suffer from run-to-run noise, since it is measured inside one run.

Also: the spectral part alone at LLaMA-7B geometry (32 layers x 32 heads x 4096 x 128, random
bfloat16 weights as a 7B checkpoint stores them, no forward; per-head norms + OV + whole-layer
norms, from the stored weights block by block), and wall time / peak RSS growth of ``profile()`` on 250, 1,000,
2,000 and 10,000 prompts (``--stream-sizes``), each in ``--stream-repeats`` fresh processes
(default 3; median and range), from a trimmed heap, as the kernel's exact high-water mark
(streaming: the growth should not scale with the prompts beyond the per-prompt results; each line
also prints what the pass kept for the results, the recorder's slabs, what the returned profile
holds, and the growth beyond both).

Usage: ``python benchmarks/profile.py`` (several minutes on 2 cores) or ``--quick`` (tiny
models, one repeat: a smoke test). ``--threads`` (default 1) sets the torch thread count.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the standard library's ``profile`` module (which cProfile, torch and
# transformers import). Run as a script, drop its own directory from the path so they get the real
# one; imported as ``profile`` by a sibling script (whose directory is on the path), hand over the
# real module.
_HERE = Path(__file__).resolve().parent
if __name__ == "__main__":
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
    sys.modules.pop("profile", None)
    sys.path.append(str(_HERE))  # after the standard library: for ``_common`` only
elif __name__ == "profile":
    import importlib.util
    import sysconfig

    _spec = importlib.util.spec_from_file_location("profile", Path(sysconfig.get_paths()["stdlib"]) / "profile.py")
    _real = importlib.util.module_from_spec(_spec)
    sys.modules["profile"] = _real
    _spec.loader.exec_module(_real)

import argparse  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from _common import PeakRSS, build_checkpoint, release_freed_memory, wrapped_reductions  # noqa: E402


def _plan(view, prompts, batch_size):
    """The padded batches profile() runs, and the plain length-sorted ones (old behaviour)."""
    from thermo_lens.core import tokens

    everything = tokens.tokenize(view, prompts, prepend_bos=True)
    lengths = everything.lengths
    order = sorted(range(len(prompts)), key=lambda i: int(lengths[i]))
    sorted_batches = [everything.select([order[k] for k in ks])
                      for ks in tokens.plan_batches(range(len(prompts)), batch_size, sort_by_length=False)]
    same = [everything.select(rows) for rows in tokens.plan_batches(lengths, batch_size)]
    single = [everything.select([i]) for i in range(len(prompts))]
    return same, sorted_batches, single, lengths


def _padding(batches) -> float:
    real = sum(int(b.lengths.sum()) for b in batches)
    padded = sum(int(b.tokens.numel()) for b in batches)
    return 1 - real / padded


def _clear_cache() -> None:
    from thermo_lens.measures import spectral

    clear = getattr(spectral, "clear_cache", None)
    if clear is not None:
        clear()


def _attribution_matmuls(view, same):
    """The ``s W_O^T`` products of the exact attribution (scope ``all_but_first``: the real tokens
    after position 0), on random inputs of the same shapes, each layer with its own ``W_O`` (as in
    the pass: a small batch's product reads its layer's matrix from memory): its irreducible work."""
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(view.n_layers, view.n_heads * view.d_head, view.d_model, generator=gen)
    inputs = [torch.randn(int((b.lengths - 1).clamp_min(0).sum()), view.d_model, generator=gen) for b in same]

    def go() -> None:
        for s in inputs:
            for l in range(view.n_layers):
                s @ W[l].mT
    return go


def _in_pass_shares(bridge, prompts, args, bare_cpu: float, floor_cpu: float) -> None:
    """CPU time inside thermo-lens' hooks during a warm profile(), per reduction, against the bare
    pass to the last block (``bare_cpu``; the benchmark wraps :meth:`Recorder.add`; nothing in the
    package is timed), and the attribution's hooks against their matmul floor (``floor_cpu``: the
    median of ``attribution matmul alone``)."""
    from collections import defaultdict

    from thermo_lens.measures.profile import profile

    spent: dict[str, float] = defaultdict(float)

    def timed(key, fn):
        def run(x, batch, _k=key[0]):
            c0 = time.process_time()
            out = fn(x, batch)
            spent[_k] += time.process_time() - c0
            return out
        return run

    runs = 2
    total = 0.0
    with wrapped_reductions(timed):
        for _ in range(runs):
            c0 = time.process_time()
            profile(bridge, prompts, batch_size=args.batch_size, progress=False)
            total += time.process_time() - c0
    family = {"attr": "gain attribution (attr_*)", "resid_norm": "residual norms (gain)",
              "block_in_norm": "block input norms (gain)", "anisotropy": "anisotropy",
              "attn_diag": "attention diagonal (sheaf)", "attn_off_diag": "attention diagonal (sheaf)",
              "attn_mass": "attention mass (sheaf)"}
    grouped: dict[str, float] = defaultdict(float)
    for k, v in spent.items():
        grouped[next((lab for pre, lab in family.items() if k.lstrip("_").startswith(pre)), k)] += v / runs
    inside = sum(grouped.values())
    print(f"  inside the pass (profile (warm), mean of {runs} extra runs: {total / runs:.3f} s CPU): "
          f"thermo-lens' hooks {inside:.3f} s = {100 * inside / bare_cpu:.1f}% of the bare pass to the last block")
    for lab, v in sorted(grouped.items(), key=lambda kv: -kv[1]):
        print(f"    {lab:<32}{v:>7.3f} s  {100 * v / bare_cpu:>5.1f}%")
    attr = grouped.get(family["attr"], 0.0)
    print(f"  the attribution's hooks against their matmul floor (s W_O^T alone, {floor_cpu:.3f} s = "
          f"{100 * floor_cpu / bare_cpu:.1f}% of the bare pass to the last block): {attr / floor_cpu:.2f}x (target <= 1.3x)")
    print(f"    the rest of profile() beyond its hooks and that bare pass (tokenizing, hook dispatch, "
          f"results; noisy: a difference of medians): {total / runs - inside - bare_cpu:+.3f} s")


def bench_model(label: str, kind: str, prompts, args, *, repeats: int | None = None,
                light: bool = False) -> dict[str, float]:
    """One model's rows. ``light`` (the 1B-class row): no ``bare, length-sorted`` / ``bare, one at
    a time`` (the "best bare" ratios are then against ``bare, same batches``), ``repeats`` repeats."""
    from transformer_lens.model_bridge import TransformerBridge

    from thermo_lens.core.model import ModelView
    from thermo_lens.measures.profile import profile
    from thermo_lens.measures.spectral import spectral_signature

    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(kind, tmp, args.quick, real_vocab=not args.quick)
        bridge = TransformerBridge.boot_transformers(str(path))
    view = ModelView(bridge)
    same, sorted_batches, single, lengths = _plan(view, prompts, args.batch_size)

    last_block = f"blocks.{view.n_layers - 1}.hook_resid_post"

    def run(batches, stop_after=None):
        def go() -> None:
            for b in batches:
                view.run(b.tokens, b.mask, stop_after=stop_after)
        return go

    def prof_cold() -> None:
        _clear_cache()
        profile(bridge, prompts, batch_size=args.batch_size, progress=False)

    def prof_warm() -> None:
        profile(bridge, prompts, batch_size=args.batch_size, progress=False)

    def prof_warm_no_attr() -> None:
        profile(bridge, prompts, batch_size=args.batch_size, progress=False, attribution=False)

    def spectral_cold() -> None:
        _clear_cache()
        spectral_signature(bridge)

    methods = {"bare, same batches": run(same), "bare, to the last block": run(same, last_block),
               **({} if light else {"bare, length-sorted": run(sorted_batches), "bare, one at a time": run(single)}),
               "profile (cold)": prof_cold,
               "profile (warm)": prof_warm, "profile (warm, no attr.)": prof_warm_no_attr,
               "spectral alone (cold)": spectral_cold,
               "attribution matmul alone": _attribution_matmuls(view, same)}
    for fn in methods.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in methods}
    walls: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(repeats or args.repeats):
        for name, fn in methods.items():
            gc.collect()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.process_time() - c0)
            walls[name].append(time.perf_counter() - t0)
    base = times["bare, same batches"]
    if light:
        best, best_name = base, "same batches (the other bare forwards are not run for this row)"
    else:
        best = [min(a, b) for a, b in zip(times["bare, length-sorted"], times["bare, one at a time"])]
        best_name = ("length-sorted" if statistics.median(times["bare, length-sorted"])
                     <= statistics.median(times["bare, one at a time"]) else "one at a time")

    def ratio(name, ref):
        r = [t / b for t, b in zip(times[name], ref)]
        return statistics.median(r), min(r), max(r)

    print(f"\n{label}: L={view.n_layers}, d_model={view.d_model}, heads={view.n_heads} "
          f"(KV {view.n_kv_heads}), d_head={view.d_head}; {len(prompts)} prompts, "
          f"{int(lengths.sum())} tokens; batches: {len(same)} ({100 * _padding(same):.1f}% padding) vs "
          f"{len(sorted_batches)} length-sorted of {args.batch_size} ({100 * _padding(sorted_batches):.1f}%)"
          + (f"; {repeats or args.repeats} repeats" if light else ""))
    print(f"  {'method':<26}{'CPU s':>8}{'wall s':>8}{'vs same batches (CPU)':>28}{'vs best bare (CPU)':>26}"
          f"{'vs same (wall)':>16}{'min/min (CPU)':>15}")
    out = {}
    for name in methods:
        r1, r2 = ratio(name, base), ratio(name, best)
        wr = statistics.median([w / b for w, b in zip(walls[name], walls["bare, same batches"])])
        mm = min(times[name]) / min(base)
        print(f"  {name:<26}{statistics.median(times[name]):>8.3f}{statistics.median(walls[name]):>8.3f}"
              f"{r1[0]:>13.3f}x [{r1[1]:.3f}..{r1[2]:.3f}]"
              f"{r2[0]:>11.3f}x [{r2[1]:.3f}..{r2[2]:.3f}]{wr:>15.3f}x{mm:>14.3f}x")
        out[name] = r1[0]
        out[name + " min/min"] = mm
        out[name + " vs best"] = r2[0]
    print(f"  best bare forward: {best_name}; profile (cold) / same batches "
          f"{out['profile (cold)']:.3f}x (target <= 1.05x), / best bare {out['profile (cold) vs best']:.3f}x "
          f"(target <= 1.10x); warm {out['profile (warm)']:.3f}x / {out['profile (warm) vs best']:.3f}x")
    to_last = times["bare, to the last block"]
    print("  the measurements' own cost (profile() ends its pass after the last block; against a bare pass "
          "that ends there too): " + ", ".join(
              f"{name.removeprefix('profile ')} {statistics.median([t / b for t, b in zip(times[name], to_last)]):.3f}x"
              for name in ("profile (cold)", "profile (warm)", "profile (warm, no attr.)")) + " (target: warm <= 1.10x)")
    _in_pass_shares(bridge, prompts, args, statistics.median(to_last), statistics.median(times["attribution matmul alone"]))
    return out


def bench_spectral_7b(args) -> None:
    from thermo_lens.measures.spectral import signature_from_weights

    if args.quick:
        L, H, d_model, d_head = 2, 4, 256, 32
    else:
        L, H, d_model, d_head = 32, 32, 4096, 128
    gen = torch.Generator().manual_seed(0)
    # bf16, as a 7B checkpoint stores them: 2 x 1 GiB (fp32 would be 2 x 2 GiB).
    wv = torch.empty(L, H, d_model, d_head, dtype=torch.bfloat16)
    wo = torch.empty(L, H, d_head, d_model, dtype=torch.bfloat16)
    for l in range(L):
        wv[l] = torch.randn(H, d_model, d_head, generator=gen) / d_model**0.5
        wo[l] = torch.randn(H, d_head, d_model, generator=gen) / d_model**0.5
    gc.collect()
    with PeakRSS() as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        sig = signature_from_weights(wv, wo, weights="raw", layer_norms=False)
        t, c = time.perf_counter() - t0, time.process_time() - c0
    m = L if args.full_7b else min(L, 2)
    t1, c1 = time.perf_counter(), time.process_time()
    lay = signature_from_weights(wv[:m], wo[:m], weights="raw")
    tl_, cl = time.perf_counter() - t1, time.process_time() - c1
    scale = L / m
    print(f"\nspectral signature alone, LLaMA-7B geometry ({L} layers x {H} heads x {d_model} x {d_head}, "
          f"random bf16 weights, {2 * wv.numel() * 2 / 2**30:.2f} GiB; no forward):")
    print(f"  per-head norms + OV norms, all {L} layers: {c:.1f} s CPU ({t:.1f} s wall), "
          f"peak RSS growth {mem.growth / 2**20:.0f} MiB (Gram products of the stored bf16 weights, converted "
          "block by block in cache; benchmarks/spectral.py has the floor and the ratio)")
    print(f"  whole-layer norms ({lay.layer_norm_method}): {cl * scale:.1f} s CPU ({tl_ * scale:.1f} s wall)"
          + ("" if m == L else f", measured on {m} of {L} layers and scaled x{scale:.0f} (--full-7b: all)"))
    assert torch.isfinite(sig.ov_norm).all() and sig.W_V_norm.dtype == torch.float32


def stream_one(n: int, args) -> None:
    """One size of the streaming measurement, in this (fresh) process: prints one line."""
    from thermo_lens.core import prompts as prompt_sets
    from thermo_lens.measures.profile import profile
    from transformer_lens.model_bridge import TransformerBridge

    base = list(prompt_sets.get("paper25").prompts)
    with tempfile.TemporaryDirectory() as tmp:
        model = TransformerBridge.boot_transformers(str(build_checkpoint("small", tmp, args.quick)))
    prompts = [f"{base[i % len(base)]} ({i})" for i in range(n)]
    from thermo_lens.core import measure

    profile(model, prompts[:8], progress=False)  # warm-up
    kept: dict[str, int] = {}
    real_collect = measure.collect

    def collect(*a, **kw):  # what the pass keeps for the results: the recorder's slabs and large parts
        c = real_collect(*a, **kw)
        rec = c.recorder
        # the slabs (whole batch blocks kept with them included) and the large results kept as they are
        kept["bytes"] = rec._slabs.nbytes + sum(t.numel() * t.element_size() for parts in rec._parts.values()
                                                for t in parts._kept if isinstance(t, torch.Tensor))
        return c
    measure.collect = collect
    release_freed_memory()
    try:
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            p = profile(model, prompts, batch_size=args.batch_size, progress=False)
            t = time.perf_counter() - t0
    finally:
        measure.collect = real_collect
    per_prompt = sum(x.numel() * x.element_size() for x in (p.sheaf.trace, p.gain.block_gain))
    held = result_bytes(p)
    beyond = mem.growth - kept.get("bytes", 0) - held
    print(f"  {n:>5} prompts: wall {t:.2f} s, peak RSS growth {mem.growth / 2**20:.1f} MiB "
          f"(per-prompt results {per_prompt / 2**20:.2f} MiB; the pass kept {kept.get('bytes', 0) / 2**20:.1f} MiB "
          f"for all results, per-token residual norms included; the returned profile holds {held / 2**20:.1f} MiB "
          f"of tensors; beyond both: {beyond / 2**20:.1f} MiB)", flush=True)


def result_bytes(obj, seen=None) -> int:
    """Bytes of the distinct tensor storages reachable from a result (dataclass fields, dicts,
    lists, tuples): what the returned profile itself holds, per-token arrays included."""
    import dataclasses

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        key = ("storage", obj.untyped_storage().data_ptr())
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(result_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    if isinstance(obj, dict):
        return sum(result_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(result_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith("thermo_lens"):
        return sum(result_bytes(v, seen) for v in vars(obj).values())
    return 0


def bench_stream(args) -> None:
    """Peak RSS growth of profile() against the number of prompts, one fresh process per size:
    in one process, the allocator's memory from the first size hides the growth of the next."""
    import subprocess

    sizes = (40, 160) if args.quick else tuple(int(v) for v in args.stream_sizes.split(","))
    print("\nstreaming: profile() of a GPT-2 (6 x 384, 6 heads) on the paper's prompts repeated, "
          "one fresh process per size", flush=True)
    repeats = 1 if args.quick else args.stream_repeats
    for n in sizes:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--stream-one", str(n),
               "--batch-size", str(args.batch_size), "--threads", str(args.threads)] + (["--quick"] if args.quick else [])
        growth, beyond = [], []
        for _ in range(repeats):
            out = subprocess.run(cmd, capture_output=True, text=True)
            lines = [line for line in out.stdout.splitlines() if "prompts: wall" in line]
            if out.returncode != 0 or not lines:
                print(f"  {n:>5} prompts: failed: {out.stderr[-500:]}", flush=True)
                break
            print(lines[-1], flush=True)
            numbers = re.findall(r"([0-9.]+) MiB", lines[-1])
            growth.append(float(numbers[0]))
            beyond.append(float(numbers[-1]))
        if len(growth) > 1:
            # One process' peak depends on where the allocator happened to place things: the same size
            # gave 64 to 110 MiB in three runs, so a size is summarised by its median and range.
            print(f"  {n:>5} prompts, {len(growth)} runs: peak RSS growth median {statistics.median(growth):.1f} MiB "
                  f"[{min(growth):.1f}..{max(growth):.1f}], beyond the results {statistics.median(beyond):.1f} MiB "
                  f"[{min(beyond):.1f}..{max(beyond):.1f}]", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny models, 1 repeat (smoke test)")
    ap.add_argument("--repeats", type=int, default=None, help="timing repeats (default 5; quick 1)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1; 0 = torch's default)")
    ap.add_argument("--full-7b", action="store_true",
                    help="whole-layer norms of all 32 layers at 7B geometry (minutes; default 2, scaled)")
    ap.add_argument("--stream-one", type=int, default=None, help=argparse.SUPPRESS)  # bench_stream's child
    ap.add_argument("--stream-sizes", default="250,1000,2000,10000",
                    help="prompt counts of the streaming part, comma-separated (default 250,1000,2000,10000)")
    ap.add_argument("--stream-repeats", type=int, default=3,
                    help="fresh processes per size in the streaming part (default 3: one process' peak varies)")
    ap.add_argument("--only", choices=["gpt2", "deep", "gqa", "1b", "7b", "stream"], action="append",
                    help="run only these parts (repeatable)")
    ap.add_argument("--prompts-1b", type=int, default=5,
                    help="prompts of the 1B-class row (default 5: about a minute per repeat on one thread)")
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 5)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.stream_one is not None:
        stream_one(args.stream_one, args)
        return 0
    from thermo_lens.core import prompts as prompt_sets

    prompts = list(prompt_sets.get("paper25").prompts)
    if args.quick:
        prompts = prompts[:10]
    print("thermo-lens profile() benchmark; torch threads", torch.get_num_threads(), "; load average",
          ", ".join(f"{x:.1f}" for x in os.getloadavg()), f"on {os.cpu_count()} cores; "
          f"median of {args.repeats}, [min..max] of the per-repeat ratios")
    parts = args.only or ["gpt2", "deep", "gqa", "1b", "7b", "stream"]
    for key, label in (("gpt2", "GPT-2-small geometry"), ("deep", "deeper-narrower"), ("gqa", "GQA (LLaMA)")):
        if key in parts:
            bench_model(label, key, prompts, args)
    if "1b" in parts:
        n = len(prompts) if args.quick else args.prompts_1b
        bench_model(f"1B-class (LLaMA-3.2-1B geometry; the first {n} of the prompts, "
                    f"{1 if args.quick else 2} repeats)", "1b", prompts[:n], args,
                    repeats=1 if args.quick else 2, light=True)
    if "7b" in parts:
        bench_spectral_7b(args)
    if "stream" in parts:
        bench_stream(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
