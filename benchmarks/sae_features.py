"""Benchmark: the per-feature split of SAE terms (``gain_attribution(..., sae_features=True)``).

Model: the tiny offline GPT-2 test checkpoint (3 layers, d_model 32) as SAELens'
``HookedSAETransformer`` (needs sae-lens, TransformerLens 3.x), one random SAE of width ``--d-sae``
(default 16384) at ``blocks.1.hook_resid_post`` with its error term. Prompts: the paper's 25,
repeated to ``--prompts`` (cut to the checkpoint's 64-token context).

Printed, for the same prompts with and without ``sae_features``:

* wall time (best of ``--repeat``) and its ratio;
* peak RSS growth of the pass (``PeakRSS``) and the bytes the result's feature terms hold
  (``[prompt, d_sae]`` float32: ``4 d_sae`` bytes per prompt), and with ``sae_features_top_k``;
* aten ops per pass (torch.profiler) and how many of them copy to the host (``aten::item``,
  ``aten::_local_scalar_dense``: a device sync on a GPU);
* the split's closure: the largest ``sae_feature_closure / scale`` (checked in the pass) and the
  largest ``|sum_i feature + rest + error - sae| / scale`` of the stored means.

Usage: ``python benchmarks/sae_features.py [--d-sae 16384] [--prompts 100] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-sae", type=int, default=16384)
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    import torch
    import sae_lens

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import PeakRSS, release_freed_memory

    import thermo_lens as tl
    from thermo_lens.core.prompts import get
    from thermo_lens.testing import hooked_transformer, make_checkpoint, random_sae

    torch.set_num_threads(1)
    base = list(get("paper25").prompts)
    prompts = (base * (args.prompts // len(base) + 1))[:args.prompts]
    ck = make_checkpoint("gpt2", Path(tempfile.mkdtemp()) / "gpt2")
    model = hooked_transformer(ck, cls=sae_lens.HookedSAETransformer)
    hook = "blocks.1.hook_resid_post"
    model.add_sae(random_sae(hook, model.cfg.d_model, args.d_sae, seed=0, b_dec=0.1), use_error_term=True)

    def run(**kw):
        return tl.gain_attribution(model, prompts, prepend_bos=True, batch_size=8, progress=False, truncate=True, **kw)

    rows = {}
    for label, kw in (("without", {}), ("sae_features", {"sae_features": True}),
                      ("top_k=100", {"sae_features": True, "sae_features_top_k": 100})):
        best = float("inf")
        for _ in range(args.repeat):
            release_freed_memory()
            with PeakRSS() as rss:
                t0 = time.perf_counter()
                r = run(**kw)
                best = min(best, time.perf_counter() - t0)
        held = sum(t.numel() * t.element_size() for t in (r.sae_features or {}).values())
        rows[label] = (best, rss.growth, held, r)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof0:
        run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof1:
        run(sae_features=True)

    def ops(prof):
        ev = prof.key_averages()
        total = sum(e.count for e in ev if e.key.startswith("aten::"))
        syncs = sum(e.count for e in ev if e.key in ("aten::item", "aten::_local_scalar_dense"))
        return total, syncs

    t0, _, _, _ = rows["without"]
    print(f"{len(prompts)} prompts, d_sae={args.d_sae}, SAE at {hook} (error term on), batch 8, 1 thread")
    print(f"{'run':<14} {'seconds':>8} {'ratio':>6} {'peak RSS growth (MiB)':>22} {'feature terms held (MiB)':>25}")
    for label, (sec, growth, held, _) in rows.items():
        print(f"{label:<14} {sec:8.3f} {sec / t0:6.2f} {growth / 2**20:22.1f} {held / 2**20:25.2f}")
    (o0, s0), (o1, s1) = ops(prof0), ops(prof1)
    print(f"aten ops per pass: {o0} without, {o1} with sae_features (+{o1 - o0}); host copies (item): {s0} / {s1}")
    r = rows["sae_features"][3]
    layer = r.sae_feature_layer[hook]
    scale = r.scale[:, layer]
    clo = float((r.sae_feature_closure[hook] / scale).max())
    whole = r.sae_features[hook].double().sum(-1) + r.sae_feature_rest[hook] + r.sae_feature_error[hook]
    gap = float(((whole - r.sae[:, layer]).abs() / scale).max())
    print(f"closure: max per-token |term - features - rest - error| / scale (in-pass mean) {clo:.2e}; "
          f"max |sum of stored means - sae| / scale {gap:.2e}")


if __name__ == "__main__":
    main()
