"""``TransformerBridge`` (TransformerLens 3.x / 4.x): a HuggingFace model wrapped in hook points.

Where it differs from a ``HookedRootModule`` (:class:`~thermo_lens.core.hosts.adapter.HookedRootAdapter`):

* the HF config (``model.original_model.config``) says the architecture: post-LN, parallel, the
  mixture of experts, attention sinks; the bridge's block classes and submodules say the layout;
* the embedding is hooked at ``embed.hook_out``;
* weights are raw unless ``process_weights`` / compatibility mode ran (``_weights_processed``);
  a folded LayerNorm stays as a module with identity weights;
* its ``start_at_layer`` feeds ``x_l`` to the HF model as ``inputs_embeds`` but HF still runs
  blocks ``0..l-1``: a pass from block ``l`` cuts the HF model's layer list (and the per-layer
  attention kinds, ``config.layer_types``) to blocks ``l..L-1`` for its duration.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, ContextManager, Iterator

import torch
from torch import Tensor

from thermo_lens.core.hosts.adapter import HookedRootAdapter
from thermo_lens.core.layout import BlockLayout, MoESite, NormReader, norm_site

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["BridgeAdapter", "hf_layer_list"]


def hf_layer_list(model: TransformerLensModel) -> tuple[torch.nn.Module, str] | None:
    """The module and attribute of the bridge's HF model that hold its blocks as a ``ModuleList``
    (``transformer.h``, ``model.layers`` ...), or None."""
    hf = getattr(model, "original_model", None)
    blocks = list(getattr(model, "blocks", []) or [])
    if not isinstance(hf, torch.nn.Module) or not blocks:
        return None
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == len(blocks) and all(
                a is b for a, b in zip(mod, blocks)):
            parent, _, attr = name.rpartition(".")
            return (hf.get_submodule(parent) if parent else hf), attr
    return None


def identity_norm(norm: torch.nn.Module | None, uses_offset: bool) -> bool:
    """Whether a norm module's affine parameters are the identity (weights 1, or 0 when stored as
    an offset from 1; biases 0), as folding LayerNorm leaves them."""
    if norm is None:
        return False
    params = list(norm.named_parameters())
    if not params:
        return True
    for name, p in params:
        leaf = name.rsplit(".", 1)[-1]
        v = p.detach()
        if leaf in ("b", "bias"):
            if bool(v.any()):
                return False
        elif leaf in ("w", "weight"):
            if not bool((v == (0.0 if uses_offset else 1.0)).all()):
                return False
    return True


class BridgeAdapter(HookedRootAdapter):
    """``transformer_lens.model_bridge.TransformerBridge``."""

    kind: ClassVar[str] = "bridge"
    backend: ClassVar[str] = "bridge"
    classes: ClassVar[tuple[str, ...]] = ("TransformerBridge",)
    markers: ClassVar[tuple[str, ...]] = ("adapter",)  # the bridge's architecture adapter
    embed_hook: ClassVar[str] = "embed.hook_out"
    start_method: ClassVar[str] = "the HF layer list cut to the later blocks"

    def hf_config(self, model: TransformerLensModel) -> Any:
        try:
            hf = getattr(model, "original_model", None)
        except AttributeError:
            hf = None
        return getattr(hf, "config", None)

    # ------------------------------------------------------------------ weights
    def may_be_processed(self, model: TransformerLensModel) -> bool:
        # a bridge's weights change only through process_weights / compatibility mode
        return bool(getattr(model, "_weights_processed", False))

    def ln_folded(self, model: TransformerLensModel) -> bool:
        if super().ln_folded(model):
            return True
        cfg = model.cfg
        return identity_norm(getattr(self.blocks(model)[0], "ln1", None),
                             bool(getattr(cfg, "rmsnorm_uses_offset", False)))

    # ------------------------------------------------------------------ hook points
    def gated_flag(self, model: TransformerLensModel, hook_name: str, point: object) -> str | None:
        reason = getattr(model, "_gated_hook_reason", None)
        if not callable(reason):
            return super().gated_flag(model, hook_name, point)
        try:  # keyed on the point's canonical name (an alias may always fire)
            flag = reason(getattr(point, "name", None) or hook_name)
        except Exception:  # noqa: BLE001 - a host's private helper; never block a run on it
            return None
        return str(flag) if flag else None

    # ------------------------------------------------------------------ norms
    def norm_centered(self, norm: torch.nn.Module) -> bool:
        uses_rms = getattr(norm, "uses_rms_norm", None)  # NormalizationBridge says which it is
        return (not uses_rms) if isinstance(uses_rms, bool) else super().norm_centered(norm)

    def norm_params(self, norm: torch.nn.Module, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None, bool]:
        orig = getattr(norm, "original_component", None)
        if orig is None:
            return super().norm_params(norm, dtype)
        # the HF module holds the parameters; the bridge says whether the weight is stored as g - 1
        bias = getattr(orig, "bias", None) if self.norm_centered(norm) else None
        return getattr(orig, "weight", None), bias, bool(getattr(norm, "uses_weight_offset", False))

    # ------------------------------------------------------------------ start at layer
    def _layer_list_problem(self, model: TransformerLensModel) -> str | None:
        if hf_layer_list(model) is None:
            return "the bridge's HF model holds its blocks in no layer list (its start_at_layer would run every block)"
        return None

    def hf_layer_list(self, model: TransformerLensModel) -> tuple[torch.nn.Module, str] | None:
        return hf_layer_list(model)

    def only_later_blocks(self, model: TransformerLensModel, layer: int) -> ContextManager[None]:
        return _cut_layer_list(hf_layer_list(model), layer)

    # ------------------------------------------------------------------ layout
    def block_layout(self, model: TransformerLensModel, hf_config: object, norm_placement: str, parallel: bool,
                     arch: str) -> BlockLayout:
        block = self.blocks(model)[0]
        layout = _bridge_layout(block, hf_config, norm_placement, parallel, arch, self)
        attn = getattr(getattr(block, "attn", None), "original_component", None)
        if isinstance(getattr(attn, "sinks", None), torch.Tensor):
            layout = replace(layout, attention_sinks=True)
        return layout

    def mlm_head(self, model: TransformerLensModel) -> tuple[str, torch.nn.Module] | None:
        # the HF model's masked-LM head transform (BERT-style checkpoints)
        obj: object = getattr(model, "original_model", None)
        for part in ("cls", "predictions", "transform"):
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        if not isinstance(obj, torch.nn.Module):
            return None
        return "the masked-LM head's transform (dense, activation, LayerNorm)", obj


@contextlib.contextmanager
def _cut_layer_list(layers: tuple[torch.nn.Module, str] | None, start: int) -> Iterator[None]:
    assert layers is not None, "start_support checked the layer list"
    parent, attr = layers
    full = getattr(parent, attr)
    # HF models with per-layer attention kinds (Gemma-2/3, Qwen2, GPT-OSS ...) pick each block's mask
    # and rotary embedding by its position in the loop (config.layer_types[i]): cut that list too, or
    # block l would get block 0's kind (a sliding window, a local rotary base).
    cfg: Any = getattr(parent, "config", None)
    types: Any = getattr(cfg, "layer_types", None)
    cut_types = isinstance(types, (list, tuple)) and len(types) == len(full)
    setattr(parent, attr, torch.nn.ModuleList(list(full)[start:]))
    if cut_types:
        cfg.layer_types = list(types)[start:]
    try:
        yield
    finally:
        setattr(parent, attr, full)
        if cut_types:
            cfg.layer_types = types


def _bridge_layout(block: torch.nn.Module, hf: object, norm_placement: str, parallel: bool, arch: str,
                   reader: NormReader) -> BlockLayout:
    cls_names = [c.__name__ for c in type(block).__mro__]
    subs = dict(getattr(block, "submodules", None) or {})
    if hf is not None and getattr(hf, "apply_residual_connection_post_layernorm", False):
        return BlockLayout("post", unsupported=(
            f"{arch} takes the residual after the input LayerNorm (apply_residual_connection_post_layernorm): "
            "the block's input is not carried unchanged and no hook gives that norm's output as the stream"))
    if "attn" not in subs or "mlp" not in subs:
        what = "an attention sublayer" if "attn" not in subs else "an MLP sublayer"
        return BlockLayout("pre", unsupported=(
            f"{arch}: block {type(block).__name__} has no {what} TransformerLens can hook "
            "(state-space / convolution mixers are not sums of attention heads)"))
    multiplier = float(getattr(block, "residual_contribution_scale", 1.0)) if "ScaledResidualBlockBridge" in cls_names else 1.0
    moe, moe_note = _bridge_moe(subs["mlp"], hf, arch)
    if norm_placement == "post":
        if "ln1" not in subs or "ln2" not in subs:
            return BlockLayout("post", unsupported=f"{arch}: a post-LN block without two LayerNorms (ln1, ln2)")
        return BlockLayout("post", multiplier=multiplier, stream_norms=(norm_site(block, "ln1", reader), norm_site(block, "ln2", reader)),
                           moe=moe, moe_note=moe_note, families="BERT, MiniLM, OPT-350m")
    if "ln1_post" in subs or "ln2_post" in subs:
        if "ln1_post" not in subs or "ln2_post" not in subs:
            return BlockLayout("sandwich", unsupported=(
                f"{arch}: a norm after only one of the two sublayers ({', '.join(k for k in subs if k.endswith('_post'))})"))
        return BlockLayout("sandwich", multiplier=multiplier, attn_norm=norm_site(block, "ln1_post", reader),
                           mlp_norm=norm_site(block, "ln2_post", reader), mlp_hook="ln2_post.hook_in", moe=moe,
                           moe_note=moe_note, families="Gemma-2, Gemma-3, OLMo-2")
    kind = "parallel" if parallel or "ParallelBlockBridge" in cls_names else "pre"
    # A scaled block's hook_mlp_out carries alpha * M; the MLP's own output hook carries M.
    mlp_hook = f"{getattr(block, 'scaled_mlp_submodule', 'mlp')}.hook_out" if multiplier != 1.0 else "hook_mlp_out"
    if moe is not None:
        mlp_hook = "mlp.hook_out" if multiplier != 1.0 or "hook_mlp_out" not in _hooks(block) else "hook_mlp_out"
    return BlockLayout(kind, multiplier=multiplier, mlp_hook=mlp_hook, moe=moe, moe_note=moe_note,
                       families="GPT-J, GPT-NeoX, Falcon" if kind == "parallel" else "")


def _hooks(block: torch.nn.Module) -> set[str]:
    aliases = getattr(block, "hook_aliases", None) or {}
    return set(aliases) | {n for n, _ in block.named_modules() if n}


def _bridge_moe(mlp: torch.nn.Module, hf: object, arch: str) -> tuple[MoESite | None, str | None]:
    cls_names = [c.__name__ for c in type(mlp).__mro__]
    if "MoEBridge" not in cls_names:
        return None, None
    orig = getattr(mlp, "original_component", None)
    experts = getattr(orig, "experts", None)
    n = int(getattr(hf, "num_local_experts", 0) or getattr(hf, "num_experts", 0) or 0)
    k = int(getattr(hf, "num_experts_per_tok", 0) or 0)
    for shared in ("shared_expert", "shared_experts", "shared_mlp"):
        if getattr(orig, shared, None) is not None:
            return None, (f"{arch}: the MoE adds a shared expert ({shared}) beside the routed ones; "
                          "the MLP term is exact, its per-expert split is not computed")
    if experts is None or not n or not k or not all(hasattr(mlp, h) for h in ("hook_in",)):
        return None, (f"{arch}: the MoE's experts module or routing hooks are not where TransformerLens' "
                      "MoEBridge puts them; the MLP term is exact, its per-expert split is not computed")
    hook_names = {n_ for n_, _ in mlp.named_modules()} | set(getattr(mlp, "hook_aliases", {}) or {})
    if "hook_expert_weights" not in hook_names or "hook_expert_indices" not in hook_names:
        return None, (f"{arch}: the MoE router exposes no routing weights (hook_expert_weights); the MLP "
                      "term is exact, its per-expert split is not computed")
    return MoESite(n_experts=n, top_k=k), None
