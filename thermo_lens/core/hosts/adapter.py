"""The host adapter: everything thermo-lens does differently on one TransformerLens host class.

A host is a model class thermo-lens reads (``TransformerBridge``, ``HookedTransformer``,
``HookedSAETransformer``, ``HookedEncoder``, SAELens' ``SAETransformerBridge``). Everything
downstream reads a model through :class:`thermo_lens.core.model.ModelView`, and the view asks the
model's adapter (:attr:`ModelView.adapter`, picked by :func:`thermo_lens.core.host.detect_host`) every
question whose answer depends on the host:

==========================  =====================================================================
question                    members
==========================  =====================================================================
which host this is          :attr:`~HostAdapter.kind`, :attr:`~HostAdapter.backend`,
                            :meth:`~HostAdapter.matches`
hook and residual names     :attr:`~HostAdapter.resid_out_point`, :attr:`~HostAdapter.embed_hook`,
                            :attr:`~HostAdapter.mask_keyword`, :attr:`~HostAdapter.bidirectional`
the layer list              :meth:`~HostAdapter.blocks`, :meth:`~HostAdapter.attention`
weights and offload         :meth:`~HostAdapter.attn_weight`, :meth:`~HostAdapter.module_weight`,
                            :meth:`~HostAdapter.materialised`, :meth:`~HostAdapter.may_be_processed`,
                            :meth:`~HostAdapter.ln_folded`, :meth:`~HostAdapter.hf_config`
start at layer ``l``        :meth:`~HostAdapter.start_support`, :meth:`~HostAdapter.hf_layer_list`,
                            :meth:`~HostAdapter.only_later_blocks`, :attr:`~HostAdapter.start_method`
token conventions           :meth:`~HostAdapter.to_tokens`, :meth:`~HostAdapter.token_ids`
the block layout            :meth:`~HostAdapter.block_layout`, :meth:`~HostAdapter.norm_centered`,
                            :meth:`~HostAdapter.norm_params`
hooks already on the model  :meth:`~HostAdapter.attached_hooks`, :meth:`~HostAdapter.needs_resolving`,
                            :meth:`~HostAdapter.resolve_hook`, :meth:`~HostAdapter.resolve_alias`,
                            :meth:`~HostAdapter.gated_flag`, :meth:`~HostAdapter.has_saes`,
                            :meth:`~HostAdapter.sae_wrappers`, :meth:`~HostAdapter.sae_output_hooks`,
                            :meth:`~HostAdapter.check_saes`, :meth:`~HostAdapter.sae_records`,
                            :meth:`~HostAdapter.lost_hook_hint`; :attr:`~HostAdapter.holds_saes`,
                            :attr:`~HostAdapter.swaps_saes`
readouts past the stream    :meth:`~HostAdapter.mlm_head`
==========================  =====================================================================

:class:`HostAdapter` is the Protocol; :class:`HookedRootAdapter` answers every question the way a
TransformerLens ``HookedRootModule`` does (``model.blocks``, ``hook_resid_post``, ``attention_mask``,
``forward(start_at_layer=...)``), so an adapter states only where its host differs. Adapters take
the host model object, never a view (the view sits above them), and hold no state: one instance
serves every model of its class.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Any, ClassVar, ContextManager, Protocol, Sequence, cast, runtime_checkable

import torch
from torch import Tensor

from thermo_lens.core import attached, offload
from thermo_lens.core.layout import BlockLayout

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["HostAdapter", "HookedRootAdapter", "takes_start_at_layer", "GATED_HOOKS"]

#: Hook points a ``HookedRootModule`` fires only when a config flag is on (TransformerLens' setters
#: ``set_use_attn_result`` ... switch them): ``(hook name suffix, cfg flag)``.
GATED_HOOKS = (("attn.hook_result", "use_attn_result"), ("hook_attn_in", "use_attn_in"),
               ("hook_q_input", "use_split_qkv_input"), ("hook_k_input", "use_split_qkv_input"),
               ("hook_v_input", "use_split_qkv_input"), ("hook_mlp_in", "use_hook_mlp_in"),
               ("hook_tokens", "use_hook_tokens"))


@runtime_checkable
class HostAdapter(Protocol):
    """What thermo-lens asks a host. See the module docstring for the members by question."""

    #: :attr:`thermo_lens.core.host.Host.kind`: ``"bridge"``, ``"hooked_transformer"``,
    #: ``"hooked_sae_transformer"`` or ``"hooked_encoder"`` (recorded with every result).
    kind: ClassVar[str]
    #: :attr:`thermo_lens.core.model.ModelView.backend`, recorded in the model metadata.
    backend: ClassVar[str]
    #: The host class names (in the model's MRO) this adapter reads.
    classes: ClassVar[tuple[str, ...]]
    #: The block's output residual hook, relative to ``blocks.{l}``: ``x_{l+1}`` as block ``l+1``
    #: receives it.
    resid_out_point: ClassVar[str]
    #: The hook of the token (plus position) embedding, ``x_0`` before any block.
    embed_hook: ClassVar[str]
    #: The keyword of ``run_with_hooks`` / ``forward`` that takes the ``[batch, pos]`` 0/1 mask.
    mask_keyword: ClassVar[str]
    #: Attention is bidirectional (a real token may attend any pad).
    bidirectional: ClassVar[bool]
    #: How a pass that starts at layer ``l`` skips blocks ``0..l-1`` (for the sweep's sentence).
    start_method: ClassVar[str]
    #: The host can hold SAEs (SAELens' ``add_sae``).
    holds_saes: ClassVar[bool]
    #: SAEs can be attached and removed around a run (``model.saes(...)``) and the hook points keep
    #: firing afterwards.
    swaps_saes: ClassVar[bool]

    def matches(self, model: TransformerLensModel, mro: Sequence[str]) -> bool:
        """Whether this adapter reads ``model`` (``mro``: its classes' names)."""
        ...

    def hf_config(self, model: TransformerLensModel) -> object:
        """The HuggingFace config of the model inside the host, or None."""
        ...

    def blocks(self, model: TransformerLensModel) -> torch.nn.ModuleList | Sequence[torch.nn.Module]:
        """The transformer blocks, in order (``blocks[l]`` is block ``l``)."""
        ...

    def attention(self, model: TransformerLensModel, layer: int) -> torch.nn.Module:
        """Block ``layer``'s attention module (``W_Q``, ``W_K``, ``W_V``, ``W_O``, ``b_O``)."""
        ...

    def attn_weight(self, attn: torch.nn.Module, name: str) -> Tensor:
        """``W_Q`` / ``W_K`` / ``W_V`` / ``W_O`` of an attention module as stored (KV weights
        un-repeated under grouped-query attention)."""
        ...

    def module_weight(self, module: torch.nn.Module, name: str, default: object = None) -> Any:
        """``module.<name>`` as it is now (through an offloaded module's aliases)."""
        ...

    def materialised(self, module: torch.nn.Module, what: str) -> ContextManager[None]:
        """A context in which ``module``'s offloaded weights are loaded (a no-op in memory)."""
        ...

    def may_be_processed(self, model: TransformerLensModel) -> bool:
        """Whether TransformerLens may have processed the weights (folded, centred)."""
        ...

    def ln_folded(self, model: TransformerLensModel) -> bool:
        """Whether LayerNorm was folded into the weights that read it (``fold_ln``)."""
        ...

    def start_support(self, model: TransformerLensModel, describe: str) -> str | None:
        """Why this host cannot run a pass from block ``l`` (``describe``: the host for the
        message), or None."""
        ...

    def hf_layer_list(self, model: TransformerLensModel) -> tuple[torch.nn.Module, str] | None:
        """The module and attribute holding the blocks a start-at-layer pass cuts, or None."""
        ...

    def only_later_blocks(self, model: TransformerLensModel, layer: int) -> ContextManager[None]:
        """A context in which ``run_with_hooks(x_l, start_at_layer=l)`` runs blocks ``l..L-1`` only."""
        ...

    def to_tokens(self, model: TransformerLensModel, prompt: str) -> list[int] | None:
        """``prompt``'s ids exactly as ``model.to_tokens`` gives them (untruncated), or None for a
        host without ``to_tokens``."""
        ...

    def token_ids(self, out: object) -> Tensor:
        """The ``[batch, pos]`` ids in what ``model.to_tokens`` returned."""
        ...

    def block_layout(self, model: TransformerLensModel, hf_config: object, norm_placement: str, parallel: bool,
                     arch: str) -> BlockLayout:
        """The :class:`~thermo_lens.core.layout.BlockLayout` of the model's blocks (``arch`` names the
        model in messages)."""
        ...

    def norm_centered(self, norm: torch.nn.Module) -> bool:
        """Whether the norm module ``norm`` is a LayerNorm (subtracts the mean), not an RMSNorm."""
        ...

    def norm_params(self, norm: torch.nn.Module, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None, bool]:
        """``(weight, bias, offset)`` of the norm module ``norm`` as stored (either may be None;
        ``offset``: the weight is stored as ``g - 1``), for :meth:`~thermo_lens.core.layout.NormSite.params`."""
        ...

    def attached_hooks(self, model: TransformerLensModel) -> tuple[attached.AttachedHook, ...]:
        """Hooks and SAEs already on the model (they run in every pass)."""
        ...

    def sae_wrappers(self, model: TransformerLensModel) -> dict[str, Any]:
        """``{input hook: wrapper}`` of the SAEs spliced into the model (``{}``: the host holds none)."""
        ...

    def sae_output_hooks(self, model: TransformerLensModel) -> dict[str, str]:
        """``{input hook: output hook}`` of the spliced-in SAEs that write elsewhere (transcoders)."""
        ...

    def resolve_alias(self, model: TransformerLensModel, hook_name: str) -> str:
        """The host's own name for a hook name it does not list (an alias), else ``hook_name``."""
        ...

    def gated_flag(self, model: TransformerLensModel, hook_name: str, point: object) -> str | None:
        """The config flag that must be on for hook point ``point`` to fire, when it is off; else None."""
        ...

    def needs_resolving(self, model: TransformerLensModel) -> bool:
        """Whether hook names must be re-pointed (:meth:`resolve_hook`) before a pass."""
        ...

    def has_saes(self, model: TransformerLensModel) -> bool:
        """Whether an SAE is spliced into the model (its hooks re-point hook names)."""
        ...

    def check_saes(self, model: TransformerLensModel, name: str, d_model: int) -> None:
        """Raise for a spliced-in SAE whose width does not fit its hook point (``name``: the
        model's, for the message)."""
        ...

    def resolve_hook(self, model: TransformerLensModel, hook_name: attached.NameOrFilter, name: str) -> attached.NameOrFilter:
        """The hook point carrying ``hook_name``'s activation downstream (an SAE's output)."""
        ...

    def sae_records(self, model: TransformerLensModel) -> list[dict[str, Any]]:
        """One record per SAE spliced into the model."""
        ...

    def lost_hook_hint(self, model: TransformerLensModel) -> str | None:
        """Why this host may stop running a hook point a pass asked for, when it can, or None."""
        ...

    def mlm_head(self, model: TransformerLensModel) -> tuple[str, torch.nn.Module] | None:
        """The masked-LM head between the last residual and the unembedding (what it is, in words,
        and the module), or None."""
        ...


def takes_start_at_layer(model: object) -> bool:
    """Whether ``model.forward`` takes ``start_at_layer``: named in its signature, or passed on by
    a subclass's ``forward(input, **kwargs)`` to a parent class's forward that names it (SAELens'
    ``HookedSAETransformer.forward`` hands every keyword to ``HookedTransformer.forward``)."""
    # an instance's own forward first (e.g. accelerate's offloading wrapper), then the classes'
    owners = [getattr(model, "__dict__", {})] + [cls.__dict__ for cls in type(model).__mro__]
    for owner in owners:
        fn = owner.get("forward")
        if fn is None:
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False
        if "start_at_layer" in params:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return False  # this forward neither names it nor passes keywords on
    return False


class HookedRootAdapter:
    """The answers of a TransformerLens ``HookedRootModule``: the defaults every adapter starts
    from. A subclass sets :attr:`kind`, :attr:`backend`, :attr:`classes` and overrides what its
    host does differently; :meth:`block_layout` has no default."""

    kind: ClassVar[str] = ""
    backend: ClassVar[str] = ""
    classes: ClassVar[tuple[str, ...]] = ()
    #: Attributes that identify the host on an object whose class names do not (a subclass of the
    #: user's, a wrapper).
    markers: ClassVar[tuple[str, ...]] = ()
    resid_out_point: ClassVar[str] = "hook_resid_post"
    embed_hook: ClassVar[str] = "hook_embed"
    mask_keyword: ClassVar[str] = "attention_mask"
    bidirectional: ClassVar[bool] = False
    start_method: ClassVar[str] = "start_at_layer"
    holds_saes: ClassVar[bool] = False
    swaps_saes: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r})"

    # ------------------------------------------------------------------ identity
    def matches(self, model: TransformerLensModel, mro: Sequence[str]) -> bool:
        return any(c in mro for c in self.classes) or any(hasattr(model, m) for m in self.markers)

    def hf_config(self, model: TransformerLensModel) -> object:
        return None

    # ------------------------------------------------------------------ layers and weights
    def blocks(self, model: TransformerLensModel) -> torch.nn.ModuleList | Sequence[torch.nn.Module]:
        return model.blocks

    def attention(self, model: TransformerLensModel, layer: int) -> torch.nn.Module:
        return cast(torch.nn.Module, self.blocks(model)[layer].attn)

    def attn_weight(self, attn: torch.nn.Module, name: str) -> Tensor:
        # Legacy GQA attention keeps the un-repeated KV weights in `_W_K` / `_W_V`.
        w = getattr(attn, f"_{name}", None) if name in ("W_K", "W_V") else None
        if w is None:
            w = offload.live_attr(attn, name)
            if w is None:
                w = getattr(attn, name)
        return w

    def module_weight(self, module: torch.nn.Module, name: str, default: object = None) -> Any:
        return offload.live_attr(module, name, default)

    def materialised(self, module: torch.nn.Module, what: str) -> ContextManager[None]:
        return offload.materialised(module, what)

    def may_be_processed(self, model: TransformerLensModel) -> bool:
        return True

    def ln_folded(self, model: TransformerLensModel) -> bool:
        # from_pretrained(fold_ln=True) swaps the first LayerNorm for LNPre / RMSPre
        return str(getattr(model.cfg, "normalization_type", "")).endswith("Pre")

    # ------------------------------------------------------------------ start at layer
    def start_support(self, model: TransformerLensModel, describe: str) -> str | None:
        if not takes_start_at_layer(model):  # run_with_hooks passes it on (by name or **kwargs)
            return f"{describe} has no start_at_layer"
        why = self._layer_list_problem(model)
        if why:
            return why
        if getattr(getattr(model, "cfg", None), "positional_embedding_type", None) == "shortformer":
            return "a shortformer model adds its positional embedding in every block"
        return None

    def _layer_list_problem(self, model: TransformerLensModel) -> str | None:
        return None

    def hf_layer_list(self, model: TransformerLensModel) -> tuple[torch.nn.Module, str] | None:
        return None

    def only_later_blocks(self, model: TransformerLensModel, layer: int) -> ContextManager[None]:
        # forward(x_l, start_at_layer=l) runs blocks l..L-1 only
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ tokens
    def to_tokens(self, model: TransformerLensModel, prompt: str) -> list[int] | None:
        to_tokens = getattr(model, "to_tokens", None)
        if to_tokens is None:
            return None
        ids = self.token_ids(to_tokens(prompt, move_to_device=False, truncate=False))
        return [int(i) for i in ids[0].tolist()]

    def token_ids(self, out: object) -> Tensor:
        return out if isinstance(out, Tensor) else torch.as_tensor(out)

    # ------------------------------------------------------------------ layout
    def block_layout(self, model: TransformerLensModel, hf_config: object, norm_placement: str, parallel: bool,
                     arch: str) -> BlockLayout:
        raise NotImplementedError(f"{type(self).__name__} does not say how its blocks are laid out")

    def norm_centered(self, norm: torch.nn.Module) -> bool:
        return "RMS" not in type(norm).__name__  # LayerNorm / LayerNormPre centre; RMSNorm / RMSNormPre do not

    def norm_params(self, norm: torch.nn.Module, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None, bool]:
        # TransformerLens' norms keep w and b (Gemma's offset already added when the weights were converted)
        return getattr(norm, "w", None), getattr(norm, "b", None), False

    # ------------------------------------------------------------------ hooks already on the model
    def attached_hooks(self, model: TransformerLensModel) -> tuple[attached.AttachedHook, ...]:
        return attached.attached_hooks(model)

    def needs_resolving(self, model: TransformerLensModel) -> bool:
        return bool(self.sae_wrappers(model))  # a hook point holding an SAE is read at the SAE's output

    def has_saes(self, model: TransformerLensModel) -> bool:
        return bool(self.sae_wrappers(model))

    def sae_wrappers(self, model: TransformerLensModel) -> dict[str, Any]:
        return {}

    def sae_output_hooks(self, model: TransformerLensModel) -> dict[str, str]:
        return {}

    def resolve_alias(self, model: TransformerLensModel, hook_name: str) -> str:
        return hook_name

    def gated_flag(self, model: TransformerLensModel, hook_name: str, point: object) -> str | None:
        cfg = getattr(model, "cfg", None)
        for suffix, flag in GATED_HOOKS:
            if hook_name.endswith(suffix) and getattr(cfg, flag, True) is False:
                return flag
        return None

    def check_saes(self, model: TransformerLensModel, name: str, d_model: int) -> None:
        attached.check_saes(model, name, d_model)

    def resolve_hook(self, model: TransformerLensModel, hook_name: attached.NameOrFilter, name: str) -> attached.NameOrFilter:
        return attached.resolve_hook(model, hook_name, name)

    def sae_records(self, model: TransformerLensModel) -> list[dict[str, Any]]:
        return attached.sae_records(model)

    def lost_hook_hint(self, model: TransformerLensModel) -> str | None:
        return None

    def mlm_head(self, model: TransformerLensModel) -> tuple[str, torch.nn.Module] | None:
        return None
