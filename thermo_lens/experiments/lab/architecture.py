"""Lab architectures as HuggingFace models, and matched initial weights across them.

Every lab model is a plain ``transformers`` causal LM, so ``TransformerBridge.boot_transformers``
boots its checkpoints and the standard battery profiles them. Three HF families cover the
architecture knobs:

=====================  ==============  ============  ==========  ================
positions / attention  norm placement  family        HF class    notes
=====================  ==============  ============  ==========  ================
learned / sequential   pre-LN          ``gpt2``      GPT2        GPT-2
learned / sequential   post-LN         ``opt``       OPT         ``do_layer_norm_before=False``, ``embed_proj_dim``
learned / sequential   pre-LN          ``opt``       OPT         when ``embed_proj_dim > 0``
rotary / sequential    pre-LN          ``gpt_neox``  GPTNeoX     ``use_parallel_residual=False``
rotary / parallel      pre-LN          ``gpt_neox``  GPTNeoX     Pythia style
=====================  ==============  ============  ==========  ================

Learned positions with parallel attention, and rotary positions with post-LN, have no HF
decoder family; asking for them raises :class:`ArchitectureError`. Post-LN needs
``embed_proj_dim > 0``: TransformerBridge's OPT adapter boots a post-LN OPT only in the OPT-350m
layout, with the embeddings in a ``embed_proj_dim``-dimensional space and ``project_in`` /
``project_out`` matrices to and from the residual stream (a post-LN OPT without them has no final
norm, which the adapter then expects). The pre-LN reference of a post-LN arm therefore has the same
projections (``embed_proj_dim`` in the knob's context), and the comparison stays one knob.

Matched initial weights: the base recipe's model is built with the HF initialiser of its own
family after ``torch.manual_seed(seed)`` (exactly what training from scratch does). Its weights are
read into a family-independent *canonical* form (``W_qkv`` as q, k, v blocks in the
``[out, in]`` Linear convention, heads contiguous), and an arm of another family is written from
that form, so every parameter two arms share starts identical. A parameter the base lacks (a
learned position table when the base is rotary, an untied unembedding when the base is tied) is
drawn ``N(0, initializer_range)`` from a generator seeded by ``(seed, name)``, so it too is the
same in every arm that has it. GPT-2 and OPT with pre-LN compute the same function from the same
canonical weights (the tests check the logits).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel
from torch import Tensor
from thermo_lens.core.errors import ThermoLensInputError

__all__ = ["Architecture", "ArchitectureError", "family_of", "hf_config", "build_model",
           "to_canonical", "from_canonical", "init_model"]

FAMILIES = ("gpt2", "opt", "gpt_neox")


class ArchitectureError(ThermoLensInputError):
    """An architecture with no HF decoder family (e.g. learned positions + parallel attention)."""


@dataclass(frozen=True)
class Architecture:
    """Family-independent architecture of a lab model (the knobs' view of it)."""

    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int = 256
    n_ctx: int = 64
    activation: str = "gelu_new"
    positions: str = "learned"          # "learned" | "rotary"
    attention: str = "sequential"       # "sequential" | "parallel"
    norm: str = "pre"                   # "pre" | "post"
    embeddings: str = "tied"            # "tied" | "untied"
    embed_proj_dim: int = 0             # > 0: OPT with project_in / project_out (OPT-350m layout)
    rotary_pct: float = 1.0
    rotary_base: float = 10000.0
    initializer_range: float = 0.02

    @property
    def family(self) -> str:
        return family_of(self)


def family_of(arch: Architecture) -> str:
    """The HF family realising ``arch`` (see the module table)."""
    if arch.embed_proj_dim:
        if arch.positions != "learned" or arch.attention != "sequential":
            raise ArchitectureError("embed_proj_dim (OPT's project_in / project_out) needs learned positions and "
                                    "sequential attention")
        return "opt"
    if arch.norm == "post":
        raise ArchitectureError("post-LN needs embed_proj_dim > 0 (OPT-350m layout; TransformerBridge boots a "
                                "post-LN OPT only with project_in / project_out): set embed_proj_dim in the knob's "
                                "context, e.g. context = { embed_proj_dim = 32 }"
                                if arch.positions == "learned" else
                                "rotary positions with post-LN: no HF decoder family (OPT, the post-LN decoder, has "
                                "learned positions); use positions = \"learned\" in the knob's context")
    if arch.positions == "learned":
        if arch.attention == "parallel":
            raise ArchitectureError("learned positions with parallel attention: no HF decoder family "
                                    "(GPT-J, GPT-NeoX, Falcon are rotary); use positions = \"rotary\" in the "
                                    "knob's context")
        return "opt" if arch.norm == "post" else "gpt2"
    if arch.norm == "post":
        raise ArchitectureError("rotary positions with post-LN: no HF decoder family (OPT, the post-LN "
                                "decoder, has learned positions); use positions = \"learned\" in the knob's context")
    return "gpt_neox"


def hf_config(arch: Architecture, vocab_size: int, special_id: int) -> PretrainedConfig:
    """The ``transformers`` config of ``arch`` (dropout 0, eager attention)."""
    import transformers

    fam = family_of(arch)
    tied = arch.embeddings == "tied"
    ids = dict(vocab_size=vocab_size, bos_token_id=special_id, eos_token_id=special_id, pad_token_id=special_id,
               tie_word_embeddings=tied)
    if fam == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=arch.n_layers, n_embd=arch.d_model, n_head=arch.n_heads, n_inner=arch.d_mlp,
            n_positions=arch.n_ctx, activation_function=arch.activation,
            initializer_range=arch.initializer_range, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids)
    elif fam == "opt":
        cfg = transformers.OPTConfig(
            num_hidden_layers=arch.n_layers, hidden_size=arch.d_model, num_attention_heads=arch.n_heads,
            ffn_dim=arch.d_mlp, max_position_embeddings=arch.n_ctx, word_embed_proj_dim=arch.embed_proj_dim or arch.d_model,
            do_layer_norm_before=arch.norm == "pre", activation_function=arch.activation,
            init_std=arch.initializer_range, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
            layerdrop=0.0, enable_bias=True, **ids)
    else:
        cfg = transformers.GPTNeoXConfig(
            num_hidden_layers=arch.n_layers, hidden_size=arch.d_model, num_attention_heads=arch.n_heads,
            intermediate_size=arch.d_mlp, max_position_embeddings=arch.n_ctx, rotary_pct=arch.rotary_pct,
            rotary_emb_base=arch.rotary_base, use_parallel_residual=arch.attention == "parallel",
            hidden_act=arch.activation, initializer_range=arch.initializer_range,
            attention_dropout=0.0, hidden_dropout=0.0, **ids)
    cfg._attn_implementation = "eager"  # what TransformerBridge uses; round-trips cleanly
    return cfg


