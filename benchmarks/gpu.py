"""Benchmark on a CUDA GPU: the spectral signature at LLaMA-7B size and ``profile()`` against a bare
forward pass, bf16 weights on the device, wall-clock seconds with the device synchronised.

    python benchmarks/gpu.py                         # a CUDA GPU (~3 min on an H100 / H200)
    python benchmarks/gpu.py --device cpu --quick    # the same code on tiny sizes: a smoke run
    python benchmarks/gpu.py --json gpu.json         # also every number as JSON

Everything runs in this process on random weights generated on the device (no checkpoint, no
download), medians of ``--repeats`` runs after one warm-up, methods interleaved within a repeat.
Times are wall-clock seconds around a synchronised device (on a GPU the Python side's time, kernel
launches and host-device round trips included: what a notebook waits for). The run prints:

**The device and its two ceilings**, measured first: a device-to-device copy of 1 GiB (GB/s counting
bytes read and written), and 8192^3 matrix products in bf16 and float32 (TFLOP/s; float32 without
TF32, as thermo-lens computes).

**Spectral signature, LLaMA-7B geometry** (32 layers x 32 heads x 4096 x 128, bf16 ``W_Q``, ``W_K``,
``W_V``, ``W_O`` on the device; Gaussian entries, and the same plus a rank-8 spike per whole-layer
matrix, a spectrum with a gap as trained weights have):

* *floor*: the float32 per-head Gram products of the four weights (batched; the conversion to float32
  outside the timed region), which every exact method computes; and the time of one read of the
  stored weights at the measured copy rate (the memory floor);
* *ours*: :func:`thermo_lens.measures.spectral.signature_from_weights`, all per-head, KV-head, OV and QK norms
  and the whole-layer norms (``layer_norm_method="auto"``), split into the per-head part and the
  whole-layer part;
* the whole-layer norms by each method (``batched``: Lanczos on every layer's matrices at once, one
  batched product per step, what ``"auto"`` runs on a device; ``lanczos``: one matrix at a time, what
  the CPU runs; ``gram``, ``svd``; a slow method is run on the first layers and scaled to all 32,
  which the row says), with Lanczos' steps per matrix;
* beside ``ours`` and the batched row: the op census (aten ops, host syncs) and the kernel launches
  that ``torch.profiler`` records (on the CPU, the census's op count);
* the largest relative difference from float64 (8 heads of layer 0 for every per-head metric; layer 0's
  two whole-layer matrices, from float64 Gram eigenvalues, for each method);
* the device memory that ``ours`` allocates beyond the weights (peak).

**profile() on the device**, bf16, random weights, real vocabularies: a LLaMA-3.2-1B geometry (16 x
2048, 32 query / 8 KV heads, MLP 8192, vocabulary 128,256, tied) and a LLaMA-2-7B geometry (32 x 4096,
32 heads, MLP 11,008, vocabulary 32,000), the paper's 25 prompts repeated ``--copies`` times, in
batches of ``--batch-size`` (the offline byte-level tokenizer of ``thermo_lens.testing``: longer in
tokens than a real tokenizer). Rows as in ``benchmarks/profile.py``: a bare pass of the same batches,
the same ended after the last block (as ``profile()`` ends its pass), ``profile()`` cold (the spectral
cache cleared), warm, warm without the attribution, and the spectral signature alone (cold), with
tokens per second, the peak device memory beyond the model's weights, and beside each row the ops,
host syncs and kernel launches of one call (:func:`op_counts`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import thermo_lens.measures.spectral.kernels as kernels  # noqa: E402
from thermo_lens.measures.spectral import signature_from_weights  # noqa: E402
from thermo_lens.measures.spectral.layer_norms import LayerStacks, layer_norms  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import wrapped_reductions  # noqa: E402
from _weights import StepCounter, dense_errors, layer_sigma64, random_weights  # noqa: E402

RESULTS: dict = {}


# ------------------------------------------------------------------------------ timing


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def wall(fn, dev: torch.device, repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` calls of ``fn`` around a synchronised device (no warm-up here)."""
    out = []
    for _ in range(repeats):
        gc.collect()
        sync(dev)
        t = time.perf_counter()
        fn()
        sync(dev)
        out.append(time.perf_counter() - t)
    return out


