"""One adapter per TransformerLens host class (:class:`HostAdapter`).

:data:`ADAPTERS` lists them in the order :func:`adapter_for` tries them (the first whose
:meth:`~HostAdapter.matches` is true reads the model; a subclass before its parent class).
:func:`thermo_lens.core.host.detect_host` picks a model's adapter (and checks its TransformerLens
release); :class:`thermo_lens.core.model.ModelView` asks it every host-specific question.

A new host is one adapter file here (a subclass of :class:`HookedRootAdapter` stating what its
host does differently), one entry in :data:`ADAPTERS`, and one row in the host test matrix
(``tests/test_hosts_adapters.py``); ``docs/contributing.md`` walks through the ``HookedEncoder``
adapter as the example.

The type of ``model`` in public functions is TransformerLens' ``TransformerLensModel`` Protocol
(:mod:`thermo_lens.core.hosts.protocol`, imported for type checking only: it imports TransformerLens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from thermo_lens.core import attached
from thermo_lens.core.hosts.adapter import HookedRootAdapter, HostAdapter, takes_start_at_layer
from thermo_lens.core.hosts.bridge import BridgeAdapter
from thermo_lens.core.hosts.hooked_encoder import HookedEncoderAdapter
from thermo_lens.core.hosts.hooked_sae_transformer import HookedSAETransformerAdapter
from thermo_lens.core.hosts.hooked_transformer import HookedTransformerAdapter
from thermo_lens.core.hosts.sae_bridge import SAETransformerBridgeAdapter

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["HostAdapter", "HookedRootAdapter", "ADAPTERS", "FALLBACK", "adapter_for", "takes_start_at_layer",
           "BridgeAdapter", "SAETransformerBridgeAdapter", "HookedSAETransformerAdapter",
           "HookedTransformerAdapter", "HookedEncoderAdapter"]

#: Every host adapter, in the order they are tried.
ADAPTERS: tuple[HostAdapter, ...] = (
    SAETransformerBridgeAdapter(),
    BridgeAdapter(),
    HookedSAETransformerAdapter(),
    HookedTransformerAdapter(),
    HookedEncoderAdapter(),
)

#: The adapter of a duck-typed host no adapter claims (a ``HookedRootModule`` subclass of the
#: user's with ``cfg``, ``blocks``, ``run_with_hooks`` and ``tokenizer``): read as a
#: ``HookedTransformer``.
FALLBACK: HostAdapter = next(a for a in ADAPTERS if isinstance(a, HookedTransformerAdapter)
                             and not isinstance(a, HookedSAETransformerAdapter))


def adapter_for(model: TransformerLensModel, mro: Sequence[str] | None = None) -> HostAdapter | None:
    """The adapter that reads ``model`` (``mro``: its classes' names, default from ``type(model)``),
    or None when none claims it (a host class thermo-lens does not read, or a duck-typed host:
    :func:`thermo_lens.core.host.detect_host` decides which)."""
    names = [c.__name__ for c in type(model).__mro__] if mro is None else list(mro)
    return next((a for a in ADAPTERS if a.matches(model, names)), None)


# attached.py (below the adapters) asks a raw model's adapter what is attached to it
attached.answer_with(lambda model: adapter_for(model) or FALLBACK)
