"""Op and host-sync census of ``profile()`` against a bare forward pass, on the CPU.

Counts, with :class:`thermo_lens.core.census.OpCensus` (a ``TorchDispatchMode``), the aten ops and the
host-synchronising ops (``.item()``/``float(t)``, ``bool(t)``, ``.tolist()``, ``nonzero``,
boolean-mask indexing, ...) that ``thermo_lens.measures.profile`` dispatches, against a bare pass of the same
batches (the model's own forward, ending after the last block, as ``profile()``'s pass does). On a
GPU each op is at least one kernel launch and each sync stalls the host until the device drains,
so the census predicts a device's launch and stall counts without one.

Model: GPT-2-small geometry (12 layers, d_model 768, 12 heads) on ``TransformerBridge``, random
weights from a config (built offline, ``benchmarks/_common.py``); 64 prompts of 24 random token ids
each (token ids as given, no BOS added), batches of 16, so every batch has the same shape.

An op is what the dispatcher hands a ``TorchDispatchMode`` inside the pass's ``inference_mode``: a
composite op (``einsum``, ``matmul``, ``reshape``) counts once, though a device may run it as several
kernels, and a view op (``view``, ``unbind``, ``as_strided``) counts though it launches none.

Definitions printed:

* ops per block per batch: a whole pass's ops / (layers x batches);
* the marginal cost of a batch: ops(n batches) - ops(n - 1 batches), the same prompts' first
  ``(n - 1) x batch_size``; for ``profile()`` the fixed cost (result building, statistics) cancels,
  leaving what one more batch costs; the marginal ratio is profile's marginal / the bare pass's;
* syncs per batch: the marginal syncs (what one more batch adds; the host's own forward has one,
  a ``bool(tensor)`` inside the bridge, counted in the bare pass too); the fixed syncs: those of a
  one-batch profile minus one marginal batch's (result building);
* per measurement: ``tl.run(model, prompts, measure)`` of each measurement of the battery alone, the
  same marginal definition (spectral: weight-only, no pass: its cold ops, the cache cleared).

Warm profile: the spectral signature is cached per weights fingerprint after the first call, so a
warm ``profile()`` holds no spectral ops (counted on their own).

    python benchmarks/census.py            # GPT-2-small geometry
    python benchmarks/census.py --quick    # a tiny GPT-2 (seconds)
    python benchmarks/census.py --geometry gqa   # LLaMA-style (RMSNorm, rotary, grouped-query attention)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import GEOMETRIES, build_checkpoint  # noqa: E402


def census_of(fn):
    from thermo_lens.core.census import OpCensus

    with OpCensus() as c:
        fn()
    return c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the geometry's tiny version (2 blocks x 64)")
    ap.add_argument("--geometry", choices=sorted(GEOMETRIES), default="gpt2",
                    help="the model's geometry (benchmarks/_common.py; default gpt2: GPT-2-small)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--no-per-measurement", action="store_true", help="skip the per-measurement rows")
    ap.add_argument("--top", type=int, default=0, help="also list the N most frequent marginal ops of profile()")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from transformer_lens.model_bridge import TransformerBridge

    import thermo_lens as tl
    from thermo_lens.core import registry
    from thermo_lens.core.model import ModelView
    from thermo_lens.measures.spectral import clear_cache, spectral_signature

    with tempfile.TemporaryDirectory() as tmp:
        bridge = TransformerBridge.boot_transformers(str(build_checkpoint(args.geometry, tmp, args.quick)))
    view = ModelView(bridge)
    L, B = view.n_layers, args.batch_size
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, min(view.d_vocab, 250), (args.prompts, args.tokens), generator=gen)
    n = args.prompts // B
    if n < 2 or args.prompts % B:
        raise SystemExit("--prompts must be a multiple (>= 2) of --batch-size")
    last = f"blocks.{L - 1}.hook_resid_post"
    kw = dict(batch_size=B, progress=False, prepend_bos=False)

    def bare(rows):
        def go():
            for s in range(0, rows, B):
                t = ids[s:s + B]
                view.run(t, torch.ones_like(t, dtype=torch.bool), stop_after=last)
        return go

    def prof(rows, **extra):
        return lambda: tl.profile(bridge, ids[:rows], **kw, **extra)

    prof(B)()  # warm: the spectral signature is cached from here on
    full, less = census_of(prof(n * B)), census_of(prof((n - 1) * B))
    one = census_of(prof(B))
    b_full, b_less = census_of(bare(n * B)), census_of(bare((n - 1) * B))
    marg, b_marg = full.total - less.total, b_full.total - b_less.total
    m_sync = full.syncs - less.syncs
    print(f"census: {view.name}, L={L}, d_model={view.d_model}, heads={view.n_heads}; {args.prompts} prompts x "
          f"{args.tokens} tokens, batches of {B} ({n} batches); torch {torch.__version__}")
    print(f"  bare pass to the last block: {b_full.total} ops, {b_full.total / (L * n):.1f} per block per batch, "
          f"{b_full.syncs} syncs")
    print(f"  profile() warm:              {full.total} ops, {full.total / (L * n):.1f} per block per batch "
          f"({full.total / b_full.total:.2f}x the bare pass), {full.syncs} syncs ({full.syncs / n:.1f} per batch)")
    b_sync = b_full.syncs - b_less.syncs
    print(f"  marginal batch: profile {marg} ops vs bare {b_marg} ops = {marg / b_marg:.2f}x "
          f"({marg / L:.1f} vs {b_marg / L:.1f} per block); {m_sync} syncs per extra batch "
          f"(the bare pass's own: {b_sync}; beyond them: {m_sync - b_sync})")
    fixed_sync = one.syncs - m_sync
    print(f"  fixed (result building, one-batch profile minus one marginal batch): {one.total - marg} ops, "
          f"{fixed_sync} syncs")
    print("  syncs of the full profile by op: " + ", ".join(f"{k} {v}" for k, v in full.sync_ops.most_common()))
    diff = (full.sync_ops - less.sync_ops)
    if diff:
        print("  syncs per extra batch by op: " + ", ".join(f"{k} {v}" for k, v in diff.most_common()))
    if args.top:
        ops = full.ops - less.ops
        print("  most frequent ops of a marginal batch: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(args.top)))

    clear_cache()
    sp = census_of(lambda: spectral_signature(bridge))
    print(f"  spectral signature (cold, weight-only, no pass): {sp.total} ops, {sp.syncs} syncs")
    if not args.no_per_measurement:
        print("  per measurement alone (tl.run; marginal batch, fixed syncs at result building):")
        print(f"    {'measurement':<14}{'ops/batch':>10}{'x bare':>8}{'syncs/batch':>13}{'fixed syncs':>13}")
        for m in registry.measurements(in_profile=True):
            if m.name == "spectral":
                continue

            def run(rows, _m=m.name):
                return lambda: tl.run(bridge, ids[:rows], _m, **kw)
            try:
                run(B)()
            except Exception as e:  # noqa: BLE001 - a measurement with no form here is reported, not fatal
                print(f"    {m.name:<14} not run: {type(e).__name__}: {str(e)[:80]}")
                continue
            f_, l_, o_ = census_of(run(n * B)), census_of(run((n - 1) * B)), census_of(run(B))
            mo, ms = f_.total - l_.total, f_.syncs - l_.syncs
            print(f"    {m.name:<14}{mo:>10}{mo / b_marg:>8.2f}{ms:>13}{o_.syncs - ms:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
