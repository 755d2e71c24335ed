"""Anisotropy profile: how aligned the token states of the residual stream are, layer by layer.

Definition (D'Elia 2026, "Thermodynamic Constraints in Transformer Architectures", appendix C,
no code released; ``thermo_lens.definitions`` §1): for residual state ``x_l`` (``l = 0..L``, the same hook
states as the gain, final norm excluded) of one prompt with real tokens ``t = 1..n-1`` (position 0,
the BOS/first token, excluded; padding excluded), the **mean pairwise cosine similarity**

    ``a_l = mean_{i != j} cos(x_l[i], x_l[j])``

over the ``m = n - 1`` remaining tokens. It is computed inside the forward hook from unit vectors
``u_t`` as ``(||sum_t u_t||^2 - m) / (m (m - 1))``, in float32, without a ``pos x pos`` matrix
(:func:`thermo_lens.measures.anisotropy.anisotropy`). 1 means all tokens point the same way; about 0 means
isotropic.

A prompt needs at least 3 real tokens (2 after position 0) for a pair; shorter prompts give NaN for
that prompt (documented, not an error) and are left out of the across-prompt mean, whose ``n``
then says how many prompts it holds.

Use :func:`anisotropy_profile` in a notebook, or :func:`anisotropy_from_collected` to derive it from
the same :func:`thermo_lens.core.passes.collect` pass as the gain (``collect(..., [residual_norms,
anisotropy])``).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Unpack

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.core import measure, validate
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.inputs import Prompts
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.stats.paired import PairedMixin
from thermo_lens.core.passes import Collected, Recorder
from thermo_lens.core.passes.cached import documents_cache
from thermo_lens.core.products import PerLayer, token_norms
from thermo_lens.core.provenance import Provenance, ProvenanceFields
from thermo_lens.core.registry import (BuildContext, Measurement, Metric, Options, Readout, option, register_measurement,
                                  register_metric)
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.core.tokens import TokenBatch, to_device
from thermo_lens.core.result import Result
from thermo_lens.stats import SummaryStats, summarize
from thermo_lens.core.validate import validates_own_inputs

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["AnisotropyResult", "anisotropy_profile", "anisotropy_from_collected", "DEFINITION"]

DEFINITION = (
    "mean pairwise cosine similarity of the token states x_l[t], t = 1..n-1 (position 0 and padding "
    "excluded), per residual state x_0..x_L (final norm excluded); NaN for prompts with < 3 tokens"
)

register_metric(Metric(
    "anisotropy", symbol="a_l", formula=DEFINITION, shape="prompt state", result="AnisotropyResult",
    section="gain", paper="D'Elia (2026), appendix C", unit="cosine similarity", attr="values",
    row="anisotropy_last", row_reduce=lambda v: float(np.nanmean(v[:, -1].double().numpy()))))


def _tokens(rec: Recorder, device: torch.device, batch: TokenBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What every state's anisotropy shares in a batch (made once per batch on ``device``, built on the
    host from the lengths: a few ops, no device read): the excluded positions ``[batch, pos, 1]``
    (position 0 and padding), the tokens left ``m`` ``[batch]`` float32, ``m (m - 1)`` (rounded once to
    float32, as the product of the two float32 factors is), and ``m < 2``."""
    width = int(batch.tokens.shape[1])
    left = [max(min(int(n), width) - 1, 0) for n in batch.host_lengths]
    excluded = torch.tensor([[[p == 0 or p > m] for p in range(width)] for m in left])
    stats = torch.tensor([left, [m * (m - 1) for m in left]], dtype=torch.float32)
    excluded, stats = (t if t.device == torch.device(device) else to_device(t, device) for t in (excluded, stats))
    m, denom = stats.unbind(0)
    return excluded, m, denom, m < 2


