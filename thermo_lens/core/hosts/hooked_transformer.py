"""``HookedTransformer`` (TransformerLens 2.16.x / 3.x): TransformerLens' own implementation of
each architecture, and any duck-typed ``HookedRootModule`` host (``cfg``, ``blocks``,
``run_with_hooks``, ``tokenizer``).

Everything but the block layout is :class:`~thermo_lens.core.hosts.adapter.HookedRootAdapter`'s
default: ``hook_resid_post``, ``hook_embed``, ``attention_mask``, ``forward(x_l,
start_at_layer=l)``, and ``_W_K`` / ``_W_V`` holding the un-repeated KV weights under grouped-query
attention. The layout comes from the TransformerLens config (no HF config inside).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from thermo_lens.core.hosts.adapter import HookedRootAdapter
from thermo_lens.core.layout import BlockLayout, norm_site

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["HookedTransformerAdapter"]


class HookedTransformerAdapter(HookedRootAdapter):
    """``transformer_lens.HookedTransformer`` (and the fallback for a duck-typed host)."""

    kind: ClassVar[str] = "hooked_transformer"
    backend: ClassVar[str] = "hooked_transformer"
    classes: ClassVar[tuple[str, ...]] = ("HookedTransformer",)

    def block_layout(self, model: TransformerLensModel, hf_config: object, norm_placement: str, parallel: bool,
                     arch: str) -> BlockLayout:
        cfg = model.cfg
        block = self.blocks(model)[0]
        if norm_placement == "post":
            return BlockLayout("post", unsupported=f"{arch}: a post-LN HookedTransformer is not a layout TransformerLens builds")
        moe_note = (f"{arch}: HookedTransformer's mixture of experts; the MLP term is exact, its per-expert split "
                    "needs the model booted as a TransformerBridge") if getattr(cfg, "num_experts", None) else None
        if getattr(cfg, "use_normalization_before_and_after", False):
            # HookedTransformer's RMSNorm hooks x / scale (before the weight) at hook_normalized.
            return BlockLayout("sandwich", attn_norm=norm_site(block, "ln1_post", self),
                               mlp_norm=norm_site(block, "ln2_post", self),
                               mlp_hook="ln2_post.hook_normalized", moe_note=moe_note,
                               families="Gemma-2, Gemma-3 (HookedTransformer)")
        kind = "parallel" if parallel or getattr(cfg, "parallel_attn_mlp", False) else "pre"
        return BlockLayout(kind, moe_note=moe_note)
