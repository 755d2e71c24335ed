"""The type of ``model`` in thermo-lens' public functions: TransformerLens' ``TransformerLensModel``.

TransformerLens 4.3 ships the structural type its own model-agnostic utilities take
(``transformer_lens.model_protocol.TransformerLensModel``: ``cfg``, ``run_with_cache``,
``run_with_hooks``, ``to_tokens``); ``TransformerBridge``, ``HookedTransformer``,
``HookedSAETransformer`` and ``HookedEncoder`` all match it. Earlier releases (2.16, 3.x) have no
such module, so this one defines the same Protocol and uses it there.

Public functions annotate ``model: TransformerLensModel | ModelView`` (a
:class:`thermo_lens.core.model.ModelView` is accepted wherever a model is). Importing this module imports
TransformerLens, so other modules import it only for type checking
(``if TYPE_CHECKING: from thermo_lens.core.hosts.protocol import TransformerLensModel``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

__all__ = ["TransformerLensModel", "ThermoLensModelProtocol", "PROTOCOL_MEMBERS"]

#: The members the Protocol names (the same as TransformerLens 4.3's).
PROTOCOL_MEMBERS = ("cfg", "run_with_cache", "run_with_hooks", "to_tokens")


@runtime_checkable
class ThermoLensModelProtocol(Protocol):
    """TransformerLens 4.3's ``TransformerLensModel``, for releases that lack it: a model with a
    config and TransformerLens' hooked-run and tokenization surface. ``runtime_checkable``: an
    ``isinstance`` check tests that the members are present, as TransformerLens' own does."""

    # Only the members' presence is checked (isinstance); type checkers read TransformerLens' own
    # Protocol (imported under TYPE_CHECKING below), so these signatures say no more than "callable".
    @property
    def cfg(self) -> object: ...

    def run_with_cache(self, *args: object, **kwargs: object) -> object: ...

    def run_with_hooks(self, *args: object, **kwargs: object) -> object: ...

    def to_tokens(self, *args: object, **kwargs: object) -> object: ...


if TYPE_CHECKING:
    from transformer_lens.model_protocol import TransformerLensModel
else:
    try:
        from transformer_lens.model_protocol import TransformerLensModel
    except ImportError:  # TransformerLens < 4.3: the same Protocol, defined here
        TransformerLensModel = ThermoLensModelProtocol