def anisotropy(view: ModelView, rec: Recorder) -> None:
    """Per prompt and residual state, the mean pairwise cosine similarity of token states.

    Position 0 (the BOS / first token, whose norm and direction dominate) and padding are
    excluded. With unit vectors ``u_t`` over the ``m`` remaining tokens,
    ``mean_{i != j} u_i . u_j = (||sum_t u_t||^2 - m) / (m (m - 1))``: O(pos * d_model) per
    prompt, no ``pos x pos`` matrix. Records ``("anisotropy", l)``: ``[batch]`` float32, NaN when
    fewer than two tokens remain.
    """
    def finish(states: list[int], stacks: list[Tensor]) -> None:
        _, m, denom, few = rec.per_batch(("anisotropy", str(stacks[0].device)),
                                         functools.partial(_tokens, rec, stacks[0].device))
        val = (stacks[0].pow(2).sum(-1) - m) / denom  # [state, batch]
        rec.put_rows([("anisotropy", l) for l in states], val.masked_fill_(few, float("nan")))

    per_layer = PerLayer(rec, "anisotropy", finish)
    for l, name in enumerate(view.resid_hook_names):
        def fn(x: Tensor, batch: TokenBatch, _l: int = l, _name: str = name) -> None:
            excluded = rec.per_batch(("anisotropy", str(x.device)), functools.partial(_tokens, rec, x.device))[0]
            if x.dtype == torch.float64:  # reduced in float32, as the definition says
                xf = x.float()
                norms = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
            else:  # the norms the gain takes too (float32); a half-precision x is promoted by the division
                xf, norms = x, token_norms(rec, _name, x)
            u = xf / norms.clamp_min(1e-30)
            # Zero the excluded rows in place (one temporary, not two); the sum over positions
            # runs in position order, so a prompt's value does not depend on its batch's padding.
            # The rest (||sum_t u_t||^2 - m) / (m (m - 1)) is taken for every state at once.
            per_layer.add(_l, u.masked_fill_(excluded, 0.0).sum(dim=1))  # [batch, d_model]
        rec.add(name, ("anisotropy", l), fn)
    per_layer.close()


