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
:func:`detect_layout` reads the layout from the host's modules (the bridge's block classes and
submodules, HookedTransformer's config) and the HuggingFace config; a block that is none of
these gets a layout with :attr:`BlockLayout.unsupported` saying which component prevents an
exact split. The view (:class:`thermo_lens.model.ModelView`) exposes it as ``view.layout``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from thermo_lens import offload

__all__ = ["BlockLayout", "NormSite", "MoESite", "detect_layout", "BLOCK_KINDS"]

#: Block kinds (``thermo_lens.definitions`` §7).
BLOCK_KINDS = ("pre", "parallel", "sandwich", "post")


@dataclass(frozen=True)
class NormSite:
    """A norm inside the block whose per-token scale the attribution freezes.

    Attributes:
        module: the block's submodule name (``"ln1_post"``).
        scale_hook: hook name relative to ``blocks.{l}`` whose activation ``[batch, pos, 1]`` is
            the norm's per-token denominator ``sqrt(var(y) + eps)`` (``"ln1_post.hook_scale"``).
        centered: a LayerNorm (subtracts the mean over ``d_model``), not an RMSNorm.
    """

    module: str
    scale_hook: str
    centered: bool

    def params(self, block: Any, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor | None]:
        """``(g, beta)``: the effective ``[d_model]`` gain (``1 + w`` for Gemma's offset norms) and
        the bias (None for RMSNorm), detached on CPU."""
        norm = getattr(block, self.module)
        with offload.materialised(norm, f"{self.module}'s weights"):  # an offloaded norm, loaded for this read
            return _norm_params(norm, dtype)


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

    def metadata(self) -> dict[str, Any]:
        return {"kind": self.kind, "multiplier": self.multiplier, "description": self.describe(),
                "attn_norm": self.attn_norm.module if self.attn_norm else None,
                "mlp_norm": self.mlp_norm.module if self.mlp_norm else None,
                "stream_norms": [n.module for n in self.stream_norms],
                "n_experts": self.moe.n_experts if self.moe else None, "attention_sinks": self.attention_sinks,
                "unsupported": self.unsupported}


# ---------------------------------------------------------------------------- norms
def _is_centered(norm: Any) -> bool:
    """LayerNorm (centres) or RMSNorm (does not), for bridge and HookedTransformer norms."""
    uses_rms = getattr(norm, "uses_rms_norm", None)  # NormalizationBridge
    if isinstance(uses_rms, bool):
        return not uses_rms
    name = type(norm).__name__
    return "RMS" not in name


