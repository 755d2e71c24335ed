"""``HookedEncoder`` (TransformerLens 2.16.x / 3.x): BERT, post-LN and bidirectional.

Where it differs from a ``HookedRootModule`` (:class:`~thermo_lens.core.hosts.adapter.HookedRootAdapter`),
each answer one member below:

* **residual names**: its ``blocks.{l}.hook_resid_post`` is taken *before* the block's final
  LayerNorm, so the stream the next block receives is ``blocks.{l}.hook_normalized_resid_post``
  (:attr:`resid_out_point`): the same numbers as the same checkpoint booted as a
  ``TransformerBridge``, whose block output is that norm's output;
* **embedding**: token, position and token-type embeddings summed at ``hook_full_embed``;
* **mask**: ``run_with_hooks`` takes the mask as ``one_zero_attention_mask``, and every token may
  attend every pad (:attr:`bidirectional`);
* **weights**: never folded or centred (its post-LN norms cannot be folded);
* **start at layer**: ``forward`` has no ``start_at_layer``: sweeps run every pass from the
  embedding;
* **tokens**: ``to_tokens`` returns ``(tokens, token_type_ids, attention_mask)``;
* **layout**: every block is post-LN, ``x_out = L_2(L_1(x_in + A) + M)`` with ``ln1``, ``ln2``;
* **readout**: a masked-LM head (dense, activation, LayerNorm) before the unembedding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from thermo_lens.core.hosts.adapter import HookedRootAdapter
from thermo_lens.core.layout import BlockLayout, norm_site

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["HookedEncoderAdapter"]


class HookedEncoderAdapter(HookedRootAdapter):
    """``transformer_lens.HookedEncoder``."""

    kind: ClassVar[str] = "hooked_encoder"
    backend: ClassVar[str] = "hooked_encoder"
    classes: ClassVar[tuple[str, ...]] = ("HookedEncoder",)
    resid_out_point: ClassVar[str] = "hook_normalized_resid_post"
    embed_hook: ClassVar[str] = "hook_full_embed"
    mask_keyword: ClassVar[str] = "one_zero_attention_mask"
    bidirectional: ClassVar[bool] = True

    def may_be_processed(self, model: TransformerLensModel) -> bool:
        return False

    def start_support(self, model: TransformerLensModel, describe: str) -> str | None:
        return "HookedEncoder has no start_at_layer"

    def token_ids(self, out: object) -> Tensor:
        return super().token_ids(out[0] if isinstance(out, tuple) else out)  # (tokens, token_type_ids, attention_mask)

    def block_layout(self, model: TransformerLensModel, hf_config: object, norm_placement: str, parallel: bool,
                     arch: str) -> BlockLayout:
        block = self.blocks(model)[0]
        return BlockLayout("post", stream_norms=(norm_site(block, "ln1", self), norm_site(block, "ln2", self)),
                           families="BERT (HookedEncoder)")

    def mlm_head(self, model: TransformerLensModel) -> tuple[str, torch.nn.Module] | None:
        head = getattr(model, "mlm_head", None)
        return None if head is None else ("the masked-LM head (dense, activation, LayerNorm)", head)
