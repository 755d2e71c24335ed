"""SAELens' ``HookedSAETransformer`` (TransformerLens 2.16.x / 3.x): a ``HookedTransformer`` whose
``add_sae`` splices SAEs into hook points.

Read as a ``HookedTransformer`` (:class:`~thermo_lens.core.hosts.hooked_transformer.HookedTransformerAdapter`).
The SAEs are found where SAELens keeps them (``_acts_to_saes``, :mod:`thermo_lens.core.attached`): a
hook name that holds one is read at the SAE's output, every result records them, and a pass from
block ``l`` is refused while one is attached (it would have to run in the blocks it skips).
"""

from __future__ import annotations

from typing import ClassVar

from thermo_lens.core.hosts.hooked_transformer import HookedTransformerAdapter

__all__ = ["HookedSAETransformerAdapter"]


class HookedSAETransformerAdapter(HookedTransformerAdapter):
    """``sae_lens.HookedSAETransformer``."""

    kind: ClassVar[str] = "hooked_sae_transformer"
    backend: ClassVar[str] = "hooked_transformer"
    classes: ClassVar[tuple[str, ...]] = ("HookedSAETransformer",)
    markers: ClassVar[tuple[str, ...]] = ("_acts_to_saes",)