def build_model(arch: Architecture, vocab_size: int, special_id: int) -> PreTrainedModel:
    """A freshly initialised HF model of ``arch`` (draws from torch's global RNG)."""
    import transformers

    cls = {"gpt2": transformers.GPT2LMHeadModel, "opt": transformers.OPTForCausalLM,
           "gpt_neox": transformers.GPTNeoXForCausalLM}[family_of(arch)]
    return cls(hf_config(arch, vocab_size, special_id))


# ---------------------------------------------------------------------------- canonical form
def _layer_keys(fam: str, i: int) -> dict[str, str]:
    if fam == "gpt2":
        p = f"transformer.h.{i}."
        return {"ln1.w": p + "ln_1.weight", "ln1.b": p + "ln_1.bias", "ln2.w": p + "ln_2.weight",
                "ln2.b": p + "ln_2.bias", "b_o": p + "attn.c_proj.bias", "b_in": p + "mlp.c_fc.bias",
                "b_out": p + "mlp.c_proj.bias"}
    if fam == "opt":
        p = f"model.decoder.layers.{i}."
        return {"ln1.w": p + "self_attn_layer_norm.weight", "ln1.b": p + "self_attn_layer_norm.bias",
                "ln2.w": p + "final_layer_norm.weight", "ln2.b": p + "final_layer_norm.bias",
                "W_o": p + "self_attn.out_proj.weight", "b_o": p + "self_attn.out_proj.bias",
                "W_in": p + "fc1.weight", "b_in": p + "fc1.bias", "W_out": p + "fc2.weight", "b_out": p + "fc2.bias"}
    p = f"gpt_neox.layers.{i}."
    return {"ln1.w": p + "input_layernorm.weight", "ln1.b": p + "input_layernorm.bias",
            "ln2.w": p + "post_attention_layernorm.weight", "ln2.b": p + "post_attention_layernorm.bias",
            "W_o": p + "attention.dense.weight", "b_o": p + "attention.dense.bias",
            "W_in": p + "mlp.dense_h_to_4h.weight", "b_in": p + "mlp.dense_h_to_4h.bias",
            "W_out": p + "mlp.dense_4h_to_h.weight", "b_out": p + "mlp.dense_4h_to_h.bias"}