def interleaved(methods: dict, dev: torch.device, repeats: int) -> dict[str, list[float]]:
    """One warm-up of each method, then ``repeats`` rounds, each method once per round."""
    for fn in methods.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(repeats):
        for k, fn in methods.items():
            times[k] += wall(fn, dev, 1)
    return times


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def peak_growth(fn, dev: torch.device) -> float:
    """Bytes the device allocates beyond what was allocated before ``fn`` (its peak); NaN off CUDA."""
    if dev.type != "cuda":
        fn()
        return float("nan")
    gc.collect()
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    fn()
    torch.cuda.synchronize(dev)
    return float(torch.cuda.max_memory_allocated(dev) - base)


def op_counts(fn, dev: torch.device) -> dict[str, int]:
    """What one call of ``fn`` dispatches: aten ops and host-synchronising ops (the census of
    :mod:`thermo_lens.core.census`), and on CUDA the kernel launches (``cudaLaunchKernel`` and kin), the
    ``cudaMemcpy*`` calls and the device activities (kernels and copies) that ``torch.profiler``
    records; on the CPU the census's op count stands for the launches."""
    from thermo_lens.core.census import OpCensus

    with OpCensus() as c:
        fn()
    out = dict(ops=c.total, syncs=c.syncs, launches=c.total)
    if dev.type == "cuda":
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        sync(dev)
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            sync(dev)
        events = prof.events()
        out["launches"] = sum(1 for e in events if "LaunchKernel" in e.name)
        out["memcpy"] = sum(1 for e in events if e.name.startswith("cudaMemcpy"))
        out["device_activities"] = sum(1 for e in events if e.device_type == DeviceType.CUDA)
    return out


def counts_text(c: dict[str, int]) -> str:
    return (f"{c['ops']} ops, {c['syncs']} syncs, {c['launches']} launches"
            + (f" ({c['memcpy']} memcpy)" if "memcpy" in c else " (census)"))


# ------------------------------------------------------------------------------ the device


