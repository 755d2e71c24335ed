"""Embedded default models: tiny *trained* checkpoints that boot offline.

These are toy models (~0.6-0.75 M parameters, 4 layers, d_model 96, context 128,
1536-token byte-level BPE) trained from scratch on CPU in a few minutes on
Python standard-library docstrings.  They exist so that thermo-lens demos,
tutorials and tests run anywhere with no network.  They are **not** the models
of any paper and say nothing quantitative about real LLMs.

Checkpoints (HF format: ``config.json``, ``model.safetensors``, tokenizer
files and a ``recipe.json`` describing exactly how each was trained) live in
``thermo_lens/zoo/<name>/``. They are rebuilt by the heritage lab
(:mod:`thermo_lens.experiments.lab`) from the repository's lab specs, on the fixed corpus file
``thermo_lens/experiments/lab/corpora/stdlib-docstrings.jsonl.gz``::

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
    hooked = zoo.load("gpt2-tiny-wd", host="hooked")  # HookedTransformer (TransformerLens 2.16 / 3.x)
    zoo.info("gpt2-tiny-wd")["results"]["final_val_loss"]
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import torch
    from transformer_lens import HookedTransformer

__all__ = ["DEFAULT", "HOSTS", "ZOO_DIR", "names", "path", "info", "family", "load", "portable_tokenizer_config"]

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

        from thermo_lens.core.errors import readable  # here: the zoo's listing never imports the package (torch)

        close = difflib.get_close_matches(name, available, n=1, cutoff=0.8) if isinstance(name, str) else []
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise KeyError(readable(
            f"unknown thermo_lens.zoo model {name!r}; {guess}available: {', '.join(available) or '(none)'}")
        )
    return ZOO_DIR / name


def info(name: str) -> dict[str, Any]:
    """The ``recipe.json`` of ``name``: architecture, hyperparameters, provenance, losses."""
    return json.loads((path(name) / "recipe.json").read_text())


def portable_tokenizer_config(directory: str | os.PathLike) -> None:
    """Make a saved tokenizer readable by every supported transformers version: transformers 5
    writes ``tokenizer_class: "TokenizersBackend"``, which transformers 4 (TransformerLens 2.16's)
    does not have; ``PreTrainedTokenizerFast`` is the same tokenizer on both (5 maps it back)."""
    cfg = Path(directory) / "tokenizer_config.json"
    if not cfg.is_file():
        return
    data = json.loads(cfg.read_text())
    if data.get("tokenizer_class") == "TokenizersBackend":
        data["tokenizer_class"] = "PreTrainedTokenizerFast"
        cfg.write_text(json.dumps(data, indent=2) + "\n")


_FAMILY_OF_TYPE = {"gpt2": "gpt2", "gpt_neox": "gpt-neox"}


def family(name: str) -> str:
    """The architecture family of ``name`` as the summary table and the hierarchy plot group it:
    ``recipe.json``'s ``family`` when it has one, else from the config's ``model_type``
    (``gpt2``, ``gpt-neox``)."""
    recorded = info(name).get("family")
    if isinstance(recorded, str) and recorded:
        return recorded
    model_type = str(json.loads((path(name) / "config.json").read_text()).get("model_type", ""))
    return _FAMILY_OF_TYPE.get(model_type, model_type.replace("_", "-") or "unknown")


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


#: The hosts :func:`load` boots an embedded model as.
HOSTS: tuple[str, ...] = ("bridge", "hooked", "hooked_sae")


def load(name: str, host: str = "bridge", *, device: str | torch.device | None = None, dtype: torch.dtype | None = None,
         processed: bool = False,
         **boot_kwargs: object):
    """Boot the embedded checkpoint ``name`` as a TransformerLens model, fully offline.

    ``HF_HUB_OFFLINE`` (and ``TRANSFORMERS_OFFLINE``) are set to ``1`` for the
    duration of the call when not already set, and restored afterwards.

    Args:
        name: one of :func:`names`.
        host: the model class (default ``"bridge"``):

            - ``"bridge"``: ``TransformerBridge.boot_transformers`` (TransformerLens 3.x, 4.x);
            - ``"hooked"``: a ``HookedTransformer`` (TransformerLens 2.16.x, 3.x), built by
              TransformerLens' own config and weight converters;
            - ``"hooked_sae"``: SAELens' ``HookedSAETransformer`` (needs ``sae-lens``:
              ``pip install 'thermo-lens[sae]'``), ready for ``model.add_sae(sae)``.

            A host the installed TransformerLens does not have is an
            :class:`~thermo_lens.core.errors.UnsupportedHostError` that says what to install.
        device: where the model goes (default: the host's choice; ``"cpu"`` for the hooked hosts).
        dtype: torch dtype (default ``torch.float32``).
        processed: hooked hosts only: ``False`` (the default) keeps the raw weights, as
            ``from_pretrained_no_processing`` (and the bridge) do; ``True`` folds LayerNorm and
            centres the writing weights, as ``from_pretrained`` does.
        **boot_kwargs: forwarded to ``TransformerBridge.boot_transformers`` (bridge) or to
            TransformerLens' ``get_pretrained_model_config`` (hooked hosts).

    Example::

        from thermo_lens import zoo
        bridge = zoo.load("gpt2-tiny-wd")                        # TransformerBridge
        hooked = zoo.load("gpt2-tiny-wd", host="hooked")         # HookedTransformer
        sae_host = zoo.load("gpt2-tiny-wd", host="hooked_sae")   # HookedSAETransformer
    """
    if host not in HOSTS:
        from thermo_lens.core.errors import ThermoLensInputError

        raise ThermoLensInputError(f"zoo.load: host must be one of {', '.join(map(repr, HOSTS))}, got {host!r}")
    ckpt = path(name)
    import torch  # lazy: keep ``names()`` / ``info()`` cheap

    dtype = torch.float32 if dtype is None else dtype
    if host != "bridge":
        return _load_hooked(name, ckpt, host, device=device, dtype=dtype, processed=processed, **boot_kwargs)
    if processed:
        from thermo_lens.core.errors import ThermoLensInputError

        raise ThermoLensInputError("zoo.load: processed=True is for the hooked hosts; a TransformerBridge keeps "
                                   "the raw weights (bridge.enable_compatibility_mode() processes them)")
    from thermo_lens.core.host import import_bridge

    TransformerBridge = import_bridge("thermo_lens.zoo.load")

    kwargs: dict[str, Any] = dict(boot_kwargs)
    kwargs["dtype"] = dtype
    if device is not None:
        kwargs["device"] = device
    with _quiet_offline():
        bridge = TransformerBridge.boot_transformers(str(ckpt), **kwargs)
    try:
        bridge.cfg.model_name = name
    except Exception:  # pragma: no cover - cfg may be frozen in some versions
        pass
    return bridge


@contextmanager
def _quiet_offline() -> Iterator[None]:
    """Offline, without transformers' per-file progress bars (a tiny local checkpoint loads in
    milliseconds: they are noise)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with _offline():
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _hooked_class(host: str) -> type[HookedTransformer]:
    from thermo_lens.core.errors import UnsupportedHostError
    from thermo_lens.core.host import transformer_lens_version

    if host == "hooked_sae":
        try:
            from sae_lens import HookedSAETransformer
        except ImportError:
            raise UnsupportedHostError(
                "zoo.load(host='hooked_sae') builds SAELens' HookedSAETransformer, and sae-lens is not "
                "installed: pip install 'thermo-lens[sae]' (it brings TransformerLens 3.x), or use "
                "host='bridge'") from None
        return HookedSAETransformer
    try:
        from transformer_lens import HookedTransformer
    except ImportError:
        raise UnsupportedHostError(
            f"zoo.load(host='hooked') builds a HookedTransformer, which TransformerLens "
            f"{transformer_lens_version()} does not have (it is in TransformerLens 2.16.x and 3.x: "
            "pip install 'transformer-lens>=3,<4'); on this TransformerLens use host='bridge'") from None
    return HookedTransformer


def _load_hooked(name: str, ckpt: Path, host: str, *, device: str | torch.device | None, dtype: torch.dtype,
                 processed: bool, **kwargs: object) -> HookedTransformer:
    cls = _hooked_class(host)
    from thermo_lens.testing import hooked_transformer

    with _quiet_offline():
        model = hooked_transformer(ckpt, processed=processed, cls=cls, dtype=dtype, **kwargs)
    model.cfg.model_name = name
    if device is not None:
        model = model.to(device)
    return model
