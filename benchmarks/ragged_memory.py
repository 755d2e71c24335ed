"""Benchmark: memory of the per-prompt arrays when one long prompt sits among many short ones.

Model: the embedded ``gpt2-tiny-wd`` (4 layers, 4 heads, context 128; offline). Prompts: the
paper's 25 repeated to ``--prompts`` short prompts, plus one prompt of about 110 tokens.

Printed, for the reductions :func:`thermo_lens.measures.profile` records (``resid_norm`` ``[L+1, prompt,
pos]``, ``attn_diag`` ``[L, prompt, head, pos]``), in the same run:

* bytes the recorder holds: length-bucketed batches, each padded only to its own longest prompt;
* bytes of the same reduction padded to the longest prompt of the whole run (what
  ``Recorder.stack`` allocates, and what the gain and sheaf traces built before they reduced
  batch by batch), and the ratio;
* bytes at the real token counts (the floor).

Scaled to the issue's case (2,000 prompts, 2,048-token context, 12 layers x 12 heads, one long
prompt) the padded ``attn_diag`` alone is 12 * 2000 * 12 * 2048 * 4 B = 2.4 GB.

Usage: ``python benchmarks/ragged_memory.py [--prompts 2000] [--quick]``.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2000, help="number of short prompts (default 2000)")
    ap.add_argument("--quick", action="store_true", help="100 short prompts: a smoke run")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from thermo_lens import zoo
    from thermo_lens.core.passes import collect
    from thermo_lens.measures.anisotropy import anisotropy
    from thermo_lens.measures.sheaf.traces import attention_diagonal
    from thermo_lens.measures.gain import residual_norms
    from thermo_lens.core.prompts import get

    n_short = 100 if args.quick else args.prompts
    base = list(get("paper25").prompts)
    prompts = (base * (n_short // len(base) + 1))[:n_short] + ["word " * 55]
    model = zoo.load("gpt2-tiny-wd")
    t0 = time.perf_counter()
    col = collect(model, prompts, [residual_norms, anisotropy, attention_diagonal], prepend_bos=True,
                  batch_size=8, progress=False)
    seconds = time.perf_counter() - t0
    lengths = col.lengths
    print(f"{len(prompts)} prompts: mean {lengths.float().mean():.1f} tokens, longest {int(lengths.max())}; "
          f"collect {seconds:.1f} s")
    print(f"{'reduction':<12} {'held (MB)':>10} {'padded to longest (MB)':>23} {'real tokens (MB)':>17} {'padded / held':>14}")
    for name in ("resid_norm", "attn_diag"):
        parts = [(k, p) for k, ps in col.recorder._parts.items() if k[0] == name for p in ps]
        held = sum(p.numel() * p.element_size() for _, p in parts)
        per_row = parts[0][1][0, ..., 0].numel()  # heads for attn_diag, 1 for resid_norm
        n_index = len({k for k, _ in parts})
        padded = n_index * len(prompts) * per_row * int(lengths.max()) * 4
        real = n_index * per_row * int(lengths.sum()) * 4
        print(f"{name:<12} {held / 1e6:>10.2f} {padded / 1e6:>23.2f} {real / 1e6:>17.2f} {padded / held:>13.1f}x")


if __name__ == "__main__":
    main()