def header(dev: torch.device) -> None:
    import transformers

    try:
        import transformer_lens
        tl_version = getattr(transformer_lens, "__version__", None)
        if tl_version is None:
            from importlib.metadata import version
            tl_version = version("transformer-lens")
    except Exception as e:  # the benchmark still says which host it ran on
        tl_version = f"unknown ({type(e).__name__})"
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        name = f"{p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, CUDA {torch.version.cuda}"
    else:
        name = f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} torch threads"
    RESULTS["device"] = name
    RESULTS["versions"] = dict(python=platform.python_version(), torch=torch.__version__,
                               transformers=transformers.__version__, transformer_lens=tl_version)
    print(f"device: {name}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in RESULTS["versions"].items()))
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def ceilings(dev: torch.device, quick: bool) -> dict[str, float]:
    n = (1 << 18) if quick else (1 << 28)  # 1 GiB of float32
    a = torch.empty(n, device=dev).normal_()
    b = torch.empty_like(a)
    reps = 2 if quick else 10
    t = med(wall(lambda: b.copy_(a), dev, reps))
    copy = 2 * a.numel() * 4 / t
    m = 256 if quick else 8192
    x, y = (torch.randn(m, m, device=dev) for _ in range(2))
    x16, y16 = x.bfloat16(), y.bfloat16()
    x16 @ y16, x @ y  # warm-up (handle creation)
    t16 = med(wall(lambda: x16 @ y16, dev, reps))
    t32 = med(wall(lambda: x @ y, dev, reps))
    out = dict(copy_GBps=copy / 1e9, bf16_TFLOPs=2 * m**3 / t16 / 1e12, fp32_TFLOPs=2 * m**3 / t32 / 1e12)
    print(f"ceilings: device-to-device copy {out['copy_GBps']:.0f} GB/s (read + write), "
          f"{m}^3 matmul bf16 {out['bf16_TFLOPs']:.1f} TFLOP/s, float32 {out['fp32_TFLOPs']:.1f} TFLOP/s "
          f"(TF32 {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}); medians of {reps}")
    RESULTS["ceilings"] = out
    return out


# ------------------------------------------------------------------------------ spectral signature


def per_head_parts(w, dev: torch.device, repeats: int, per_layer: float) -> dict[str, float]:
    """Where one layer's per-head time goes (ms): its four Gram products, the batched ``eigvalsh`` /
    ``cholesky`` of ``d_head x d_head`` matrices the metrics take (six ``eigvalsh`` and four
    ``cholesky`` calls of ``[head, d_head, d_head]`` per layer), the same eigenproblems as one batched
    call, and on the host CPU (copy included): which one to use is a measured choice."""
    from thermo_lens.measures.spectral.kernels import gram_matrices

    G = {n: gram_matrices(t[:1], torch.float32, rows=n == "W_O") for n, t in w.items()}
    Gv = G["W_V"].reshape(-1, *G["W_V"].shape[-2:])
    six = torch.cat([Gv] * 6)

    def ms(fn):
        fn()
        return 1e3 * med(wall(fn, dev, max(3, repeats)))

    out = dict(
        per_head_total=1e3 * per_layer,
        gram_products=ms(lambda: [gram_matrices(t[:1], torch.float32, rows=n == "W_O") for n, t in w.items()]),
        eigvalsh_x6=6 * ms(lambda: torch.linalg.eigvalsh(Gv)),
        eigvalsh_one_batch_of_6=ms(lambda: torch.linalg.eigvalsh(six)),
        eigvalsh_one_batch_of_6_on_host=ms(lambda: torch.linalg.eigvalsh(six.cpu())),
        top_eigenvalue_x6=6 * ms(lambda: kernels.top_eigenvalue(Gv)),
        squaring_one_batch_of_6=ms(lambda: kernels._top_eigenvalue_by_squaring(six)),
        cholesky_x4=4 * ms(lambda: torch.linalg.cholesky_ex(Gv)),
    )
    print("    one layer's per-head part (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in out.items())
          + f"  [{Gv.shape[0]} heads of {Gv.shape[-1]}; host: {torch.get_num_threads()} threads]")
    return out


def spectral_7b(dev: torch.device, ceil: dict, quick: bool, repeats: int, budget_s: float,
                methods: tuple[str, ...] = ("lanczos", "gram", "svd")) -> None:
    L, H, K, d_model, d_head = (2, 4, 4, 128, 32) if quick else (32, 32, 32, 4096, 128)
    rows = {}
    print(f"\nspectral signature, LLaMA-7B geometry ({L} layers x {H} heads x {d_model} x {d_head}, bf16 "
          f"W_Q/W_K/W_V/W_O on the device; wall s, medians of {repeats})")
    print(f"  {'spectrum':<10}{'floor s':>9}{'read s':>8}{'ours s':>8}{'ratio':>7}{'per-head s':>11}{'layer s':>9}"
          f"{'method':>10}{'steps':>7}{'mem MiB':>9}{'max err':>10}")
    for spectrum, spike in (("Gaussian", 0), ("spiked", 2 if quick else 8)):
        w = random_weights(L, H, K, d_model, d_head, torch.bfloat16, spike=spike, device=dev)
        nbytes = sum(t.numel() * t.element_size() for t in w.values())
        f32 = {n: t.float() for n, t in w.items()}

        def floor(f32=f32):
            for n, W in f32.items():
                _ = W @ W.mT if n == "W_O" else W.mT @ W

        def ours(layer_norms=True, w=w):
            return signature_from_weights(w["W_V"], w["W_O"], W_Q=w["W_Q"], W_K=w["W_K"], weights="raw",
                                          layer_norms=layer_norms)

        times = interleaved({"floor": floor, "ours": ours, "per-head": lambda: ours(False)}, dev, repeats)
        del f32
        with StepCounter() as count:
            sig = ours()
        steps = count.n / (2 * L)
        counts = op_counts(ours, dev)
        mem = peak_growth(ours, dev)
        f, a, h = med(times["floor"]), med(times["ours"]), med(times["per-head"])
        read = nbytes / (ceil["copy_GBps"] * 1e9 / 2)  # one read at the copy's rate (it reads half its bytes)
        err = dense_errors({n: t[:1] for n, t in w.items()}, sig, full=False)  # 8 heads and the matrices of layer 0
        print(f"  {spectrum:<10}{f:>9.4f}{read:>8.4f}{a:>8.3f}{a / f:>6.1f}x{h:>11.3f}{a - h:>9.3f}"
              f"{sig.layer_norm_method:>10}{steps:>7.1f}{mem / 2**20:>9.0f}{err:>10.1e}")
        print(f"    ours: {counts_text(counts)}")
        row = dict(floor_s=f, read_s=read, ours_s=a, ratio=a / f, per_head_s=h, layer_s=a - h, counts=counts,
                   auto_method=sig.layer_norm_method, lanczos_steps_per_matrix=steps, mem_MiB=mem / 2**20,
                   max_rel_err=err, layers={})

        if spectrum == "Gaussian":
            row["per_head_parts_ms"] = per_head_parts(w, dev, repeats, h / L)
        # Whole-layer norms by each method; a slow one on the first layers, scaled.
        ref = layer_sigma64(w, 0)
        for method in methods:
            def one(m, method=method, w=w):
                if method == "batched":  # every layer's matrices stepped together (the device path of 'auto')
                    stacks = LayerStacks(m, H, K, d_model, d_head, torch.float32, dev)
                    stacks.add(w["W_V"][:m], w["W_O"][:m])
                    return stacks.result()
                return layer_norms(w["W_V"][:m], w["W_O"][:m], torch.float32, method)
            one(1)  # warm-up
            t1 = med(wall(lambda: one(1), dev, 1))
            m = L if t1 * L * repeats <= budget_s else max(1, min(L, int(budget_s / max(t1, 1e-9) / repeats)))
            t = med(wall(lambda m=m: one(m), dev, repeats)) * L / m
            lv, lo, _ = one(1)
            e = max(abs(float(lv[0]) - ref[0]) / ref[0], abs(float(lo[0]) - ref[1]) / ref[1])
            note = "" if m == L else f" (measured on {m} of {L} layers, scaled)"
            extra = ""
            if method == "lanczos":
                V = torch.cat([w["W_V"][0, k].mT for k in range(K)])  # layer 0's value matrix^T [K*d_head, d_model]
                op = kernels._GramOperator(V, torch.float32)
                x, y = torch.randn(d_model, device=dev), torch.empty(d_model, device=dev)
                op(x, y)
                t_op = med(wall(lambda op=op, x=x, y=y: op(x, y), dev, 20))
                per_step = t / (2 * L * steps)
                extra = (f"; {1e6 * per_step:.0f} us per step, of which the operator product (W^T W x) "
                         f"{1e6 * t_op:.0f} us")
                row["lanczos_step_us"], row["operator_product_us"] = 1e6 * per_step, 1e6 * t_op
            if method == "batched":
                extra = f"; {counts_text(op_counts(lambda: one(L), dev))}"
            print(f"    whole-layer norms by {method:<8}{t:>9.3f} s for {L} layers{note}; layer 0 vs float64: {e:.1e}"
                  + extra)
            row["layers"][method] = dict(s=t, measured_layers=m, max_rel_err=e)
        rows[spectrum] = row
    print("  floor: the float32 per-head Gram products of the four weights (weights converted outside the "
          "timed region); read: one read of the stored weights at the measured copy rate; ratio = ours / floor; "
          "per-head: every per-head, KV-head, OV and QK norm; layer: the whole-layer norms by 'auto' "
          "(ours - per-head); steps: Lanczos steps per whole-layer matrix; mem: device memory ours allocates "
          "beyond the weights (peak); max err: largest relative difference from float64 (8 heads of layer 0, every "
          "per-head metric, and layer 0's whole-layer norms by 'auto')")
    RESULTS["spectral_7b"] = rows


# ------------------------------------------------------------------------------ profile() on the device

MODELS = {
    # name -> (layers, d_model, heads, KV heads, MLP, vocabulary, tied)
    "LLaMA-3.2-1B geometry": (16, 2048, 32, 8, 8192, 128256, True),
    "LLaMA-2-7B geometry": (32, 4096, 32, 32, 11008, 32000, False),
}
QUICK_MODELS = {
    "LLaMA-3.2-1B geometry": (2, 64, 4, 2, 128, 512, True),
    "LLaMA-2-7B geometry": (2, 128, 4, 4, 256, 512, False),
}


def device_model(geometry, dev: torch.device, dtype: torch.dtype):
    """A random-weight LLaMA built on the device and booted as a ``TransformerBridge`` (its config and
    the offline tokenizer saved to a directory; the weights never touch the disk)."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    from thermo_lens.testing import make_tokenizer

    transformers.utils.logging.disable_progress_bar()
    n_layer, d, n_head, n_kv, mlp, vocab, tied = geometry
    tok = make_tokenizer()
    cfg = transformers.LlamaConfig(hidden_size=d, num_hidden_layers=n_layer, num_attention_heads=n_head,
                                   num_key_value_heads=n_kv, intermediate_size=mlp, max_position_embeddings=2048,
                                   vocab_size=vocab, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                   tie_word_embeddings=tied)
    torch.manual_seed(0)
    with torch.device(dev):
        hf = transformers.LlamaForCausalLM(cfg)
    hf = hf.to(dtype).eval()
    with tempfile.TemporaryDirectory() as tmp:
        cfg.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        return TransformerBridge.boot_transformers(tmp, hf_model=hf, device=str(dev), dtype=dtype)


def bench_profile(label: str, geometry, dev: torch.device, args) -> None:
    from thermo_lens.core import prompts as prompt_sets
    from thermo_lens.measures import spectral
    from thermo_lens.core import tokens
    from thermo_lens.core.model import ModelView
    from thermo_lens.measures.profile import profile

    t0 = time.perf_counter()
    bridge = device_model(geometry, dev, torch.bfloat16)
    built = time.perf_counter() - t0
    view = ModelView(bridge)
    prompts = list(prompt_sets.get("paper25").prompts) * args.copies
    everything = tokens.tokenize(view, prompts, prepend_bos=True)
    same = [everything.select(rows) for rows in tokens.plan_batches(everything.lengths, args.batch_size)]
    n_tok = int(everything.lengths.sum())
    last = f"blocks.{view.n_layers - 1}.hook_resid_post"

    def bare(stop_after=None):
        def go():
            for b in same:
                view.run(b.tokens, b.mask, stop_after=stop_after)
        return go

    def prof(**kw):
        return lambda: profile(bridge, prompts, batch_size=args.batch_size, progress=False, **kw)

    def cold():
        spectral.clear_cache()
        profile(bridge, prompts, batch_size=args.batch_size, progress=False)

    def spectral_cold():
        spectral.clear_cache()
        spectral.spectral_signature(bridge)

    methods = {"bare, same batches": bare(), "bare, to the last block": bare(last), "profile (cold)": cold,
               "profile (warm)": prof(), "profile (warm, no attr.)": prof(attribution=False),
               "spectral alone (cold)": spectral_cold}
    times = interleaved(methods, dev, args.repeats)
    mem_bare = peak_growth(bare(last), dev)
    mem_prof = peak_growth(prof(), dev)
    p = profile(bridge, prompts, batch_size=args.batch_size, progress=False)
    assert torch.isfinite(p.gain.block_gain).all(), "non-finite gains"
    if args.trace:
        trace(bridge, prompts, args, label)
    base, to_last = times["bare, same batches"], times["bare, to the last block"]
    print(f"\n{label} on {dev.type}: L={view.n_layers}, d_model={view.d_model}, heads={view.n_heads} (KV "
          f"{view.n_kv_heads}), d_vocab={view.d_vocab}, bf16; {len(prompts)} prompts, {n_tok} tokens, "
          f"{len(same)} batches of <= {args.batch_size}; built in {built:.1f} s; wall s, medians of {args.repeats}")
    print(f"  {'method':<28}{'wall s':>9}{'tokens/s':>11}{'vs same batches':>17}{'vs to last block':>18}"
          f"{'ops':>9}{'syncs':>7}{'launches':>10}")
    row: dict = dict(prompts=len(prompts), tokens=n_tok, batch_size=args.batch_size, methods={})
    for name, ts in times.items():
        r1 = med([t / b for t, b in zip(ts, base)])
        r2 = med([t / b for t, b in zip(ts, to_last)])
        c = op_counts(methods[name], dev)
        print(f"  {name:<28}{med(ts):>9.3f}{n_tok / med(ts):>11.0f}{r1:>16.3f}x{r2:>17.3f}x"
              f"{c['ops']:>9}{c['syncs']:>7}{c['launches']:>10}")
        row["methods"][name] = dict(s=med(ts), all_s=ts, vs_same=r1, vs_to_last=r2, counts=c)
    print("  ops / syncs: aten ops and host syncs dispatched by one call (thermo_lens.core.census); launches: kernel "
          "launches recorded by torch.profiler on CUDA, the op count on the CPU")
    print(f"  device memory beyond the weights (peak): bare pass to the last block {mem_bare / 2**20:.0f} MiB, "
          f"profile (warm) {mem_prof / 2**20:.0f} MiB")
    row.update(mem_bare_MiB=mem_bare / 2**20, mem_profile_MiB=mem_prof / 2**20)
    RESULTS.setdefault("profile", {})[label] = row


def trace(bridge, prompts, args, label: str) -> None:
    """One warm ``profile()`` under ``torch.profiler``, each of thermo-lens' hooks inside a
    ``record_function`` named by its reduction (``tl:<key>``): where a GPU pass's overhead goes."""
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    from thermo_lens.measures.profile import profile

    def named(key, fn):
        def run(x, batch, _name=f"tl:{key[0]}"):
            with record_function(_name):
                return fn(x, batch)
        return run

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with wrapped_reductions(named), torch_profile(activities=acts) as prof, record_function("tl:profile()"):
        profile(bridge, prompts, batch_size=args.batch_size, progress=False)
    ka = prof.key_averages()
    text = ""
    for sort in ("cpu_time_total", "self_cpu_time_total") + (("self_cuda_time_total",) if len(acts) > 1 else ()):
        text += f"\n  torch.profiler, {label}, one warm profile(), by {sort}:\n{ka.table(sort_by=sort, row_limit=30)}\n"
    if args.trace_file is None:
        print(text)
    else:
        with open(args.trace_file, "a") as f:
            f.write(text)
        print(f"  torch.profiler tables of one warm profile(): {args.trace_file}")


# ------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (a smoke run)")
    ap.add_argument("--repeats", type=int, default=None, help="timing repeats (default 3; quick 1)")
    ap.add_argument("--copies", type=int, default=8, help="profile(): the paper's 25 prompts this many times")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--layer-budget", type=float, default=20.0,
                    help="seconds one whole-layer method may take per spectrum (a slower one is scaled)")
    ap.add_argument("--methods", default="batched,lanczos,gram,svd",
                    help="whole-layer methods to time, comma-separated ('batched': Lanczos on every layer's "
                         "matrices at once, the device path of 'auto'; 'lanczos': one matrix at a time)")
    ap.add_argument("--trace", action="store_true",
                    help="also a torch.profiler table of one warm profile() per model, thermo-lens' hooks by name")
    ap.add_argument("--only", choices=["spectral", "profile"], action="append")
    ap.add_argument("--json", type=Path, default=None, help="write every number here")
    ap.add_argument("--trace-file", type=Path, default=None, help="--trace: append its tables here instead of printing")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: run on a machine with a GPU, or pass --device cpu (with --quick)",
              file=sys.stderr)
        return 2
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.quick:
        args.copies = min(args.copies, 1)
    only = set(args.only or ["spectral", "profile"])
    header(dev)
    ceil = ceilings(dev, args.quick)
    failures = []
    parts = []
    if "spectral" in only:
        parts.append(("spectral", lambda: spectral_7b(dev, ceil, args.quick, args.repeats, args.layer_budget,
                                                      tuple(args.methods.split(",")))))
    if "profile" in only:
        for label, geo in (QUICK_MODELS if args.quick else MODELS).items():
            parts.append((label, lambda label=label, geo=geo: bench_profile(label, geo, dev, args)))
    for name, fn in parts:
        try:
            fn()
        except Exception as e:  # one part failing keeps the others' numbers
            import traceback

            traceback.print_exc()
            failures.append(f"{name}: {type(e).__name__}: {e}")
            RESULTS.setdefault("failures", []).append(failures[-1])
        finally:
            gc.collect()  # the part's model and weights, before the next part allocates its own
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            if args.json is not None:
                args.json.write_text(json.dumps(RESULTS, indent=1, default=str))
    for f in failures:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