@dataclass(frozen=True, repr=False, eq=False)
class AnisotropyResult(PairedMixin, ProvenanceFields, Result):
    """Anisotropy per prompt and residual state, and its across-prompt summary.

    Attributes:
        values: ``Float[Tensor, "prompt state"]`` float32, ``a_l`` for ``x_0..x_L`` (``L + 1``
            states); NaN for a prompt with fewer than 3 real tokens.
        stats: per state across prompts (NaN prompts omitted): ``mean``, ``sd`` (ddof=1),
            ``se``, CI, ``n`` as arrays of length ``L + 1``.
        provenance: :class:`~thermo_lens.core.provenance.Provenance`: prompts, lengths (BOS
            included), truncation, BOS mode, the model's metadata (compute dtype, raw or
            processed weights, post-LN flag) and the user hooks of the run; its fields are also
            attributes (``.prompts``, ``.lengths``, ``.dtype``, ``.hooks`` ...).
        definition: the definition above.
    """

    values: Float[Tensor, "prompt state"]
    stats: SummaryStats
    provenance: Provenance
    definition: str = DEFINITION

    schema_version: ClassVar[int] = 2
    renamed_fields: ClassVar[dict[int, dict[str, str]]] = {2: {"lengths": "n_tokens", "summary": "stats"}}

    @classmethod
    def from_collected(cls, collected: Any, *, level: float | int = 0.95) -> "AnisotropyResult":
        """The result of a :func:`thermo_lens.core.passes.collect` pass that ran :func:`anisotropy`
        (pure: no forward pass)."""
        return _anisotropy_from_collected(collected, level=level)

    @property
    def mean(self) -> Float[Tensor, " state"]:
        """Across-prompt mean per residual state ``x_0..x_L`` (NaN prompts omitted)."""
        return torch.as_tensor(np.asarray(self.stats.mean), dtype=torch.float32)

    @property
    def n_layers(self) -> int:
        """``L``: the blocks, one fewer than the residual states ``x_0..x_L`` (``n_states``)."""
        return int(self.values.shape[1]) - 1

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame, one row per (prompt, state): ``prompt, state`` (0..L, ``x_state``),
        ``hook``, ``anisotropy``, ``n_tokens`` and the definition columns."""
        P, S = self.values.shape
        # x_l is read where block l reads it (ModelView.resid_hook_names), x_L at the last block's output
        hooks = [f"blocks.{l}.hook_resid_pre" for l in range(S - 1)] + [f"blocks.{S - 2}.hook_resid_post"]
        df = pd.DataFrame({
            "prompt": np.repeat(np.arange(P), S),
            "state": np.tile(np.arange(S), P),
            "hook": hooks * P,
            "anisotropy": self.values.numpy().astype(np.float64).reshape(-1),
            "n_tokens": np.repeat(self.n_tokens.numpy(), S),
        })
        for k, v in self.provenance.columns().items():
            df[k] = v
        return df

    def summary_frame(self) -> pd.DataFrame:
        """One row per state: ``state, mean, sd (ddof=1), se, ci_low, ci_high, n``."""
        s = self.stats
        return pd.DataFrame({"state": np.arange(self.n_layers + 1), "mean": s.mean, "sd": s.sd,
                             "se": s.se, "ci_low": s.ci_low, "ci_high": s.ci_high, "n": s.n})

    def __repr__(self) -> str:
        m = np.asarray(self.stats.mean)
        shown = " ".join(f"{v:.3g}" for v in m[:13]) + (" ..." if m.size > 13 else "")
        nan_prompts = int(torch.isnan(self.values).any(dim=1).sum())
        lines = [
            f"AnisotropyResult({self.model.get('name')}: L={self.n_layers}, {self.n_prompts} prompt(s), "
            f"prepend_bos={self.prepend_bos!r}, {self.dtype}, {self.weights} weights"
            f"{', post-LN' if self.post_ln else ''})",
            f"  definition: {self.definition}",
            f"  mean a_l, l=0..{self.n_layers}: {shown}",
            f"  hooks: {self.provenance.hooks_text}",
        ]
        if nan_prompts:
            lines.append(f"  note: {nan_prompts} prompt(s) too short (< 3 tokens) are NaN and left out")
        return "\n".join(lines)


def _anisotropy_from_collected(collected: Any, *, level: float | int = 0.95) -> AnisotropyResult:
    """The :class:`AnisotropyResult` of a :func:`~thermo_lens.core.passes.collect` pass that included the
    :func:`~thermo_lens.measures.anisotropy.anisotropy` reduction. Pure: no forward pass."""
    if not isinstance(collected, Collected):
        raise ThermoLensInputError(
            f"anisotropy_from_collected expects a thermo_lens.core.passes.Collected, got "
            f"{type(collected).__name__}; use anisotropy_profile(model, prompts) to run the model"
        )
    try:
        vals = collected.stack("anisotropy")  # [L+1, prompt]
    except KeyError:
        raise ThermoLensInputError(
            "this Collected has no anisotropy: run collect(model, prompts, [anisotropy, ...])"
        ) from None
    values = vals.T.contiguous().float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        summary = summarize(values, level=level, nan_policy="omit")
    return AnisotropyResult(
        values=values,
        stats=summary,
        provenance=collected.provenance(),
    )


#: The same as :meth:`AnisotropyResult.from_collected` (deprecated name, kept for one release; silent:
#: callers that treat every warning as an error keep working).
anisotropy_from_collected = AnisotropyResult.from_collected


@dataclass(frozen=True)
class AnisotropyOptions(Options):
    """The options of the anisotropy profile (checked when made)."""

    level: float = option(0.95, "confidence level of the CIs", lambda v: validate.confidence_level("level", v))


@register_measurement
class Anisotropy(Measurement[AnisotropyOptions]):
    """The anisotropy of every residual state (:class:`AnisotropyResult`)."""

    name = "anisotropy"
    title = "Anisotropy profile"
    summary = "how aligned the token states of each residual state are (mean pairwise cosine, position 0 excluded)"
    result = AnisotropyResult
    section = "gain"
    Options = AnisotropyOptions
    readouts = (Readout("anisotropy:<state>", "the anisotropy of residual state x_<state> (0: the embedding, s: "
                        "the output of block s - 1): the mean pairwise cosine similarity of the prompt's token states, "
                        "position 0 excluded (NaN under 3 tokens)", scope="real tokens t = 1..n-1 (position 0 "
                        "excluded): pairs of token states"),)

    def reductions(self) -> list[Any]:
        return [anisotropy]

    def build(self, ctx: BuildContext) -> AnisotropyResult:
        return AnisotropyResult.from_collected(ctx.collected, level=self.options.level)


@documents_cache
@validates_own_inputs
def anisotropy_profile(
    model: TransformerLensModel | ModelView,
    prompts: Prompts,
    *,
    level: float = 0.95,
    settings: RunSettings | None = None,
    cache: Any = None,
    **run: Unpack[RunOptions],
) -> AnisotropyResult:
    """Anisotropy of every residual state ``x_0..x_L`` of ``model`` on ``prompts`` (one pass).

    Prompts shorter than 3 tokens give NaN (see the module docstring); if every prompt is that
    short the result is all NaN and a warning says so.

    Args:
        model, prompts: as for :func:`thermo_lens.residual_gain`.
        level: confidence level of the CIs (default ``0.95``).
        settings, **run: run options (:class:`thermo_lens.RunSettings`: ``prepend_bos``,
            ``batch_size``, ``truncate``, ``fwd_hooks``, ``progress``, ``sort_by_length``).
        cache: <CACHE_DOC>
    """
    res = measure.run(as_view(model), prompts, {"anisotropy": {"level": level}}, settings=settings, cache=cache,
                      **run).anisotropy
    if torch.isnan(res.values).all():
        warnings.warn("every prompt has fewer than 3 tokens: anisotropy (which excludes position 0 "
                      "and needs a pair of tokens) is NaN throughout", stacklevel=2)
    return res
