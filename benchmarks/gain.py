"""Benchmark: residual_gain against baselines measured in the same process.

Model: a GPT-2-small-sized model with random weights (12 layers, d_model 768, 12 heads, context
1024; the tiny offline byte-level tokenizer of ``thermo_lens.testing``, so the vocabulary is
small and prompts are longer in tokens than with GPT-2's own tokenizer). Prompts: the paper's 25
(``thermo_lens.core.prompts.get("paper25")``). All on CPU.

Printed, as ratios to the bare batched forward pass of the same (length-sorted) batches (medians over ``--repeats``, methods
interleaved within each repeat):

* ``residual_gain``: thermo-lens, one pass per batch, norms reduced inside the hooks (includes
  tokenization and result building). Target: <= 1.10x.
* ``run_with_cache + norms``: TransformerLens cache of the L+1 residual states, then norms.
* ``paper protocol``: one prompt at a time through the HF model with ``output_hidden_states``
  (how the paper's notebooks measured), norms of every hidden state.

Memory: bytes each method keeps per batch (the reductions vs the cached activations), and the
peak resident-set growth during one full call over the 25 prompts (sampled from
``/proc/self/statm`` every 0.2 ms; indicative, allocator caching makes it a lower bound).

Usage: ``python benchmarks/gain.py`` (about 2-3 minutes on 2 cores, one torch thread by default)
or ``--quick`` (a tiny model, one repeat: a smoke test that the script runs).

Reading the paper-protocol ratio: one prompt at a time does no padding, while the batched runs
pad every prompt of a batch to its longest; on CPU, where cost is linear in token positions, that
can make the unbatched loop competitive for short prompt sets.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from _common import PeakRSS, build_checkpoint  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 1 repeat (smoke test)")
    ap.add_argument("--repeats", type=int, default=None, help="timing repeats (default 5; quick 1)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared 2-core machine more threads only "
                         "contend and make every timing noisy; 0 = torch's default)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPT2LMHeadModel

    from thermo_lens.core import prompts as prompt_sets
    from thermo_lens.measures.gain import residual_gain
    from thermo_lens.core.model import ModelView
    from thermo_lens.core.tokens import encode, plan_batches, tokenize

    prompts = list(prompt_sets.get("paper25").prompts)
    if args.quick:
        prompts = prompts[:10]
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint("gpt2", tmp, args.quick)
        bridge = TransformerBridge.boot_transformers(str(path))
        hf = GPT2LMHeadModel.from_pretrained(str(path), attn_implementation="eager").eval()
    view = ModelView(bridge)
    L = view.n_layers
    names = set(view.resid_hook_names)
    # The same padded batches residual_gain makes: prompts in order of token length ...
    order = sorted(range(len(prompts)), key=lambda i: len(encode(view, prompts[i], True)))
    tokenized = [tokenize(view, [prompts[order[k]] for k in ks], prepend_bos=True,
                          prompt_index=[order[k] for k in ks])
                 for ks in plan_batches(range(len(prompts)), args.batch_size, sort_by_length=False)]
    # ... and, for reference, batches in the caller's order (residual_gain(sort_by_length=False)).
    unsorted = [tokenize(view, [prompts[i] for i in idx], prepend_bos=True, prompt_index=list(idx))
                for idx in plan_batches(range(len(prompts)), args.batch_size, sort_by_length=False)]
    single = [tokenize(view, [p], prepend_bos=True).tokens for p in prompts]

    def bare() -> None:
        with torch.inference_mode():
            for b in tokenized:
                bridge(b.tokens, attention_mask=b.mask.long(), return_type=None)

    def thermo() -> None:
        residual_gain(bridge, prompts, batch_size=args.batch_size, progress=False)

    def bare_unsorted() -> None:
        with torch.inference_mode():
            for b in unsorted:
                bridge(b.tokens, attention_mask=b.mask.long(), return_type=None)

    def thermo_unsorted() -> None:
        residual_gain(bridge, prompts, batch_size=args.batch_size, progress=False, sort_by_length=False)

    kept = {"cache": 0}

    def cache_norms() -> None:
        with torch.inference_mode():
            for b in tokenized:
                _, cache = bridge.run_with_cache(b.tokens, attention_mask=b.mask.long(),
                                                 names_filter=lambda n: n in names)
                kept["cache"] = max(kept["cache"], sum(cache[n].numel() * cache[n].element_size() for n in names))
                norms = torch.stack([cache[n].float().norm(dim=-1) for n in view.resid_hook_names])
                (norms[1:] / norms[:-1])  # noqa: B018 - the gains
                del cache

    def paper() -> None:
        with torch.inference_mode():
            for ids in single:
                hs = hf(input_ids=ids, output_hidden_states=True).hidden_states
                norms = torch.stack([h[0, -1].float().norm() for h in hs])
                (norms[1:] / norms[:-1])  # noqa: B018

    methods = {"bare forward (batched)": bare, "residual_gain": thermo,
               "run_with_cache + norms": cache_norms, "paper protocol (HF, 1 prompt at a time)": paper,
               "bare forward, caller-order batches": bare_unsorted,
               "residual_gain, sort_by_length=False": thermo_unsorted}
    for fn in methods.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(repeats):
        for name, fn in methods.items():
            gc.collect()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["bare forward (batched)"]

    mem = {}
    for name, fn in methods.items():
        gc.collect()
        with PeakRSS() as m:
            fn()
        mem[name] = m.growth

    n_tok = int(sum(int(b.lengths.sum()) for b in tokenized))
    width = max(int(b.tokens.shape[1]) for b in tokenized)
    reduced = (L + 1) * args.batch_size * width * 4  # float32 per-token norms per batch
    print(f"thermo-lens gain benchmark: GPT-2 {'(quick, tiny)' if args.quick else 'small-sized'} random "
          f"weights, L={L}, d_model={view.d_model}; {len(prompts)} prompts ({n_tok} tokens, BOS on), "
          f"batch {args.batch_size}, {len(tokenized)} batches; torch threads {torch.get_num_threads()}; "
          f"median of {repeats}")
    print(f"{'method':<42} {'median s':>9} {'ratio':>7} {'peak RSS growth':>16}")
    for name in methods:
        print(f"{name:<42} {med[name]:>9.4f} {med[name] / base:>6.2f}x {mem[name] / 2**20:>13.1f} MiB")
    print(f"residual_gain / bare forward: {med['residual_gain'] / base:.3f}x (target <= 1.10x)")
    print(f"run_with_cache + norms / residual_gain: {med['run_with_cache + norms'] / med['residual_gain']:.2f}x")
    print(f"paper protocol / residual_gain: {med['paper protocol (HF, 1 prompt at a time)'] / med['residual_gain']:.2f}x")
    print(f"unsorted: residual_gain / bare forward: "
          f"{med['residual_gain, sort_by_length=False'] / med['bare forward, caller-order batches']:.3f}x; "
          f"length sorting speed-up: {med['residual_gain, sort_by_length=False'] / med['residual_gain']:.2f}x")
    for label, bs in (("length-sorted", tokenized), ("caller-order", unsorted)):
        padded = sum(int(b.tokens.numel()) for b in bs)
        print(f"{label} batches compute {padded} token positions for {n_tok} real tokens "
              f"({100 * (1 - n_tok / padded):.0f}% padding)")
    print(f"kept per batch: residual_gain {reduced / 2**10:.1f} KiB of float32 norms vs run_with_cache "
          f"{kept['cache'] / 2**20:.1f} MiB of activations ({kept['cache'] / reduced:.0f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