def _norm_params(norm: Any, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    orig = getattr(norm, "original_component", None)
    if orig is not None:  # bridge: the HF module holds the parameters
        w = getattr(orig, "weight", None)
        b = getattr(orig, "bias", None) if _is_centered(norm) else None
        offset = bool(getattr(norm, "uses_weight_offset", False))
    else:  # HookedTransformer / HookedEncoder: w, b (Gemma's offset already added at conversion)
        w, b, offset = getattr(norm, "w", None), getattr(norm, "b", None), False
    d = None
    for t in (w, b):
        if isinstance(t, Tensor):
            d = t.shape[-1]
    if w is None or not isinstance(w, Tensor):
        if d is None:
            raise RuntimeError(f"{type(norm).__name__} has no weight or bias to read its width from")
        g = torch.ones(d, dtype=dtype)
    else:
        g = w.detach().to("cpu", dtype).reshape(-1) + (1.0 if offset else 0.0)
    beta = None if not isinstance(b, Tensor) else b.detach().to("cpu", dtype).reshape(-1)
    return g, beta


def _site(block: Any, name: str) -> NormSite:
    return NormSite(module=name, scale_hook=f"{name}.hook_scale", centered=_is_centered(getattr(block, name)))


# ---------------------------------------------------------------------------- detection
def detect_layout(model: Any, host_kind: str, hf_config: Any, norm_placement: str, parallel: bool,
                  name: str) -> BlockLayout:
    """The :class:`BlockLayout` of ``model`` (a TransformerLens host).

    Args:
        model: the host model (``model.blocks`` are its blocks).
        host_kind: :attr:`thermo_lens.host.Host.kind`.
        hf_config: the HuggingFace config (bridge) or None.
        norm_placement, parallel: what :class:`~thermo_lens.model.ModelView` detected.
        name: the model's name, for messages.
    """
    model_type = getattr(hf_config, "model_type", None)
    arch = f"{name} ({model_type})" if model_type else name
    blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0:
        return BlockLayout("pre", unsupported=f"{arch} has no blocks")
    block = blocks[0]
    if host_kind == "bridge":
        layout = _bridge_layout(block, hf_config, norm_placement, parallel, arch)
        attn = getattr(getattr(block, "attn", None), "original_component", None)
        if isinstance(getattr(attn, "sinks", None), torch.Tensor):
            layout = replace(layout, attention_sinks=True)
        return layout
    if host_kind == "hooked_encoder":
        return BlockLayout("post", stream_norms=(_site(block, "ln1"), _site(block, "ln2")),
                           families="BERT (HookedEncoder)")
    return _hooked_layout(model, block, norm_placement, parallel, arch)


def _bridge_layout(block: Any, hf: Any, norm_placement: str, parallel: bool, arch: str) -> BlockLayout:
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
        return BlockLayout("post", multiplier=multiplier, stream_norms=(_site(block, "ln1"), _site(block, "ln2")),
                           moe=moe, moe_note=moe_note, families="BERT, MiniLM, OPT-350m")
    if "ln1_post" in subs or "ln2_post" in subs:
        if "ln1_post" not in subs or "ln2_post" not in subs:
            return BlockLayout("sandwich", unsupported=(
                f"{arch}: a norm after only one of the two sublayers ({', '.join(k for k in subs if k.endswith('_post'))})"))
        return BlockLayout("sandwich", multiplier=multiplier, attn_norm=_site(block, "ln1_post"),
                           mlp_norm=_site(block, "ln2_post"), mlp_hook="ln2_post.hook_in", moe=moe,
                           moe_note=moe_note, families="Gemma-2, Gemma-3, OLMo-2")
    kind = "parallel" if parallel or "ParallelBlockBridge" in cls_names else "pre"
    # A scaled block's hook_mlp_out carries alpha * M; the MLP's own output hook carries M.
    mlp_hook = f"{getattr(block, 'scaled_mlp_submodule', 'mlp')}.hook_out" if multiplier != 1.0 else "hook_mlp_out"
    if moe is not None:
        mlp_hook = "mlp.hook_out" if multiplier != 1.0 or "hook_mlp_out" not in _hooks(block) else "hook_mlp_out"
    return BlockLayout(kind, multiplier=multiplier, mlp_hook=mlp_hook, moe=moe, moe_note=moe_note,
                       families="GPT-J, GPT-NeoX, Falcon" if kind == "parallel" else "")


def _hooks(block: Any) -> set[str]:
    aliases = getattr(block, "hook_aliases", None) or {}
    return set(aliases) | {n for n, _ in block.named_modules() if n}


def _bridge_moe(mlp: Any, hf: Any, arch: str) -> tuple[MoESite | None, str | None]:
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


def _hooked_layout(model: Any, block: Any, norm_placement: str, parallel: bool, arch: str) -> BlockLayout:
    cfg = model.cfg
    if norm_placement == "post":
        return BlockLayout("post", unsupported=f"{arch}: a post-LN HookedTransformer is not a layout TransformerLens builds")
    moe_note = (f"{arch}: HookedTransformer's mixture of experts; the MLP term is exact, its per-expert split "
                "needs the model booted as a TransformerBridge") if getattr(cfg, "num_experts", None) else None
    if getattr(cfg, "use_normalization_before_and_after", False):
        # HookedTransformer's RMSNorm hooks x / scale (before the weight) at hook_normalized.
        return BlockLayout("sandwich", attn_norm=_site(block, "ln1_post"), mlp_norm=_site(block, "ln2_post"),
                           mlp_hook="ln2_post.hook_normalized", moe_note=moe_note,
                           families="Gemma-2, Gemma-3 (HookedTransformer)")
    kind = "parallel" if parallel or getattr(cfg, "parallel_attn_mlp", False) else "pre"
    return BlockLayout(kind, moe_note=moe_note)
