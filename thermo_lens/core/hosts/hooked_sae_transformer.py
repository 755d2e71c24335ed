"""SAELens' ``HookedSAETransformer`` (TransformerLens 2.16.x / 3.x): a ``HookedTransformer`` whose
``add_sae`` splices SAEs into hook points.

Read as a ``HookedTransformer`` (:class:`~thermo_lens.core.hosts.hooked_transformer.HookedTransformerAdapter`).
The SAEs are found where SAELens keeps them (``_acts_to_saes``, :mod:`thermo_lens.core.attached`): a
hook name that holds one is read at the SAE's output, every result records them, and a pass from
block ``l`` is refused while one is attached (it would have to run in the blocks it skips).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from thermo_lens.core.hosts.hooked_transformer import HookedTransformerAdapter

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["HookedSAETransformerAdapter", "SAELensHost"]


class SAELensHost:
    """Where SAELens keeps the SAEs it splices in (``add_sae``), on ``HookedSAETransformer`` and
    ``SAETransformerBridge`` alike: ``_acts_to_saes`` (input hook -> wrapper) and, for transcoders,
    ``_transcoder_output_hooks`` (input hook -> the hook their output replaces)."""

    holds_saes: ClassVar[bool] = True

    def sae_wrappers(self, model: TransformerLensModel) -> dict[str, Any]:
        return dict(getattr(model, "_acts_to_saes", None) or {})

    def sae_output_hooks(self, model: TransformerLensModel) -> dict[str, str]:
        return {str(k): str(v) for k, v in (getattr(model, "_transcoder_output_hooks", None) or {}).items()}


class HookedSAETransformerAdapter(SAELensHost, HookedTransformerAdapter):
    """``sae_lens.HookedSAETransformer``."""

    kind: ClassVar[str] = "hooked_sae_transformer"
    backend: ClassVar[str] = "hooked_transformer"
    classes: ClassVar[tuple[str, ...]] = ("HookedSAETransformer",)
    markers: ClassVar[tuple[str, ...]] = ("_acts_to_saes",)
    #: ``model.saes(...)`` attaches SAEs for a run and removes them after, the hook points intact.
    swaps_saes: ClassVar[bool] = True
