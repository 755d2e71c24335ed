"""Op census and wall time of the spectral signature: the per-matrix path against the batched
device path, both run on the CPU in this process.

On a GPU every dispatched op is at least one kernel launch and every host-synchronising op a stall
(:mod:`thermo_lens.core.census`). The spectral signature's device path steps the whole-layer Lanczos
iterations of all layers together (one batched product per step) and solves the per-head
eigenproblems of all layers in one batched call; the per-matrix path (the CPU's default, and what
a device ran before) runs one Lanczos iteration per matrix, deciding after every step on the host.
The CPU census of each predicts its launch and sync counts on a device.

Rows, per geometry (random weights, Gaussian entries of variance ``1 / d_model``, ``W_Q``, ``W_K``,
``W_V``, ``W_O`` stored in the dtype named; :func:`thermo_lens.measures.spectral.signature_from_weights` with
every metric and the whole-layer norms by ``"auto"``, float32):

* ``ops``: aten ops dispatched; ``syncs``: host-synchronising ops (``.item()``, ``bool(t)``,
  ``.numpy()`` ...); ``Lanczos steps``: products of the per-matrix operator (summed over
  matrices) or batched steps;
* ``wall s``: median of ``--repeats`` wall-clock seconds, the two paths interleaved (``--threads``
  torch threads); ``ratio``: per-matrix / batched (above 1: the batched path is faster here).

Geometries: GPT-2-small (12 layers x 12 heads, d_model 768, d_head 64, float32) and LLaMA-2-7B with
``d_model`` scaled down (32 layers x 32 heads, d_model 1024, d_head 32, bf16: the layer and head
counts of 7B, whose products the census counts, at a size a CPU runs in seconds); ``--full-7b``
adds the real 7B width (minutes).

    python benchmarks/spectral_census.py            # ~1 min on 2 cores
    python benchmarks/spectral_census.py --quick    # tiny (seconds)
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _weights import StepCounter, random_weights  # noqa: E402

import thermo_lens.measures.spectral.from_weights as from_weights  # noqa: E402
from thermo_lens.core.census import OpCensus  # noqa: E402
from thermo_lens.measures.spectral import signature_from_weights  # noqa: E402

#: name -> (layers, heads, KV heads, d_model, d_head, stored dtype)
GEOMETRIES = {
    "GPT-2-small": (12, 12, 12, 768, 64, torch.float32),
    "LLaMA-2-7B, d_model 1024": (32, 32, 32, 1024, 32, torch.bfloat16),
}
QUICK = {
    "GPT-2-small (tiny)": (4, 4, 4, 128, 32, torch.float32),
    "LLaMA-2-7B (tiny)": (8, 8, 8, 128, 16, torch.bfloat16),
}
FULL_7B = {"LLaMA-2-7B": (32, 32, 32, 4096, 128, torch.bfloat16)}


def _path(batched: bool):
    """Run the signature on the batched device path (or not), whatever the device."""
    orig = getattr(from_weights, "batched", None)

    class _Use:
        def __enter__(self):
            if orig is not None:
                from_weights.batched = lambda device: batched  # type: ignore[assignment]

        def __exit__(self, *exc):
            if orig is not None:
                from_weights.batched = orig
    return _Use()


def one(w, batched: bool):
    with _path(batched):
        return signature_from_weights(w["W_V"], w["W_O"], W_Q=w["W_Q"], W_K=w["W_K"], weights="raw")


def census(w, batched: bool) -> tuple[OpCensus, int]:
    """The census of one signature, and its Lanczos steps: operator products summed over matrices
    (per-matrix path) or batched steps executed (batched path)."""
    with StepCounter() as steps, OpCensus() as c:
        one(w, batched)
    return c, steps.batched if batched else steps.n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--full-7b", action="store_true", help="also the real LLaMA-2-7B width (minutes)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    geos = dict(QUICK if args.quick else GEOMETRIES)
    if args.full_7b:
        geos.update(FULL_7B)
    has_batched = hasattr(from_weights, "batched")
    print(f"spectral signature census, CPU ({args.threads} torch threads), torch {torch.__version__}; "
          f"wall s medians of {args.repeats}, interleaved" + ("" if has_batched else "; NO batched path in this code"))
    print(f"  {'path':<14}{'ops':>9}{'syncs':>8}{'Lanczos steps':>15}{'wall s':>9}{'ratio':>8}")
    for name, (L, H, K, d_model, d_head, dtype) in geos.items():
        w = random_weights(L, H, K, d_model, d_head, dtype)
        paths = {"per-matrix": False} | ({"batched": True} if has_batched else {})
        rows = {p: census(w, b) for p, b in paths.items()}
        times: dict[str, list[float]] = {p: [] for p in paths}
        for b in paths.values():
            one(w, b)  # warm-up
        for _ in range(args.repeats):
            for p, b in paths.items():
                gc.collect()
                t = time.perf_counter()
                one(w, b)
                times[p].append(time.perf_counter() - t)
        base = statistics.median(times["per-matrix"])
        print(f" {name}: {L} layers x {H} heads ({K} KV), d_model {d_model}, d_head {d_head}, "
              f"{str(dtype).replace('torch.', '')}")
        for p, (c, steps) in rows.items():
            t = statistics.median(times[p])
            print(f"  {p:<14}{c.total:>9}{c.syncs:>8}{steps:>15}{t:>9.3f}{base / t:>7.2f}x")
        if has_batched:
            sigs = [one(w, b) for b in (False, True)]
            err = max(float(((getattr(sigs[1], m).double() - getattr(sigs[0], m).double())
                             / getattr(sigs[0], m).double()).abs().max())
                      for m in (*sigs[0].head_metrics, "layer_W_V_norm", "layer_W_O_norm"))
            print(f"  largest relative difference batched vs per-matrix, every metric: {err:.1e}")
    print("  ops/syncs: aten ops and host syncs dispatched (thermo_lens.core.census.OpCensus); Lanczos steps: operator "
          "products, one per matrix and step (per-matrix) or batched steps (all matrices at once, summed over the "
          "batched iterations); ratio: per-matrix wall / this path's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
