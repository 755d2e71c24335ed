"""Shared by the benchmark scripts: random-weight checkpoints built offline, peak-RSS sampling, and
instrumenting thermo-lens' reductions from outside the package.

Every benchmark model is a random-weight HF checkpoint built from a config and written to a local
directory with the tiny offline byte-level tokenizer of :mod:`thermo_lens.testing` (no downloads),
then booted with ``TransformerBridge.boot_transformers(directory)``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

#: kind -> (full geometry, ``--quick`` geometry): layers, d_model, heads (, KV heads for GQA).
GEOMETRIES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "gpt2": ((12, 768, 12), (2, 64, 4)),  # GPT-2-small geometry
    "small": ((6, 384, 6), (2, 64, 4)),
    "deep": ((24, 512, 8), (4, 32, 4)),  # deeper-narrower
    "gqa": ((12, 768, 12, 4), (2, 64, 4, 2)),  # LLaMA with grouped-query attention
    "1b": ((16, 2048, 32, 8), (2, 64, 4, 2)),  # LLaMA-3.2-1B geometry (GQA, MLP 8192, tied embeddings)
}

#: kind -> the MLP's hidden size (full geometry; ``--quick``: 4 x d_model).
INTERMEDIATE: dict[str, int] = {"gqa": 2048, "1b": 8192}


#: kind -> the vocabulary size of the real model of that geometry (GPT-2: 50,257; LLaMA: 32,000).
REAL_VOCAB: dict[str, int] = {"gpt2": 50257, "small": 50257, "deep": 50257, "gqa": 32000, "1b": 128256}


def build_checkpoint(kind: str, directory: Path | str, quick: bool = False, *, real_vocab: bool = False,
                     **config: Any) -> Path:
    """A random-weight checkpoint of ``kind`` (:data:`GEOMETRIES`) written to ``directory``;
    ``config`` overrides fields of the HF config. Seeded: the same weights on every call.

    ``real_vocab``: embedding and unembedding matrices of the real model's vocabulary size
    (:data:`REAL_VOCAB`; the byte-level tokenizer uses only the first ids), so that a full
    forward pays the real unembedding; else the tokenizer's own small vocabulary."""
    import transformers

    from thermo_lens.testing import make_tokenizer

    directory = Path(directory)
    tok = make_tokenizer()
    geo = GEOMETRIES[kind][1 if quick else 0]
    vocab = REAL_VOCAB[kind] if real_vocab else len(tok)
    torch.manual_seed(0)
    if kind in ("gqa", "1b"):
        n_layer, d, n_head, n_kv = geo
        cfg = transformers.LlamaConfig(
            hidden_size=d, num_hidden_layers=n_layer, num_attention_heads=n_head, num_key_value_heads=n_kv,
            intermediate_size=4 * d if quick else INTERMEDIATE[kind], max_position_embeddings=1024, vocab_size=vocab,
            bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=kind == "1b", **config)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        n_layer, d, n_head = geo
        cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=d, n_head=n_head, n_positions=1024,
                                      vocab_size=vocab, **config)
        model = transformers.GPT2LMHeadModel(cfg)
    model.eval().save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


class PeakRSS:
    """Peak resident set size growth (bytes) over a ``with`` block (Linux; ``growth`` is NaN
    elsewhere): the kernel's exact high-water mark (``VmHWM``, reset on entry through
    ``/proc/self/clear_refs``) where the kernel allows resetting it, else sampled by a thread
    (which can miss a peak that lasts less than its interval: on a pass over thousands of prompts
    the sampled peak varied by +-40 MiB between runs of the same size)."""

    def __init__(self, interval: float = 5e-4):
        self.interval, self.page = interval, os.sysconf("SC_PAGE_SIZE")
        self.available = Path("/proc/self/statm").exists()

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    @staticmethod
    def _hwm() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise OSError("no VmHWM")

    def _reset_hwm(self) -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return self._hwm() <= self._rss() + (1 << 20)
        except OSError:
            return False

    def __enter__(self) -> "PeakRSS":
        self.base = self.peak = self._rss() if self.available else 0
        self.exact = self.available and self._reset_hwm()
        self._stop = threading.Event()
        if self.available and not self.exact:
            def run() -> None:
                while not self._stop.is_set():
                    self.peak = max(self.peak, self._rss())
                    time.sleep(self.interval)
            self._t = threading.Thread(target=run, daemon=True)
            self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.available:
            if not self.exact:
                self._t.join()
            self.peak = max(self.peak, self._rss())
            if self.exact:
                self.peak = max(self.peak, self._hwm())

    @property
    def growth(self) -> float:
        return float(self.peak - self.base) if self.available else float("nan")


def release_freed_memory():
    """Hand freed heap memory back to the OS (glibc), so that the next peak RSS counts every page
    the measured call touches, not only those beyond what earlier calls left in the heap."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def wrapped_reductions(wrap: Callable[[tuple[str, int], Callable], Callable]) -> Iterator[None]:
    """Inside the block, every reduction a pass registers (``Recorder.add``) runs as
    ``wrap(key, fn)`` instead of ``fn``: a benchmark times or names thermo-lens' hooks without
    anything in the package being timed. Restored on exit."""
    from thermo_lens.core import passes

    orig = passes.Recorder.add

    def add(self, hook_name, key, fn):
        orig(self, hook_name, key, wrap(key, fn))

    passes.Recorder.add = add
    try:
        yield
    finally:
        passes.Recorder.add = orig
