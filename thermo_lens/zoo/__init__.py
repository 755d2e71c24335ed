"""Embedded default models: tiny *trained* checkpoints that boot offline.

These are toy models (~0.6-0.75 M parameters, 4 layers, d_model 96, context 128,
1536-token byte-level BPE) trained from scratch on CPU in a few minutes on
Python standard-library docstrings.  They exist so that thermo-lens demos,
tutorials and tests run anywhere with no network.  They are **not** the models
of any paper and say nothing quantitative about real LLMs.

Checkpoints (HF format: ``config.json``, ``model.safetensors``, tokenizer
files and a ``recipe.json`` describing exactly how each was trained) live in
``thermo_lens/zoo/<name>/``. They are rebuilt by the heritage lab
(:mod:`thermo_lens.lab`) from the repository's lab specs, on the fixed corpus file
``thermo_lens/lab/corpora/stdlib-docstrings.jsonl.gz``::

    thermo-lens lab recipes/zoo.toml --out zoo-rebuild        # gpt2-tiny-wd / gpt2-tiny-nowd
    thermo-lens lab recipes/zoo-neox.toml --out zoo-rebuild   # neox-tiny

``info(name)["provenance"]`` records the corpus file, the lab spec and arm, and how closely the
rebuild reproduces the shipped weights (the recipe that first trained them is kept in the
repository as ``recipes/zoo_recipe_v0.py``; it is not part of the installed package).

``gpt2-tiny-wd`` / ``gpt2-tiny-nowd`` -- the *training heritage* demo
    A matched pair of GPT-2-style models: same architecture, seed, initial
    weights, data order, step count and learning-rate schedule; they differ in
    exactly one knob, AdamW weight decay (0.1 vs 0.0).  Any difference in
    their residual-stream gain or attention-head spectral norms is therefore
    attributable to weight decay (``info(name)["differs_in"]``).

``neox-tiny``
    A GPT-NeoX/Pythia-style model (rotary on 25% of head dims, parallel
    residual, untied unembedding), weight decay 0.1.

Example::

    from thermo_lens import zoo
    zoo.names()                      # ['gpt2-tiny-nowd', 'gpt2-tiny-wd', 'neox-tiny']
    model = zoo.load("gpt2-tiny-wd") # TransformerBridge
    zoo.info("gpt2-tiny-wd")["results"]["final_val_loss"]
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

__all__ = ["DEFAULT", "ZOO_DIR", "names", "path", "info", "load"]

#: Directory holding the embedded checkpoints.
ZOO_DIR: Path = Path(__file__).resolve().parent

#: The default demo set: the weight-decay matched pair plus one NeoX-style model.
DEFAULT: tuple[str, ...] = ("gpt2-tiny-wd", "gpt2-tiny-nowd", "neox-tiny")


def names() -> list[str]:
    """Sorted names of the embedded checkpoints (dirs with ``recipe.json`` + ``config.json``)."""
    return sorted(
        p.name
        for p in ZOO_DIR.iterdir()
        if p.is_dir() and (p / "recipe.json").is_file() and (p / "config.json").is_file()
    )


def path(name: str) -> Path:
    """Directory of the embedded checkpoint ``name``.

    Raises:
        KeyError: if ``name`` is not an embedded checkpoint (the message lists them).
    """
    available = names()
    if not isinstance(name, str) or name not in available:
        import difflib

        close = difflib.get_close_matches(name, available, n=1, cutoff=0.8) if isinstance(name, str) else []
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise KeyError(
            f"unknown thermo_lens.zoo model {name!r}; {guess}available: {', '.join(available) or '(none)'}"
        )
    return ZOO_DIR / name


def info(name: str) -> dict[str, Any]:
    """The ``recipe.json`` of ``name``: architecture, hyperparameters, provenance, losses."""
    return json.loads((path(name) / "recipe.json").read_text())


@contextmanager
def _offline() -> Iterator[None]:
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    for k in keys:
        if saved[k] is None:
            os.environ[k] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


def load(name: str, *, device: Any = None, dtype: Any = None, **boot_kwargs: Any):
    """Boot the embedded checkpoint ``name`` as a ``TransformerBridge``, fully offline.

    ``HF_HUB_OFFLINE`` (and ``TRANSFORMERS_OFFLINE``) are set to ``1`` for the
    duration of the call when not already set, and restored afterwards.

    Args:
        name: one of :func:`names`.
        device: passed to ``TransformerBridge.boot_transformers`` (default: its choice).
        dtype: torch dtype (default ``torch.float32``).
        **boot_kwargs: forwarded to ``TransformerBridge.boot_transformers``.
    """
    ckpt = path(name)
    import torch  # lazy: keep ``names()`` / ``info()`` cheap
    from thermo_lens.host import import_bridge

    TransformerBridge = import_bridge("thermo_lens.zoo.load")

    kwargs: dict[str, Any] = dict(boot_kwargs)
    kwargs["dtype"] = torch.float32 if dtype is None else dtype
    if device is not None:
        kwargs["device"] = device
    from transformers.utils import logging as hf_logging

    # A tiny local checkpoint loads in milliseconds: transformers' per-file progress bars are noise.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with _offline():
            bridge = TransformerBridge.boot_transformers(str(ckpt), **kwargs)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    try:
        bridge.cfg.model_name = name
    except Exception:  # pragma: no cover - cfg may be frozen in some versions
        pass
    return bridge
