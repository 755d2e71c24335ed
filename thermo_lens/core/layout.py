"""Block layouts: how a transformer block turns its input into its output, read from the host.

Every block thermo-lens measures is one of these (``thermo_lens.definitions`` §7), with
``x_in`` / ``x_out`` the block's residual input and output, ``A = sum_h z_h W_O^h + b_O`` the
attention output, ``M`` the MLP (or mixture-of-experts) output and ``alpha`` the residual
multiplier (1 unless the model scales its sublayers, e.g. Granite's ``residual_multiplier``):

==============  =============================================  ==========================================
kind            block                                          families
==============  =============================================  ==========================================
``pre``         ``x_out = x_in + alpha A + alpha M``           GPT-2, OPT, LLaMA, Mistral, Qwen2/3, Phi-3,
                (each sublayer reads a normed copy)            StableLM, Gemma, BLOOM, Granite, Mixtral
``parallel``    same sum, attention and MLP read ``x_in``      GPT-J, GPT-NeoX/Pythia, Falcon
``sandwich``    ``x_out = x_in + N_a(A) + N_m(M)``             Gemma-2, Gemma-3, OLMo-2
``post``        ``x_out = L_2(L_1(x_in + A) + M)``             BERT, MiniLM, OPT-350m
==============  =============================================  ==========================================

A norm ``N(y) = r(y) * g * P y + beta`` (``P`` centres ``y`` for a LayerNorm and is the identity
for an RMSNorm; ``r(y)`` is one scalar per token) is linear in ``y`` once its per-token scale is
frozen at its value in the pass; :class:`NormSite` says where that scale is read
(``hook_scale``, ``r = 1 / hook_scale``) and what ``g``, ``beta`` and ``P`` are.
:func:`detect_layout` asks the host's adapter (:mod:`thermo_lens.core.hosts`), which reads the layout
from the host's modules (the bridge's block classes and submodules, HookedTransformer's config)
and the HuggingFace config; a block that is none of these gets a layout with :attr:`BlockLayout.unsupported` saying which component prevents an
exact split. The view (:class:`thermo_lens.core.model.ModelView`) exposes it as ``view.layout``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from thermo_lens.core import offload

__all__ = ["BlockLayout", "NormSite", "NormReader", "MoESite", "detect_layout", "norm_site", "BLOCK_KINDS"]

#: Block kinds (``thermo_lens.definitions`` §7).
BLOCK_KINDS = ("pre", "parallel", "sandwich", "post")


@runtime_checkable
class NormReader(Protocol):
    """How a host's norm modules are read (a host adapter, :class:`thermo_lens.core.hosts.HostAdapter`,
    answers: where the parameters sit and whether the norm centres differs per host)."""

    def norm_centered(self, norm: torch.nn.Module) -> bool:
        """Whether ``norm`` is a LayerNorm (subtracts the mean), not an RMSNorm."""
        ...

    def norm_params(self, norm: torch.nn.Module, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None, bool]:
        """``(weight, bias, offset)`` of ``norm`` as stored: either may be None (bias: None for an
        RMSNorm); ``offset``: the weight is stored as ``g - 1`` (Gemma's norms)."""
        ...


@dataclass(frozen=True)
class NormSite:
    """A norm inside the block whose per-token scale the attribution freezes.

    Attributes:
        module: the block's submodule name (``"ln1_post"``).
        scale_hook: hook name relative to ``blocks.{l}`` whose activation ``[batch, pos, 1]`` is
            the norm's per-token denominator ``sqrt(var(y) + eps)`` (``"ln1_post.hook_scale"``).
        centered: a LayerNorm (subtracts the mean over ``d_model``), not an RMSNorm.
        reader: the host adapter that reads the norm's parameters (:class:`NormReader`).
    """

    module: str
    scale_hook: str
    centered: bool
    reader: NormReader | None = field(default=None, compare=False, repr=False)

    def params(self, block: torch.nn.Module, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor | None]:
        """``(g, beta)``: the effective ``[d_model]`` gain (``1 + w`` for Gemma's offset norms) and
        the bias (None for RMSNorm), detached on CPU."""
        if self.reader is None:
            raise RuntimeError(f"the norm site {self.module} was made without its host's reader (norm_site(block, "
                               "name, adapter))")
        norm = getattr(block, self.module)
        with offload.materialised(norm, f"{self.module}'s weights"):  # an offloaded norm, loaded for this read
            w, b, offset = self.reader.norm_params(norm, dtype)
        return _effective(norm, w, b, offset, dtype)


@dataclass(frozen=True)
class MoESite:
    """A mixture-of-experts MLP whose output is ``sum_k w_k(t) E_{i_k(t)}(x_t)``.

    Attributes:
        n_experts: experts per layer.
        top_k: experts per token.
        input_hook, indices_hook, weights_hook: hook names relative to ``blocks.{l}``: the
            experts' input ``[batch, pos, d_model]``, the chosen experts ``[tokens, top_k]`` and
            the routing weights ``[tokens, n_experts]`` (zero where not chosen).
    """

    n_experts: int
    top_k: int
    input_hook: str = "mlp.hook_in"
    indices_hook: str = "mlp.hook_expert_indices"
    weights_hook: str = "mlp.hook_expert_weights"


@dataclass(frozen=True)
class BlockLayout:
    """How each block of a model adds to the residual stream (the same for every block).

    Attributes:
        kind: one of :data:`BLOCK_KINDS`.
        multiplier: ``alpha``, the constant each sublayer's output is scaled by before it is added
            (Granite's ``residual_multiplier``); 1.0 for most models.
        attn_norm, mlp_norm: the norms applied to the attention / MLP output before it is added
            (sandwich layouts), or None.
        stream_norms: post-LN: the norms after the attention add (``L_1``) and after the MLP add
            (``L_2``), or ``()``.
        mlp_hook: hook name (relative to ``blocks.{l}``) of the MLP output ``M`` before any
            post-norm or multiplier, output bias included.
        moe: the mixture-of-experts MLP, or None for a dense MLP.
        moe_note: why a mixture-of-experts MLP is not split per expert (None when it is, or
            when the MLP is dense).
        unsupported: why this block has no exact split (the architecture and the component that
            prevents it), or None.
        attention_sinks: the attention has learned sink logits (GPT-OSS): each query's pattern over
            the tokens sums to less than 1 (the sheaf traces use ``sum_{i != j} A_ij``).
        families: the model families with this layout (for messages and the docs).
    """

    kind: str
    multiplier: float = 1.0
    attn_norm: NormSite | None = None
    mlp_norm: NormSite | None = None
    stream_norms: tuple[NormSite, ...] = ()
    mlp_hook: str = "hook_mlp_out"
    moe: MoESite | None = None
    moe_note: str | None = None
    unsupported: str | None = None
    attention_sinks: bool = False
    families: str = field(default="", compare=False)

    @property
    def norm_sites(self) -> tuple[NormSite, ...]:
        return tuple(n for n in (self.attn_norm, self.mlp_norm, *self.stream_norms) if n is not None)

    def describe(self) -> str:
        """One line: ``"sandwich (norms after attention and MLP)"``, ``"pre-LN, multiplier 0.22"``..."""
        text = {"pre": "pre-LN", "parallel": "parallel attention and MLP (pre-LN)",
                "sandwich": "sandwich (norms after the sublayers)", "post": "post-LN"}[self.kind]
        if self.multiplier != 1.0:
            text += f", residual multiplier {self.multiplier:g}"
        if self.attention_sinks:
            text += ", attention sinks"
        if self.moe is not None:
            text += f", mixture of {self.moe.n_experts} experts (top {self.moe.top_k})"
        elif self.moe_note:
            text += ", mixture of experts (not split)"
        return text

    def metadata(self) -> dict[str, object]:
        return {"kind": self.kind, "multiplier": self.multiplier, "description": self.describe(),
                "attn_norm": self.attn_norm.module if self.attn_norm else None,
                "mlp_norm": self.mlp_norm.module if self.mlp_norm else None,
                "stream_norms": [n.module for n in self.stream_norms],
                "n_experts": self.moe.n_experts if self.moe else None, "attention_sinks": self.attention_sinks,
                "unsupported": self.unsupported}


# ---------------------------------------------------------------------------- norms
def _effective(norm: torch.nn.Module, w: Tensor | None, b: Tensor | None, offset: bool,
               dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """``(g, beta)`` from a norm's stored ``(weight, bias, offset)``: ``g = w`` (``1 + w`` stored as an
    offset; ones when the norm has no weight), on CPU in ``dtype``."""
    d = None
    for t in (w, b):
        if isinstance(t, Tensor):
            d = t.shape[-1]
    if not isinstance(w, Tensor):
        if d is None:
            raise RuntimeError(f"{type(norm).__name__} has no weight or bias to read its width from")
        g = torch.ones(d, dtype=dtype)
    else:
        g = w.detach().to("cpu", dtype).reshape(-1) + (1.0 if offset else 0.0)
    beta = None if not isinstance(b, Tensor) else b.detach().to("cpu", dtype).reshape(-1)
    return g, beta


def norm_site(block: torch.nn.Module, name: str, reader: NormReader) -> NormSite:
    """The :class:`NormSite` of ``block``'s norm submodule ``name`` (its scale hooked at
    ``<name>.hook_scale``), read by the host's adapter ``reader``."""
    return NormSite(module=name, scale_hook=f"{name}.hook_scale", centered=reader.norm_centered(getattr(block, name)),
                    reader=reader)


# ---------------------------------------------------------------------------- detection
@runtime_checkable
class _LayoutReader(Protocol):
    """What :func:`detect_layout` needs of a host adapter (:class:`thermo_lens.core.hosts.HostAdapter`)."""

    def block_layout(self, model: torch.nn.Module, hf_config: object, norm_placement: str, parallel: bool,
                     arch: str) -> BlockLayout: ...


def detect_layout(model: torch.nn.Module, adapter: _LayoutReader, hf_config: object, norm_placement: str, parallel: bool,
                  name: str) -> BlockLayout:
    """The :class:`BlockLayout` of ``model`` (a TransformerLens host), as its adapter reads it.

    Args:
        model: the host model (``model.blocks`` are its blocks).
        adapter: the host's adapter (:attr:`thermo_lens.core.host.Host.adapter`); its
            ``block_layout`` reads the blocks (the bridge's block classes and submodules,
            HookedTransformer's config, HookedEncoder's post-LN blocks).
        hf_config: the HuggingFace config (bridge) or None.
        norm_placement, parallel: what :class:`~thermo_lens.core.model.ModelView` detected.
        name: the model's name, for messages.
    """
    model_type = getattr(hf_config, "model_type", None)
    arch = f"{name} ({model_type})" if model_type else name
    blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0:
        return BlockLayout("pre", unsupported=f"{arch} has no blocks")
    return adapter.block_layout(model, hf_config, norm_placement, parallel, arch)
