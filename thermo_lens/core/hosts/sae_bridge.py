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
from thermo_lens.core.hosts.hooked_sae_transformer import SAELensHost

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["SAETransformerBridgeAdapter"]


class SAETransformerBridgeAdapter(SAELensHost, BridgeAdapter):
    """``sae_lens.SAETransformerBridge``."""

    classes: ClassVar[tuple[str, ...]] = ("SAETransformerBridge",)
    markers: ClassVar[tuple[str, ...]] = ("_resolve_hook_name",)
    #: SAELens' reset_saes leaves a bridge's hook point silent: SAEs are not attached for a run and removed.
    swaps_saes: ClassVar[bool] = False

    def needs_resolving(self, model: TransformerLensModel) -> bool:
        return True  # SAELens resolves TransformerLens' hook-name aliases itself

    def resolve_alias(self, model: TransformerLensModel, hook_name: str) -> str:
        resolve = getattr(model, "_resolve_hook_name", None)
        return str(resolve(hook_name)) if callable(resolve) else hook_name

    def lost_hook_hint(self, model: TransformerLensModel) -> str | None:
        return ("SAELens' SAETransformerBridge stops running a hook point after an SAE there is "
                "removed (reset_saes): boot the model again")