_TOP = {
    "gpt2": {"wte": "transformer.wte.weight", "wpe": "transformer.wpe.weight", "lnf.w": "transformer.ln_f.weight",
             "lnf.b": "transformer.ln_f.bias", "lm_head": "lm_head.weight"},
    "opt": {"wte": "model.decoder.embed_tokens.weight", "wpe": "model.decoder.embed_positions.weight",
            "lnf.w": "model.decoder.final_layer_norm.weight", "lnf.b": "model.decoder.final_layer_norm.bias",
            "lm_head": "lm_head.weight"},
    "gpt_neox": {"wte": "gpt_neox.embed_in.weight", "lnf.w": "gpt_neox.final_layer_norm.weight",
                 "lnf.b": "gpt_neox.final_layer_norm.bias", "lm_head": "embed_out.weight"},
}
_OPT_POS_OFFSET = 2  # OPTLearnedPositionalEmbedding reads row position + 2


def _lm_head_key(fam: str, sd: dict[str, Tensor]) -> str | None:
    for k in (_TOP[fam]["lm_head"], "lm_head.weight"):
        if k in sd:
            return k
    return None


def to_canonical(model: torch.nn.Module, arch: Architecture) -> dict[str, Tensor]:
    """The weights of an HF lab model in the canonical, family-independent form (cloned)."""
    fam, sd = family_of(arch), model.state_dict()
    d, H = arch.d_model, arch.n_heads
    out: dict[str, Tensor] = {"wte": sd[_TOP[fam]["wte"]]}
    if arch.positions == "learned":
        wpe = sd[_TOP[fam]["wpe"]]
        out["wpe"] = wpe[_OPT_POS_OFFSET:] if fam == "opt" else wpe
    if "lnf.w" in _TOP[fam] and _TOP[fam]["lnf.w"] in sd:
        out["lnf.w"], out["lnf.b"] = sd[_TOP[fam]["lnf.w"]], sd[_TOP[fam]["lnf.b"]]
    if arch.embeddings == "untied":
        out["lm_head"] = sd[_lm_head_key(fam, sd) or _TOP[fam]["lm_head"]]  # KeyError names the key when absent
    if arch.embed_proj_dim:
        out["project_in"] = sd["model.decoder.project_in.weight"]
        out["project_out"] = sd["model.decoder.project_out.weight"]
    for i in range(arch.n_layers):
        keys = _layer_keys(fam, i)
        for c, k in keys.items():
            out[f"{i}.{c}"] = sd[k]
        if fam == "gpt2":
            p = f"transformer.h.{i}."
            out[f"{i}.W_qkv"] = sd[p + "attn.c_attn.weight"].T          # Conv1D [in, out] -> [out, in]
            out[f"{i}.b_qkv"] = sd[p + "attn.c_attn.bias"]
            out[f"{i}.W_o"] = sd[p + "attn.c_proj.weight"].T
            out[f"{i}.W_in"] = sd[p + "mlp.c_fc.weight"].T
            out[f"{i}.W_out"] = sd[p + "mlp.c_proj.weight"].T
        elif fam == "opt":
            p = f"model.decoder.layers.{i}.self_attn."
            out[f"{i}.W_qkv"] = torch.cat([sd[p + f"{x}_proj.weight"] for x in "qkv"])
            out[f"{i}.b_qkv"] = torch.cat([sd[p + f"{x}_proj.bias"] for x in "qkv"])
        else:  # NeoX: fused QKV interleaved per head, [H, 3, d_head] along the output
            p = f"gpt_neox.layers.{i}.attention.query_key_value."
            w = sd[p + "weight"].reshape(H, 3, d // H, d).transpose(0, 1).reshape(3 * d, d)
            b = sd[p + "bias"].reshape(H, 3, d // H).transpose(0, 1).reshape(3 * d)
            out[f"{i}.W_qkv"], out[f"{i}.b_qkv"] = w, b
    return {k: v.detach().clone() for k, v in out.items()}


def from_canonical(model: torch.nn.Module, arch: Architecture, canon: dict[str, Tensor]) -> None:
    """Write canonical weights into an HF lab model of ``arch`` (in place)."""
    fam = family_of(arch)
    d, H = arch.d_model, arch.n_heads
    sd = model.state_dict()
    new: dict[str, Tensor] = {_TOP[fam]["wte"]: canon["wte"]}
    if arch.positions == "learned":
        if fam == "opt":
            pos = sd[_TOP[fam]["wpe"]].clone()
            pos[_OPT_POS_OFFSET:] = canon["wpe"]
            pos[:_OPT_POS_OFFSET] = canon["wpe_opt_pad"]
            new[_TOP[fam]["wpe"]] = pos
        else:
            new[_TOP[fam]["wpe"]] = canon["wpe"]
    if _TOP[fam]["lnf.w"] in sd:
        new[_TOP[fam]["lnf.w"]], new[_TOP[fam]["lnf.b"]] = canon["lnf.w"], canon["lnf.b"]
    if arch.embeddings == "untied":
        head = _lm_head_key(fam, sd)
        if head is None:
            raise ArchitectureError(f"untied embeddings, but the {fam} model has no unembedding weight to set")
        new[head] = canon["lm_head"]
    if arch.embed_proj_dim:
        new["model.decoder.project_in.weight"] = canon["project_in"]
        new["model.decoder.project_out.weight"] = canon["project_out"]
    for i in range(arch.n_layers):
        for c, k in _layer_keys(fam, i).items():
            new[k] = canon[f"{i}.{c}"]
        W, b = canon[f"{i}.W_qkv"], canon[f"{i}.b_qkv"]
        if fam == "gpt2":
            p = f"transformer.h.{i}."
            new[p + "attn.c_attn.weight"], new[p + "attn.c_attn.bias"] = W.T, b
            new[p + "attn.c_proj.weight"] = canon[f"{i}.W_o"].T
            new[p + "mlp.c_fc.weight"] = canon[f"{i}.W_in"].T
            new[p + "mlp.c_proj.weight"] = canon[f"{i}.W_out"].T
        elif fam == "opt":
            p = f"model.decoder.layers.{i}.self_attn."
            for j, x in enumerate("qkv"):
                new[p + f"{x}_proj.weight"], new[p + f"{x}_proj.bias"] = W[j * d:(j + 1) * d], b[j * d:(j + 1) * d]
        else:
            p = f"gpt_neox.layers.{i}.attention.query_key_value."
            new[p + "weight"] = W.reshape(3, H, d // H, d).transpose(0, 1).reshape(3 * d, d)
            new[p + "bias"] = b.reshape(3, H, d // H).transpose(0, 1).reshape(3 * d)
    with torch.no_grad():
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        for k, v in new.items():
            target = params.get(k, buffers.get(k))
            if target is None:
                raise KeyError(f"{fam}: no parameter {k}")  # a mapping bug, not a user error
            target.copy_(v.reshape(target.shape))


def _extra(name: str, seed: int, shape: tuple[int, ...], std: float) -> Tensor:
    """``N(0, std)`` draws for a parameter the base model lacks, seeded by ``(seed, name)``."""
    key = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:7], "little")
    g = torch.Generator().manual_seed(key)
    return torch.randn(shape, generator=g) * std


def init_model(arch: Architecture, base: Architecture, *, seed: int, vocab_size: int, special_id: int,
               init_scale: float = 1.0) -> PreTrainedModel:
    """The initial model of an arm with architecture ``arch`` in a lab whose base is ``base``.

    ``torch.manual_seed(seed)`` then the HF initialiser of the *base* family; when ``arch`` is
    the base architecture and ``init_scale == 1`` that model is returned as is (bit-identical to
    training the base from scratch). Otherwise its canonical weights are moved into ``arch``'s
    family, with missing parameters drawn from ``(seed, name)`` generators, and every matrix
    (``ndim >= 2``: embeddings and weights, not LayerNorm or biases) is multiplied by
    ``init_scale``.
    """
    torch.manual_seed(seed)
    base_model = build_model(base, vocab_size, special_id)
    if arch == base and init_scale == 1.0:
        return base_model
    canon = to_canonical(base_model, base)
    std = base.initializer_range
    if arch.embed_proj_dim != base.embed_proj_dim:  # embeddings live in another space: their own draws
        d_e = arch.embed_proj_dim or arch.d_model
        canon["wte"] = _extra(f"wte@{d_e}", seed, (canon["wte"].shape[0], d_e), std)
        canon.pop("lm_head", None)
        if arch.embed_proj_dim:
            canon["project_in"] = _extra(f"project_in@{d_e}", seed, (arch.d_model, d_e), std)
            canon["project_out"] = _extra(f"project_out@{d_e}", seed, (d_e, arch.d_model), std)
    if arch.positions == "learned" and "wpe" not in canon:
        canon["wpe"] = _extra("wpe", seed, (arch.n_ctx, arch.d_model), std)
    canon["wpe_opt_pad"] = _extra("wpe_opt_pad", seed, (_OPT_POS_OFFSET, arch.d_model), std)
    if arch.embeddings == "untied" and "lm_head" not in canon:
        canon["lm_head"] = _extra("lm_head", seed, tuple(canon["wte"].shape), std)
    if "lnf.w" not in canon:
        canon["lnf.w"], canon["lnf.b"] = torch.ones(arch.d_model), torch.zeros(arch.d_model)
    if init_scale != 1.0:
        canon = {k: v * init_scale if v.ndim >= 2 else v for k, v in canon.items()}
    model = build_model(arch, vocab_size, special_id)
    from_canonical(model, arch, canon)
    return model
