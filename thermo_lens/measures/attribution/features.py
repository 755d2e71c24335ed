"""Per-feature split of an SAE's term in the gain attribution (``thermo_lens.definitions`` §7).

An SAELens SAE (standard, top-k, JumpReLU, gated) decodes its latents ``f(x)`` ``[d_sae]`` linearly,
``sae(x) = f(x) W_dec + b_dec`` (top-k with ``rescale_acts_by_decoder_norm`` reads ``W_dec`` with
unit rows; JumpReLU's threshold is inside ``f``), so its change to the activation it replaces is

    sae(x) - x = sum_i f_i(x) W_dec[i] + (b_dec - x)     (+ its error term, with use_error_term)

and its attribution term ``<sae(x) - x, u_sae>`` splits exactly into one term per feature,
``<f_i W_dec[i], u_sae>``, a rest ``<b_dec - x, u_sae>`` and the error term's share. A transcoder
that replaces an MLP writes ``f(x) W_dec + b_dec`` where the MLP wrote, so the MLP term
``<mlp_out - b_out, u_mlp>`` splits into ``<f_i W_dec[i], u_mlp>``, a rest ``<b_dec - b_out, u_mlp>``
and its error share. Each split is checked to close, per token, in the pass.

Memory: the per-token terms ``[token, d_sae]`` are formed a few rows at a time (at most
:data:`CHUNK_ELEMENTS` elements) and summed per prompt at once, so the pass keeps one ``[batch,
d_sae]`` float64 accumulator per SAE and records ``[batch, d_sae]`` float32 means: ``4 d_sae`` bytes
per prompt and SAE (64 KiB at ``d_sae = 16384``, 512 KiB at 131072), independent of prompt length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from thermo_lens.core import attached
from thermo_lens.core.errors import ThermoLensInputError

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["FeatureSite", "feature_sites", "decoder", "split_features", "CHUNK_ELEMENTS", "FEATURE_DEFINITIONS"]

#: The most elements of a per-token ``[rows, d_sae]`` block of feature terms formed at once.
CHUNK_ELEMENTS = 1 << 22

#: What the feature terms are (``u`` the adjoint where the SAE writes: ``x_out + x_in`` at a pre-LN
#: block's ends, ``u_attn W_O^T`` for ``attn.hook_z``, ``u_mlp`` for ``hook_mlp_out`` and transcoders).
FEATURE_DEFINITIONS: dict[str, str] = {
    "sae_features": "<f_i(x) W_dec[i], u_sae>: SAE feature i's share of its block's squared-norm change (its "
                    "latent f_i after the activation function, JumpReLU's threshold and top-k included, times its "
                    "decoder row); sums with sae_feature_rest and sae_feature_error to the SAE's sae term (a "
                    "transcoder's: to the MLP term it replaces)",
    "sae_feature_rest": "<b_dec - x, u_sae>: the decoder bias minus the SAE's input (a transcoder: <b_dec - b_out, "
                        "u_mlp>, its decoder bias in place of the MLP's output bias)",
    "sae_feature_error": "<error, u_sae>: the SAE's error term's share with use_error_term (0 without); part of "
                         "sae_error for SAEs in the stream",
}

_MLP_OUT = re.compile(r"^blocks\.(\d+)\.hook_mlp_out$")
_LINEAR_NORMS = ("none", "expected_average_only_in")


@dataclass(frozen=True)
class FeatureSite:
    """One SAE whose term is split per feature.

    Attributes:
        key: the SAE's hook (``sae_records``' ``hook``; a transcoder's input hook): the result's key.
        layer: the block whose term it splits.
        site: index of the SAE among the block's stream SAEs (``_SAESite``), or None for a transcoder
            (it splits the MLP term).
        acts: the hook point of its latents (``<wrapper>.hook_sae_acts_post``).
        error: a transcoder with ``use_error_term``: the hook point of its error term; else None.
        d_sae: its number of latents.
    """

    key: str
    layer: int
    site: int | None
    acts: str
    error: str | None
    d_sae: int


def _sae_of(model: TransformerLensModel, key: str) -> Any:
    wrapper = attached.sae_wrappers(model)[key]
    return getattr(wrapper, "sae", wrapper)


def _check_linear_decoder(sae: Any, key: str) -> None:
    cfg = sae.cfg
    norm = getattr(cfg, "normalize_activations", "none")
    if norm not in _LINEAR_NORMS:
        raise ThermoLensInputError(
            f"the SAE at {key} rescales its output per token (normalize_activations={norm!r}), so its "
            "reconstruction is not f(x) W_dec + b_dec and has no exact per-feature split; fold the "
            "normalization into the weights (sae.fold_activation_norm_scaling_factor) or use an SAE trained "
            "with normalize_activations='none'")
    for name in ("W_dec", "b_dec"):
        if not isinstance(getattr(sae, name, None), torch.Tensor):
            raise ThermoLensInputError(
                f"the SAE at {key} ({type(sae).__name__}) has no {name}: sae_features splits SAELens SAEs that "
                "decode linearly (standard, top-k, JumpReLU, gated, transcoders)")


def decoder(sae: Any) -> tuple[Tensor, Tensor]:
    """``(W, b_dec)`` float32 with ``sae.decode(f) == f @ W + b_dec``: ``W_dec``, with unit rows for a
    top-k SAE that rescales its latents by the decoder norms (``rescale_acts_by_decoder_norm``)."""
    with torch.no_grad():
        W = sae.W_dec.detach().float()
        if getattr(sae.cfg, "rescale_acts_by_decoder_norm", False):
            W = W / W.norm(dim=-1, keepdim=True)
        return W.clone(), sae.b_dec.detach().float().clone()


def feature_sites(view: Any, sites: list[Any], mlp_hook: str, sae_hook: Any) -> list[FeatureSite]:
    """The attached SAEs split per feature: every stream SAE of ``sites`` (``_SAESite``, in order) and
    every transcoder whose output replaces a block's MLP output (``blocks.{l}.{mlp_hook}`` must be
    ``hook_mlp_out``). ``sae_hook(hook, which)``: the wrapper's ``hook_sae_<which>`` point.
    Raises for an SAE whose decoder is not linear and for a transcoder written elsewhere."""
    out: list[FeatureSite] = []
    per_layer: dict[int, int] = {}
    for s in sites:
        i = per_layer.get(s.layer, 0)
        per_layer[s.layer] = i + 1
        sae = _sae_of(view.model, s.hook)
        _check_linear_decoder(sae, s.hook)
        out.append(FeatureSite(key=s.hook, layer=s.layer, site=i, acts=sae_hook(s.hook, "acts_post"), error=None,
                               d_sae=int(sae.cfg.d_sae)))
    for rec in attached.sae_records(view.model):
        if rec["hook_out"] == rec["hook"]:
            continue
        m = _MLP_OUT.match(rec["hook_out"])
        if m is None or mlp_hook != "hook_mlp_out" or int(m.group(1)) >= view.n_layers:
            raise ThermoLensInputError(
                f"the transcoder {rec['hook']} -> {rec['hook_out']} does not replace a block's MLP output as "
                f"{view.name} adds it to the stream (blocks.<l>.hook_mlp_out of a "
                f"{view.layout.describe()} block), so sae_features cannot split it; attach transcoders that "
                "write blocks.<l>.hook_mlp_out, or run without sae_features")
        sae = _sae_of(view.model, rec["hook"])
        _check_linear_decoder(sae, rec["hook"])
        out.append(FeatureSite(key=rec["hook"], layer=int(m.group(1)), site=None,
                               acts=sae_hook(rec["hook_out"], "acts_post"),
                               error=sae_hook(rec["hook_out"], "error") if rec["use_error_term"] else None,
                               d_sae=int(sae.cfg.d_sae)))
    return out


def split_features(f: Tensor, W: Tensor, v: Tensor, prompt_of: Tensor, batch: int) -> tuple[Tensor, Tensor]:
    """Per-prompt sums of the feature terms and their per-token total.

    Args:
        f: ``[n, d_sae]`` the scoped tokens' latents (float32).
        W: ``[d_sae, d]`` the decoder (:func:`decoder`), on ``f``'s device.
        v: ``[n, d]`` the adjoint where the SAE writes.
        prompt_of: ``[n]`` each token's prompt in the batch.
        batch: the number of prompts in the batch.

    Returns:
        ``([batch, d_sae]`` float64 sums over each prompt's tokens of ``f_i <W_dec[i], v>``, ``[n]``
        float32 per-token sums over the features).
    """
    n, d_sae = f.shape
    sums = torch.zeros(batch, d_sae, dtype=torch.float64, device=f.device)
    per_token = f.new_empty(n)
    step = max(1, CHUNK_ELEMENTS // max(d_sae, 1))
    for a in range(0, n, step):
        t = (v[a:a + step] @ W.mT).mul_(f[a:a + step])  # [rows, d_sae]: f_i <W_dec[i], v>
        per_token[a:a + step] = t.sum(-1)
        sums.index_add_(0, prompt_of[a:a + step], t.double())
    return sums, per_token
