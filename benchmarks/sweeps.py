"""Benchmark: per-head patching sweeps against one forward pass per cell, in the same process.

Model: GPT-2-small geometry with random weights (12 layers x 12 heads, d_model 768; the tiny offline
byte-level tokenizer of ``thermo_lens.testing``; ``--real-vocab`` gives it GPT-2's 50,257-row
unembedding). Prompts: ``--pairs`` clean/corrupted pairs of ``--tokens`` random token ids (default
25 pairs of 16). All on CPU, one torch thread by default.

Printed (each timing the median over ``--repeats``, methods interleaved within each repeat):

* **logit difference** (``logits[:, -1, a] - logits[:, -1, b]``), every layer x head, ``attn.hook_z``
  patched at all positions: ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos``
  (one full forward per cell on all prompts; its clean ``run_with_cache`` included) against
  ``thermo_lens.patch_sweep(..., measure=logit_diff)`` (conditions stacked along the batch,
  ``--rows`` rows per pass); the ratio, and the largest difference of the cells
  (``patch_sweep`` effect vs TransformerLens' cell minus the unpatched metric).
* **gain** (``last_block_gain``, token scope ``all_but_first``): one ``run_with_hooks`` per cell
  (the patch hook plus two norm hooks, logits discarded) against
  ``patch_sweep(..., measure="last_block_gain")``; the ratio and the largest difference.

Usage: ``nice python benchmarks/sweeps.py`` (full size: many minutes on a shared CPU), or e.g.
``--pairs 5 --tokens 8`` (reduced), or ``--quick`` (a tiny model: a smoke test).

Measured (2026-11-25, a shared 2-core CPU under load from other jobs, niced, one torch thread, one
repeat; TransformerLens 4.3 TransformerBridge):

=====================================  ==========================  =================  =====  ==========
run                                    one pass per cell           patch_sweep        ratio  max |diff|
=====================================  ==========================  =================  =====  ==========
25 pairs x 8 tokens, logit difference  99.7 s (TL patching)        95.5 s             1.04x  1.3e-07
25 pairs x 8 tokens, last_block_gain   140.7 s (run_with_hooks)    64.5 s             2.18x  2.6e-08
5 pairs x 8 tokens, logit difference   30.5 s                      28.9 s             1.06x  1.2e-07
5 pairs x 8 tokens, last_block_gain    36.6 s                      27.8 s             1.32x  5.1e-08
5 x 8, 50,257-token vocab, logit diff  53.8 s                      49.3 s             1.09x  2.7e-08
5 x 8, 50,257-token vocab, gain        47.7 s                      30.9 s             1.54x  3.8e-08
=====================================  ==========================  =================  =====  ==========

The issue's goal (>= 5x on CPU for the logit-difference sweep) is not met: see below. The gain sweep
gains from ending its passes after the last block (the bridge computes the unembedding even for
``return_type=None``) and from fewer, larger passes.

Where the time goes: on a CPU a forward pass costs what its token positions cost, so stacking
conditions along the batch saves the per-pass overhead (hook registration, Python) but not the
arithmetic of the cells themselves, which TransformerLens already runs batched over the prompts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from _common import build_checkpoint  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 1 repeat (smoke test)")
    ap.add_argument("--pairs", type=int, default=25)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rows", type=int, default=None, help="rows per forward pass of the sweep (default: 4 copies)")
    ap.add_argument("--repeats", type=int, default=None, help="timing repeats (default 3; quick 1)")
    ap.add_argument("--real-vocab", action="store_true", help="GPT-2's 50,257-token unembedding")
    ap.add_argument("--skip-gain", action="store_true")
    ap.add_argument("--skip-logits", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0 = torch's default)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformer_lens.patching as patching
    from transformer_lens.model_bridge import TransformerBridge

    import thermo_lens as tl
    from thermo_lens.sweeps import LogitDifference, patch_sweep

    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint("gpt2", tmp, quick=args.quick, real_vocab=args.real_vocab)
        model = TransformerBridge.boot_transformers(str(path))
    L, H = model.cfg.n_layers, model.cfg.n_heads
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 250, (args.pairs, args.tokens), generator=g)
    corr = torch.randint(1, 250, (args.pairs, args.tokens), generator=g)
    rows = args.rows or 4 * args.pairs

    def logit_diff(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1, 5] - logits[:, -1, 7]

    def tl_logits() -> torch.Tensor:
        _, cache = model.run_with_cache(clean)
        with torch.inference_mode():
            base = logit_diff(model(corr)).mean()
            grid = patching.get_act_patch_attn_head_out_all_pos(model, corr, cache, lambda x: logit_diff(x).mean())
        return grid.double() - float(base)

    def ours_logits(start: bool = True) -> torch.Tensor:
        return patch_sweep(model, clean, corr, "attn.hook_z", measure=logit_diff, batch_size=rows,
                           start_at_layer=start).effect

    def loop_gain() -> torch.Tensor:
        """One run_with_hooks per cell: the patch hook and two norm hooks (G_L, all_but_first)."""
        _, cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("attn.hook_z"))
        pre, post = f"blocks.{L - 1}.hook_resid_pre", f"blocks.{L - 1}.hook_resid_post"

        def gain_of(hooks: list) -> torch.Tensor:
            got: dict[str, torch.Tensor] = {}

            def keep(x: torch.Tensor, hook, name: str) -> None:
                got[name] = torch.linalg.vector_norm(x.float(), dim=-1)
            norms = [(n, lambda x, hook, n=n: keep(x, hook, n)) for n in (pre, post)]
            with torch.inference_mode():
                model.run_with_hooks(corr, fwd_hooks=hooks + norms, return_type=None)
            return (got[post][:, 1:] / got[pre][:, 1:]).double().mean(-1)
        base = gain_of([])
        out = torch.zeros(L, H, dtype=torch.float64)
        for layer in range(L):
            z_clean = cache[f"blocks.{layer}.attn.hook_z"]
            for head in range(H):
                def patch(z: torch.Tensor, hook, h=head, src=z_clean) -> torch.Tensor:
                    z4 = z.view(z.shape[0], z.shape[1], H, -1) if z.ndim == 3 else z
                    s4 = src.view(src.shape[0], src.shape[1], H, -1) if src.ndim == 3 else src
                    z4[:, :, h] = s4[:, :, h]
                    return z
                out[layer, head] = (gain_of([(f"blocks.{layer}.attn.hook_z", patch)]) - base).mean()
        return out

    def ours_gain(start: bool = True) -> torch.Tensor:
        return patch_sweep(model, clean, corr, "attn.hook_z", measure="last_block_gain", batch_size=rows,
                           start_at_layer=start).effect

    def ours_ld() -> torch.Tensor:
        return patch_sweep(model, clean, corr, "attn.hook_z", measure=LogitDifference(5, 7), batch_size=rows).effect

    def full(fn):  # the sweep with every pass from the embedding (start_at_layer=False)
        return lambda: fn(False)

    groups = [] if args.skip_logits else [("logit difference", tl_logits, {
        "patch_sweep, logit function": ours_logits, "  every pass from the embedding": full(ours_logits),
        "patch_sweep, LogitDifference": ours_ld})]
    if not args.skip_gain:
        groups.append(("gain (last_block_gain)", loop_gain, {
            "patch_sweep": ours_gain, "  every pass from the embedding": full(ours_gain)}))
    probe = patch_sweep(model, clean[:2], corr[:2], "attn.hook_z", measure=logit_diff, layers=[L - 1], heads=[0])
    print(f"GPT-2-small geometry (L={L}, H={H}, d_model={model.cfg.d_model}, d_vocab={model.cfg.d_vocab}), "
          f"{args.pairs} pairs x {args.tokens} tokens, {L * H} cells, sweep rows per pass {rows}, "
          f"torch threads {torch.get_num_threads()}, thermo-lens {tl.__version__}, load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"sweep passes: {probe.passes}")
    for label, base_fn, ours in groups:
        methods = {"baseline": base_fn, **ours}
        times: dict[str, list[float]] = {k: [] for k in methods}
        values = {}
        for _ in range(repeats):
            for key, fn in methods.items():  # interleaved within each repeat
                t0 = time.perf_counter()
                values[key] = fn()
                times[key].append(time.perf_counter() - t0)
        tb = statistics.median(times["baseline"])
        print(f"{label}: one pass per cell {tb:.2f} s (load average {os.getloadavg()[0]:.2f})")
        for key in ours:
            ts = statistics.median(times[key])
            diff = float((values["baseline"].double() - values[key].double()).abs().max())
            print(f"  {key:<32} {ts:8.2f} s   ratio {tb / ts:5.2f}x   max |cell difference| {diff:.2e}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
