"""SAELens' ``SAETransformerBridge`` (TransformerLens 4.x): a ``TransformerBridge`` with
``add_sae``.

Read as a bridge (:class:`~thermo_lens.core.hosts.bridge.BridgeAdapter`; its :attr:`kind` stays
``"bridge"``). It differs in its hook names: SAELens resolves TransformerLens aliases itself
(``_resolve_hook_name``), so every hook name is re-pointed before a pass, and after
``reset_saes`` it stops running a hook point an SAE sat on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from thermo_lens.core.hosts.bridge import BridgeAdapter

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["SAETransformerBridgeAdapter"]


class SAETransformerBridgeAdapter(BridgeAdapter):
    """``sae_lens.SAETransformerBridge``."""

    classes: ClassVar[tuple[str, ...]] = ("SAETransformerBridge",)
    markers: ClassVar[tuple[str, ...]] = ("_resolve_hook_name",)

    def lost_hook_hint(self, model: TransformerLensModel) -> str | None:
        return ("SAELens' SAETransformerBridge stops running a hook point after an SAE there is "
                "removed (reset_saes): boot the model again")
