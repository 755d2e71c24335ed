"""Which TransformerLens host a model object comes from, and whether thermo-lens supports it.

Supported hosts (each tested on a CI leg of its own):

=================================  ===========================  ==============================
host class                         TransformerLens              notes
=================================  ===========================  ==============================
``HookedTransformer``              2.16.x, 3.x                  raw or processed weights
``HookedSAETransformer`` (SAELens) 2.16.x, 3.x                  SAEs attached with ``add_sae``
``TransformerBridge``              3.x, 4.x                     with or without compatibility mode
``HookedEncoder`` (BERT)           2.16.x, 3.x                  read at the stream the next block gets
=================================  ===========================  ==============================

``HookedEncoder``'s ``blocks.{l}.hook_resid_post`` is taken *before* the block's final LayerNorm,
so thermo-lens reads its residual states at ``blocks.{l}.hook_normalized_resid_post`` (the norm's
output, what block ``l + 1`` receives and what every other host records as the block output):
the same numbers as the same checkpoint booted as a ``TransformerBridge``.

:func:`detect_host` picks the model's adapter (:mod:`thermo_lens.core.hosts`, one per host class),
which answers everything host-specific for the view; a model no adapter claims but that has
``cfg``, ``blocks``, ``run_with_hooks`` and ``tokenizer`` is read as a ``HookedTransformer``.

A model from another TransformerLens release, or a host class thermo-lens cannot read
(``HookedEncoderDecoder``: two stacks whose blocks are not one residual stream;
``HookedAudioEncoder``), gets a :class:`UnsupportedHostError` that says what to install or load
instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from thermo_lens.core.errors import UnsupportedHostError
from thermo_lens.core.hosts import FALLBACK, HostAdapter, adapter_for

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["Host", "UnsupportedHostError", "detect_host", "import_bridge", "SUPPORTED_TL", "transformer_lens_version"]

#: The TransformerLens releases thermo-lens supports (the dependency range in pyproject.toml).
SUPPORTED_TL = ">=2.16.1,<5"
_MIN, _MAX_MAJOR = (2, 16, 1), 5



@dataclass(frozen=True)
class Host:
    """The host of a model: ``kind`` (``"bridge"``, ``"hooked_transformer"``,
    ``"hooked_sae_transformer"`` or ``"hooked_encoder"``), its class name, the TransformerLens
    version it runs on, and the :class:`~thermo_lens.core.hosts.HostAdapter` that reads it."""

    kind: str
    cls: str
    transformer_lens: str
    adapter: HostAdapter = field(default=FALLBACK, compare=False, repr=False)

    def describe(self) -> str:
        return f"{self.cls} (TransformerLens {self.transformer_lens})"


@functools.lru_cache(maxsize=1)
def transformer_lens_version() -> str:
    """The installed TransformerLens version (``importlib.metadata``; TL 2.x has no ``__version__``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformer-lens")
    except PackageNotFoundError:  # pragma: no cover - a model object implies it is installed
        return "unknown"


def _parse(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def _mro_names(model: object) -> list[str]:
    return [c.__name__ for c in type(model).__mro__]


def detect_host(model: TransformerLensModel, version: str | None = None) -> Host:
    """Classify ``model``, pick its adapter (the first of :data:`thermo_lens.core.hosts.ADAPTERS` that
    claims it) and check its TransformerLens version is supported.

    Args:
        model: a TransformerLens model object.
        version: the TransformerLens version (default: the installed one).

    Raises:
        UnsupportedHostError: a TransformerLens release outside ``SUPPORTED_TL``, a
            ``HookedEncoderDecoder`` / ``HookedAudioEncoder``, or a TransformerLens class that is not
            a model host.
    """
    version = version or transformer_lens_version()
    names = _mro_names(model)
    module = type(model).__module__ or ""
    adapter = adapter_for(model, names)
    if adapter is not None:
        kind = adapter.kind
    elif any(n in names for n in ("HookedEncoderDecoder", "HookedAudioEncoder")):
        raise UnsupportedHostError(
            f"thermo-lens does not read {type(model).__name__}: "
            + ("an encoder and a decoder stack with cross-attention are not one residual stream, so "
               "block gains along it are not defined. For the encoder alone boot it as a TransformerBridge: "
               "`TransformerBridge.boot_transformers('<name or dir>')` (TransformerLens >= 3)."
               if "HookedEncoderDecoder" in names else
               "its blocks read audio features, not tokens, and thermo-lens' passes tokenize text.")
        )
    else:
        # Duck-typed host (a HookedRootModule subclass of the user's): read like HookedTransformer.
        adapter = FALLBACK
        kind = adapter.kind
    parsed = _parse(version)
    from_tl = module.startswith(("transformer_lens", "sae_lens")) or kind != "hooked_transformer"
    if from_tl and parsed and (parsed < _MIN or parsed[0] >= _MAX_MAJOR):
        raise UnsupportedHostError(
            f"this {type(model).__name__} comes from TransformerLens {version}; thermo-lens supports "
            f"TransformerLens {SUPPORTED_TL} (HookedTransformer / HookedSAETransformer on 2.16.x and "
            "3.x, TransformerBridge on 3.x and 4.x). "
            + ("Upgrade: pip install 'transformer-lens>=2.16.1' (for TransformerLens 2.16 on "
               "Python 3.11 also 'numpy<2' 'pyarrow<22': pip install 'thermo-lens[tl2]')."
               if parsed < _MIN else
               "Install a supported release: pip install 'transformer-lens>=2.16.1,<5'.")
        )
    if kind == "bridge" and parsed and parsed[0] < 3:
        raise UnsupportedHostError(  # pragma: no cover - no 2.x release ships a bridge
            f"TransformerBridge from TransformerLens {version} is a pre-release; use TransformerLens >= 3."
        )
    return Host(kind=kind, cls=type(model).__name__, transformer_lens=version, adapter=adapter)


def import_bridge(what: str) -> type[TransformerBridge]:
    """``TransformerBridge``, or an :class:`UnsupportedHostError` saying what to do on
    TransformerLens 2.x (which has no bridge). ``what`` names the feature that boots one."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        raise UnsupportedHostError(
            f"{what} boots a TransformerBridge, which needs TransformerLens >= 3 (installed: "
            f"{transformer_lens_version()}). On TransformerLens 2.16, load a HookedTransformer "
            "yourself (HookedTransformer.from_pretrained_no_processing(name)) and pass it to "
            "thermo-lens; the embedded models: thermo_lens.zoo.load(name, host='hooked')."
        ) from None
    return TransformerBridge
