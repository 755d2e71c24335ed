"""Head write norms: how much each head writes into the residual stream.

For block ``layer`` (0-based, ``blocks.{layer}``) and head ``h``, the head's output on token ``t``
is ``z_h(t) W_O^h`` (``z_h`` its ``attn.hook_z`` row, ``W_O^h`` its ``[d_head, d_model]`` output
matrix, before the shared output bias); its write norm on a prompt is the mean over the token
scope's real tokens (:data:`thermo_lens.core.tokens.TERM_SCOPES`)::

    write_norm[p, layer, h] = mean_t ||z_h(t) W_O^h||_2

(``thermo_lens.definitions`` §1). Beside the gain attribution it separates *how much* a head
writes from *how that write lines up with the stream* (the attribution's head term is
``<z_h W_O^h, x_out + x_in>``, at most ``||z_h W_O^h|| ||x_out + x_in||`` in size).

Computed inside the hook from the ``d_head x d_head`` Gram matrix ``G_h = W_O^h W_O^{hT}``:
``||z_h W_O^h||^2 = z_h G_h z_h^T``, so no ``[token, head, d_model]`` tensor is formed
(``d_model / d_head`` times less work than forming the outputs). Only the scoped real tokens are
reduced. User hooks run first: an ablated head writes 0.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.core import measure
from thermo_lens._lazy import pandas as pd
from thermo_lens.core.inputs import Prompts
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.stats.paired import PairedMixin
from thermo_lens.core.passes import Collected, Recorder, Reduction
from thermo_lens.core.products import PerLayer, scoped_rows
from thermo_lens.core.provenance import Provenance, ProvenanceFields
from thermo_lens.core.registry import (BuildContext, Measurement, Metric, Options, Readout, option, register_measurement,
                                  register_metric)
from thermo_lens.core.result import Result, label
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.core.tokens import TERM_SCOPES, TermScope, TokenBatch, TokenScope, check_token_scope
from thermo_lens.core.validate import validates_own_inputs

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["HeadWriteNorms", "write_norms", "write_norm_terms"]

DEFINITION = ("mean over the token scope's real tokens of ||z_h(t) W_O^h||_2, the norm of what head h of block "
              "layer writes into the residual stream (before the output bias)")

register_metric(Metric(
    "write_norm", symbol="||z_h W_O^h||", formula=DEFINITION, shape="prompt layer head", result="HeadWriteNorms",
    section="gain", unit="residual norm", row="mean_write_norm", panel=True))


def _check_scope(token_scope: object) -> str:
    return check_token_scope(token_scope, TERM_SCOPES, why=" (write norms are means of per-token norms)")


@functools.lru_cache(maxsize=None)
def write_norm_terms(token_scope: str = "all_but_first") -> Reduction:
    """Reduction (for :func:`thermo_lens.core.passes.collect`): records ``("write_norm", l)``, the scoped
    mean of ``||z_h W_O^h||`` per prompt and head, ``[batch, head]`` float64."""
    _check_scope(token_scope)

    def reduction(view: ModelView, rec: Recorder) -> None:
        W_O = rec.per_pass(("W_O layers", torch.float32), view.W_O_layers)  # [head, d_head, d_model] per layer
        gram = torch.stack([w @ w.mT for w in W_O])  # [layer, head, d_head, d_head]: ||z W_O^h||^2 = z G_h z^T

        def finish(layers: list[int], stacks: list[Tensor]) -> None:
            # every layer's [n, head] squared norms at once: their square roots, summed per prompt in
            # float64 (the scoped tokens in order) and divided by the prompt's count
            sq = stacks[0]  # [layer, n, head]
            _, prompt_of, n = rec.scope_rows(token_scope, sq.device)
            per_prompt = torch.zeros(sq.shape[0], n.shape[0], sq.shape[2], dtype=torch.float64, device=sq.device)
            per_prompt.index_add_(1, prompt_of, sq.clamp_min_(0.0).sqrt_().double())
            rec.put_rows([("write_norm", l) for l in layers], per_prompt.div_(n))

        per_layer = PerLayer(rec, "write_norm", finish)
        for l in range(view.n_layers):
            name = f"blocks.{l}.attn.hook_z"

            def fn(z: Tensor, batch: TokenBatch, _l: int = l, _name: str = name) -> None:
                # [head, d_head, d_head] per layer on the activations' device: copied once per pass
                G = rec.per_pass(("write_norm_gram", str(z.device)), lambda: gram.to(z.device).unbind())[_l]
                zs = scoped_rows(rec, _name, z, token_scope)  # [n, head, d_head] float32, shared with the attribution
                per_layer.add(_l, torch.einsum("nhd,hde,nhe->nh", zs, G, zs))
            rec.add(name, ("write_norm", l), fn)
        per_layer.close()

    return reduction


@dataclass(frozen=True, repr=False, eq=False)
class HeadWriteNorms(PairedMixin, ProvenanceFields, Result):
    """How much each head writes into the residual stream, per prompt.

    Attributes:
        write_norm: ``Float[Tensor, "prompt layer head"]`` float64, the scoped mean of
            ``||z_h(t) W_O^h||_2`` (``layer`` the 0-based block index).
        token_scope: the token scope (:data:`thermo_lens.core.tokens.TERM_SCOPES`).
        provenance: prompts, lengths, BOS mode, model metadata and the user hooks of the run.
    """

    write_norm: Float[Tensor, "prompt layer head"]
    token_scope: str
    provenance: Provenance

    def __post_init__(self) -> None:
        if self.write_norm.ndim != 3 or self.write_norm.shape[0] != len(self.provenance.prompts):
            raise ValueError(f"write_norm must be [prompt, layer, head] with one row per prompt, got "
                             f"{tuple(self.write_norm.shape)} for {len(self.provenance.prompts)} prompts")

    @property
    def mean_head(self) -> Float[Tensor, "layer head"]:
        """Write norms averaged over prompts (the ``[layer, head]`` heatmap)."""
        return self.write_norm.mean(0)

    def to_frame(self) -> pd.DataFrame:
        """One row per (prompt, layer, head): ``prompt, layer, head, write_norm`` and the definition
        columns (merges with the attribution, spectral and sheaf frames on ``layer`` and ``head``):
        the generic frame of its registered metric (:meth:`Result.tidy_frame`)."""
        return self.tidy_frame()

    def __repr__(self) -> str:
        m = self.mean_head
        top = torch.argsort(m.flatten(), descending=True)[:3].tolist()
        H = m.shape[1]
        tops = ", ".join(f"{label(layer=i // H, head=i % H)} {float(m.flatten()[i]):.4g}" for i in top)
        return (f"HeadWriteNorms({self.model.get('name')}: {self.write_norm.shape[0]} prompts x {m.shape[0]} layers x "
                f"{H} heads; token_scope={self.token_scope!r}, BOS={self.prepend_bos!r}, weights {self.weights}, "
                f"{self.dtype})\n  {DEFINITION}\n  largest (mean over prompts): {tops}\n"
                f"  hooks: {self.provenance.hooks_text}")


@dataclass(frozen=True)
class WriteNormOptions(Options):
    """The options of the head write norms (checked when made)."""

    token_scope: TermScope = option("all_but_first", "the tokens the per-token norms are averaged over", _check_scope)


@register_measurement
class WriteNorm(Measurement[WriteNormOptions]):
    """How much each head writes into the residual stream (:class:`HeadWriteNorms`)."""

    name = "write_norm"
    title = "Head write norms"
    summary = "how much each head writes into the residual stream: the mean norm of z_h W_O^h over the token scope"
    result = HeadWriteNorms
    section = "gain"
    Options = WriteNormOptions
    readouts = (Readout("write_norm:<layer>.<head>", "head <head> of block <layer>'s write norm write_norm[:, layer, "
                        "head]: " + DEFINITION),)

    def reductions(self) -> list[Any]:
        return [write_norm_terms(self.options.token_scope)]

    def build(self, ctx: BuildContext) -> HeadWriteNorms:
        collected: Collected = ctx.collected
        values = collected.stack("write_norm").permute(1, 0, 2).contiguous()  # [prompt, layer, head]
        return HeadWriteNorms(write_norm=values, token_scope=self.options.token_scope,
                              provenance=collected.provenance())


@validates_own_inputs
def write_norms(model: TransformerLensModel | ModelView, prompts: Prompts, *, token_scope: TokenScope = "all_but_first",
                settings: RunSettings | None = None, **run: Unpack[RunOptions]) -> HeadWriteNorms:
    """Head write norms of ``model`` on ``prompts`` in one forward pass per batch (see the module
    docstring); ``token_scope`` (default ``"all_but_first"``) and the run options as for
    :func:`thermo_lens.gain_attribution`. The same as ``thermo_lens.run(model, prompts, ["write_norm"])``."""
    return measure.run(as_view(model), prompts, {"write_norm": {"token_scope": _check_scope(token_scope)}},
                       settings=settings, **run).write_norm
