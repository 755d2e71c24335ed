"""Residual gain: how much each block amplifies or dampens the residual stream.

Definitions (D'Elia 2026, "Thermodynamic Constraints in Transformer Architectures", section 3;
``thermo_lens.definitions`` §1, which says what thermo-lens computes where the two differ):

* residual states ``x_0 = blocks.0.hook_resid_pre`` and ``x_l = blocks.{l-1}.hook_resid_post``
  (``l = 1..L``), read from the hooks, so the final norm is never part of any ``x_l`` (this removes
  the paper's "final LayerNorm artifact" at the root). ``x_l`` is read where block ``l`` reads it
  (``blocks.{l}.hook_resid_pre``, the same tensor without hooks), so an SAE or a hook that
  replaces the stream between blocks ``l-1`` and ``l`` counts in block ``l-1``'s gain, block
  ``l``'s gain is measured against what it read, and ``prod_l G_l = ||x_L|| / ||x_0||`` holds
  under any hooks and SAEs (``last`` / ``frobenius``; :attr:`thermo_lens.ModelView.resid_hook_names`);
* per-token norms ``||x_l[t]||`` (L2 over ``d_model``), always in float32 whatever the model dtype;
* **layer convention** (every thermo-lens frame, tensor and figure): ``layer`` is the 0-based
  block index of ``blocks.{layer}``; the gain of block ``layer`` is
  ``||resid_post_layer|| / ||resid_pre_layer||`` (``blocks.{layer}.hook_resid_post`` over
  ``blocks.{layer}.hook_resid_pre``, the input as the block read it). The paper's 1-based
  ``G_l = ||x_l|| / ||x_{l-1}||`` (``l = 1..L``) is block ``layer = l - 1``: ``G_1`` is block 0
  and ``G_L`` (paper metric B) is block ``L - 1``. Below, ``G_l`` keeps the paper's numbering;
* block gain ``G_l = ||x_l|| / ||x_{l-1}||`` for ``l = 1..L``, reduced over tokens by an explicit
  **token scope** (:data:`TOKEN_SCOPES`):

  ``last``
      the last real token of each prompt (padding-aware; the paper's main choice):
      ``G_l = ||x_l[t_last]|| / ||x_{l-1}[t_last]||``.
  ``all_but_first`` (default)
      the **mean of per-token ratios** over the real tokens ``t = 1..n-1`` (position 0, the
      BOS/first token whose norm is huge, excluded): ``G_l = mean_t ||x_l[t]|| / ||x_{l-1}[t]||``.
      Not the ratio of mean norms. Needs at least 2 tokens per prompt: a 1-token prompt raises
      :class:`~thermo_lens.core.model.ThermoLensInputError` (pass ``prepend_bos=True`` or another scope).
  ``all``
      the mean of per-token ratios over every real token ``t = 0..n-1``.
  ``frobenius``
      the ratio of whole-sequence Frobenius norms over the real tokens (the paper's third
      variant): ``G_l = ||X_l||_F / ||X_{l-1}||_F`` with ``X_l = x_l[0..n-1]`` ``[n, d_model]``.

  The same reduction turns any pair of states ``(x_a, x_b)`` into a per-prompt ratio
  ``g(a -> b)``; ``G_l = g(l-1 -> l)``.

* model-level summaries (:data:`SUMMARIES`), each per prompt then across prompts:

  ``last_block_gain``      ``G_L``, the true last block (paper "metric B": the abstract's
                           0.80 / 1.11 / 1.48 / 2.31 hierarchy);
  ``penultimate_gain``     ``G_{L-1}`` (paper "NO_FINAL_LN" metric A, its Fig. 1-2 and Kleiber r);
                           NaN for a 1-layer model;
  ``first_block_gain``     ``G_1`` (the paper's ``emb_to_block0_gain``);
  ``total_amplification``  ``g(0 -> L)``: ``||x_L|| / ||x_0||`` in the same token scope (for the
                           mean scopes, the mean over tokens of the per-token ratio);
  ``geometric_mean_gain``  ``total_amplification ** (1 / L)``: the per-layer amplification, so that
                           ``G_total = G ** L``;
  ``max_block_gain``       ``max_l G_l``.

  For ``last`` and ``frobenius`` ``total_amplification == prod_l G_l`` exactly (the ratios
  telescope); for the mean scopes it does not (a mean of products is not a product of means).

* across prompts: mean, SD with ``ddof=1``, SE and the 95% Student-t CI
  (:class:`thermo_lens.stats.SummaryStats`);
* regime: ``"expander"`` if the CI of the deciding summary lies above 1, ``"dampener"`` if below,
  ``"neutral"`` if it contains 1, ``"undetermined"`` with fewer than 2 prompts (no CI). The
  deciding summary is ``regime_by`` (default ``"last_block_gain"``, the paper's headline metric
  B, so regimes are comparable with the paper's; ``"geometric_mean_gain"`` is the whole-network
  alternative). Never from a lab name.
* post-LN models (BERT, OPT-350m): every ``x_l`` is a LayerNorm output, so ``||x_l||`` and the
  gain are set by that norm's weights (``||x_l[t]|| <= sqrt(d_model) * max|gamma_l| + ||beta_l||``);
  results carry ``post_ln=True`` and a note.

The paper's own definitions are reachable by name: :data:`PAPER_METRICS` and :func:`paper_metric`.

Use :func:`residual_gain` in a notebook; :func:`gain_from_collected` derives the same result from
an existing one-pass :func:`thermo_lens.core.passes.collect` (what ``profile()`` does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Unpack, overload

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from thermo_lens.core import measure, registry, validate
from thermo_lens.core.errors import ThermoLensInputError, ThermoLensNumericsError
from thermo_lens.core.inputs import Prompts
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.stats.paired import PairedMixin
from thermo_lens.core.passes import Collected, Recorder
from thermo_lens.core.passes.cached import documents_cache
from thermo_lens.core.products import PerLayer, token_norms
from thermo_lens.core.provenance import Provenance, ProvenanceFields
from thermo_lens.core.registry import BuildContext, Metric, metrics, option, register_measurement, register_metric
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.core.tokens import TOKEN_SCOPES, TokenBatch, TokenScope, check_token_scope
from thermo_lens.core.result import Result
from thermo_lens.stats import SummaryStats, regime_from_ci, summarize
from thermo_lens.core.validate import validates_own_inputs

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = [
    "SUMMARIES",
    "GainResult",
    "residual_gain",
    "gain_from_collected",
    "scope_ratio",
    "regime_from_summary",
    "residual_norms",
]


register_metric(Metric(
    "block_gain", symbol="G_l", formula="G_l = ||x_l|| / ||x_{l-1}||, l = 1..L, per prompt, reduced over tokens by "
    "the token scope (norms L2 over d_model, float32; final norm excluded)", shape="prompt layer",
    result="GainResult", section="gain", paper="D'Elia (2026), sec. 3", unit="ratio"))
for _name, _symbol, _formula, _paper in (
    ("last_block_gain", "G_L", "G_L = g(x_{L-1} -> x_L), the true last block (layer L-1, 0-based), final norm excluded (paper metric B)",
     "D'Elia (2026), abstract and sec. 3 (metric B)"),
    ("penultimate_gain", "G_{L-1}", "G_{L-1} = g(x_{L-2} -> x_{L-1}), block layer L-2 (0-based) (paper NO_FINAL_LN metric A); NaN if L = 1",
     "D'Elia (2026), sec. 3, Fig. 1-2 (metric A)"),
    ("first_block_gain", "G_1", "G_1 = g(x_0 -> x_1), block layer 0 (paper emb_to_block0_gain)", ""),
    ("geometric_mean_gain", "G_geo", "total_amplification ** (1/L): per-layer amplification (G_total = G**L)", ""),
    ("total_amplification", "G_total", "g(x_0 -> x_L) = ||x_L|| / ||x_0|| in the same token scope", ""),
    ("max_block_gain", "max G_l", "max over l = 1..L of G_l", ""),
):
    register_metric(Metric(_name, symbol=_symbol, formula=_formula, shape="prompt", result="GainResult",
                           section="gain", paper=_paper, unit="ratio", frame="prompt_frame", row=_name,
                           attr=f"summaries.{_name}.values",
                           summary_table=_name in ("last_block_gain", "penultimate_gain", "geometric_mean_gain")))

#: Model-level summary name -> definition (``g(a -> b)`` is the token-scope ratio of two states);
#: from the metric registry.
SUMMARIES: dict[str, str] = {m.name: m.formula for m in metrics(result="GainResult", shape="prompt", load=False)}

DEFAULT_SCOPE: TokenScope = "all_but_first"
DEFAULT_REGIME_BY = "last_block_gain"

_POST_LN_NOTE = (
    "post-LN model: every x_l is a LayerNorm output, so ||x_l|| (and the gain) is set by that "
    "norm's weights, ||x_l[t]|| <= sqrt(d_model) * max|gamma_l| + ||beta_l||; compare regimes "
    "with pre-LN models with care"
)


class _Summary:
    """``g.<name>`` for ``g.summaries["<name>"]``: a :class:`GainResult`'s named summary across prompts
    (:class:`~thermo_lens.stats.SummaryStats`), documented by its definition in :data:`SUMMARIES`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.__doc__ = f"{SUMMARIES[name]}; across prompts."

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Summary: ...
    @overload
    def __get__(self, obj: GainResult, owner: type | None = None) -> SummaryStats: ...

    def __get__(self, obj: GainResult | None, owner: type | None = None) -> SummaryStats | _Summary:
        return self if obj is None else obj.summaries[self.name]


# ---------------------------------------------------------------------------- in-pass reduction
def residual_norms(view: ModelView, rec: Recorder) -> None:
    """Per-token L2 norms of every residual state ``x_0 .. x_L``, in float32.

    Records ``("resid_norm", l)`` for ``l = 0..L``: ``[batch, pos]`` with NaN on padding, and
    counts the finite norms on the device (:meth:`Recorder.expect_finite`: a real token's NaN/inf
    norm fails the pass when it ends). ``x_l`` is read where
    block ``l`` reads it (:attr:`~thermo_lens.core.model.ModelView.resid_hook_names`).

    Each hook takes its state's norms (shared with the other reductions there,
    :func:`thermo_lens.core.products.token_norms`); the padding is masked, the finite norms counted and
    the norms recorded for every state at once, at the last state's hook (:class:`PerLayer`).
    """
    names = view.resid_hook_names

    def finish(states: list[int], stacks: list[Tensor]) -> None:
        norms = stacks[0].squeeze(-1).masked_fill_(rec.pad_mask(stacks[0].device), float("nan"))  # [state, batch, pos]
        # a real token's norm is NaN/inf: checked after the pass
        rec.expect_finite_rows([names[l] for l in states], norms, rec.n_real())
        rec.put_rows([("resid_norm", l) for l in states], norms)

    per_layer = PerLayer(rec, "resid_norm", finish)
    for l, name in enumerate(names):
        def fn(x: Tensor, batch: TokenBatch, _l: int = l, _name: str = name) -> None:
            per_layer.add(_l, token_norms(rec, _name, x))
        rec.add(name, ("resid_norm", l), fn)
    per_layer.close()
    # x_l (l < L) is read at blocks.{l}.hook_resid_pre (ModelView.resid_hook_names), after any user
    # hook or SAE there: block l's gain is measured against what it read, and a replacement between
    # two blocks lands in the earlier block's gain, so the block gains telescope.


# ---------------------------------------------------------------------------- checks
def _check_scope(token_scope: object) -> str:
    return check_token_scope(token_scope)


def _check_regime_by(regime_by: Any) -> str:
    if regime_by not in SUMMARIES:
        raise ThermoLensInputError(
            f"unknown regime_by {regime_by!r}; choose one of {', '.join(map(repr, SUMMARIES))}"
        )
    return regime_by


# ---------------------------------------------------------------------------- the algebra
def scope_ratio(
    norm_a: Float[Tensor, "*state prompt pos"],
    norm_b: Float[Tensor, "*state prompt pos"],
    lengths: Int[Tensor, " prompt"],
    token_scope: str,
) -> Float[Tensor, "*state prompt"]:
    """Token-scope ratio ``g(a -> b)`` of two residual states from their per-token norms.

    ``norm_a``/``norm_b`` are per-token L2 norms (padding may hold anything: it is masked by
    ``lengths``); leading dimensions (e.g. layers) broadcast. Computed in float64, returned in
    float64. See :data:`TOKEN_SCOPES` for the definitions.
    """
    _check_scope(token_scope)
    a, b = norm_a.double(), norm_b.double()
    width = a.shape[-1]
    lengths = lengths.to(a.device)
    if token_scope == "last":
        idx = (lengths - 1).clamp_min(0).expand(*a.shape[:-1]).unsqueeze(-1)
        return b.gather(-1, idx).squeeze(-1) / a.gather(-1, idx).squeeze(-1)
    mask = torch.arange(width, device=a.device)[None, :] < lengths[:, None]
    if token_scope == "frobenius":
        fa = torch.where(mask, a * a, 0.0).sum(-1).sqrt()
        fb = torch.where(mask, b * b, 0.0).sum(-1).sqrt()
        return fb / fa
    if token_scope == "all_but_first":
        mask = mask.clone()
        mask[:, 0] = False
    r = torch.where(mask, b / a, 0.0)
    return r.sum(-1) / mask.sum(-1)


class _ScopeReducer:
    """Every scope-reduced quantity of a pass's residual norms, batch by batch, with the few ops the
    batches share made once per pass: per batch, the block gains ``g(l -> l+1)`` and the total
    amplification ``g(0 -> L)`` as one ratio of the states' rows, and the scope-reduced norm of every
    state (:attr:`GainResult.norms`, ``norms_in``). The numbers of :func:`scope_ratio` element by
    element (the same float64 operations on the same norms, in the same order)."""

    def __init__(self, token_scope: str, L: int, width: int, has_in: bool) -> None:
        self.scope, self.L, self.has_in = token_scope, L, has_in
        # rows of the states [x_0 .. x_L (, the blocks' inputs)]: the numerators x_1..x_L, x_L and the
        # denominators (x_0..x_{L-1} or the blocks' inputs), x_0 of the block gains and the total
        first_in = L + 1 if has_in else 0
        self.num = torch.tensor([*range(1, L + 1), L])
        self.den = torch.tensor([*range(first_in, first_in + L), 0])
        # position p is in the scope iff pos[p] < the prompt's length (position 0 never, all_but_first)
        pos = torch.arange(width)
        if token_scope == "all_but_first":
            pos[0] = torch.iinfo(pos.dtype).max
        self.pos = pos[None, :]
        self.zero = torch.zeros((), dtype=torch.float64)

    def __call__(self, norms: Tensor, norms_in: Tensor | None, lengths: Tensor) -> Tensor:
        """``[prompt, 2L + 1 (+ L)]`` float64 from one batch's ``[L+1, prompt, pos]`` norms (and the blocks'
        ``[L, prompt, pos]`` input norms): the block gains ``[:, :L]``, the total amplification
        ``[:, L]``, the state norms ``[:, L+1 : 2L+2]`` (and the input norms after them)."""
        n = norms.double() if norms_in is None else torch.cat([norms, norms_in]).double()
        if self.scope == "last":
            idx = (lengths - 1).clamp_min(0).expand(*n.shape[:-1]).unsqueeze(-1)
            state = n.gather(-1, idx).squeeze(-1)  # [state, prompt]
            ratio = state.index_select(0, self.num) / state.index_select(0, self.den)
        else:
            mask = self.pos[:, :n.shape[-1]] < lengths[:, None]  # [prompt, pos]
            if self.scope == "frobenius":
                state = torch.where(mask, n * n, self.zero).sum(-1).sqrt()
                ratio = state.index_select(0, self.num) / state.index_select(0, self.den)
            else:  # the mean of the per-token ratios; the mean per-token norm
                count = mask.sum(-1)
                ratio = torch.where(mask, n.index_select(0, self.num) / n.index_select(0, self.den), self.zero)
                ratio = ratio.sum(-1) / count
                state = torch.where(mask, n, self.zero).sum(-1) / count
        return torch.cat([ratio, state]).T


def _joined(parts: list[tuple[Tensor, Tensor]], in_parts: list[tuple[Tensor | None, Tensor]],
            group: Iterable[int]) -> tuple[Tensor, Tensor | None, Tensor]:
    """The batches ``group`` of one width, joined along the prompt dimension: norms, input norms, lengths."""
    group = list(group)
    if len(group) == 1:
        (n, ln), (ni, _) = parts[group[0]], in_parts[group[0]]
        return n, ni, ln
    ni_parts = [in_parts[i][0] for i in group]
    return (torch.cat([parts[i][0] for i in group], dim=1),
            None if ni_parts[0] is None else torch.cat([t for t in ni_parts if t is not None], dim=1),
            torch.cat([parts[i][1] for i in group]))


def regime_from_summary(summary: SummaryStats, null: float = 1.0) -> str:
    """``"expander"`` (CI above ``null``), ``"dampener"`` (below), ``"neutral"`` (contains it),
    ``"undetermined"`` (no CI: fewer than 2 prompts, or NaN values). ``thermo_lens.definitions`` §1."""
    return regime_from_ci(float(summary.ci_low), float(summary.ci_high), null)


def _prompt_index(prompts: Any, n: int) -> Tensor:
    """Indices into ``n`` prompts from an int, a list of ints (negative from the end) or a mask."""
    t = torch.as_tensor([prompts] if isinstance(prompts, int) else list(prompts))
    if t.dtype == torch.bool:
        if t.numel() != n:
            raise ThermoLensInputError(f"a prompt mask needs {n} entries, got {t.numel()}")
        return t.nonzero().flatten()
    bad = [int(i) for i in t if not -n <= int(i) < n]
    if bad or t.numel() == 0:
        raise ThermoLensInputError(f"prompt index(es) {bad or '[]'} out of range for {n} prompts")
    return t.long() % n


# ---------------------------------------------------------------------------- the result
@dataclass(frozen=True, repr=False, eq=False)
class GainResult(PairedMixin, ProvenanceFields, Result):
    """Residual gain per prompt and block, its named model summaries and the regime.

    Attributes:
        block_gain: ``Float[Tensor, "prompt layer"]`` float32; column ``layer`` (0-based block
            index, as in ``blocks.{layer}``) is the gain of block ``layer``,
            ``||resid_post_layer|| / ||resid_pre_layer||`` = ``G_{layer+1}`` in the paper's
            1-based notation (``G_L`` is column ``L - 1``), in ``token_scope``.
        norms: ``Float[Tensor, "prompt state"]`` float32, the scope-reduced norms of
            ``x_0..x_L`` (``L + 1`` states): the last token's norm (``last``), the mean per-token
            norm over the scope's tokens (``all_but_first``/``all``; the gain is the mean of
            per-token ratios, *not* the ratio of these), or the Frobenius norm (``frobenius``).
        token_scope: name of the token scope (definition in :attr:`scope_definition`).
        summaries: summary name -> :class:`~thermo_lens.stats.SummaryStats` across prompts (its
            ``.values`` are the per-prompt values); also as attributes (``.last_block_gain``).
        regime: ``"expander"``, ``"dampener"``, ``"neutral"`` or ``"undetermined"``.
        regime_by: the summary whose CI decided the regime.
        provenance: :class:`~thermo_lens.core.provenance.Provenance`: the prompts, their real token
            counts (BOS included; ``.lengths``) and truncation, the BOS mode, the model's
            metadata (``.model``: compute dtype, raw/processed ``weights``, ``post_ln``: gain
            bounded by the LayerNorm weights, see ``notes``) and the user hooks of the run
            (``.hooks``: ablations, patches). Also readable as attributes (``.prompts``,
            ``.lengths``, ``.prepend_bos``, ``.dtype``, ``.weights``, ``.post_ln``, ``.model``,
            ``.hooks``).
        norms_in: ``Float[Tensor, "prompt layer"]`` the scope-reduced norm of each block's input
            as the block read it (``blocks.{layer}.hook_resid_pre``; equals ``norms[:, layer]``
            unless a user hook changed the activation there, e.g. a patch).
        per_token_gain: ``Float[Tensor, "prompt layer pos"]`` per-token ``G_l`` (position 0
            included, NaN on padding) when asked for with ``per_token=True``, else None.
        level: confidence level of the CIs.
    """

    block_gain: Float[Tensor, "prompt layer"]
    norms: Float[Tensor, "prompt state"]
    token_scope: str
    summaries: dict[str, SummaryStats]
    regime: str
    regime_by: str
    provenance: Provenance
    per_token_gain: Tensor | None = None
    level: float = 0.95
    norms_in: Tensor | None = None

    schema_version: ClassVar[int] = 2
    renamed_fields: ClassVar[dict[int, dict[str, str]]] = {2: {"lengths": "n_tokens"}}

    @classmethod
    def from_collected(cls, collected: object, token_scope: str = DEFAULT_SCOPE, *, per_token: bool = False,
                       regime_by: str = DEFAULT_REGIME_BY, level: float | int = 0.95) -> "GainResult":
        """The result of a :func:`thermo_lens.core.passes.collect` pass that ran :func:`residual_norms`
        (pure: no forward pass; options as for :func:`residual_gain`)."""
        return _gain_from_collected(collected, token_scope, per_token=per_token, regime_by=regime_by, level=level)

    def _stored_problem(self) -> str | None:
        """Sizes that must agree in a stored gain result (see :meth:`Result._stored_problem`)."""
        n, layers = self.block_gain.shape
        if tuple(self.norms.shape) != (n, layers + 1):
            return f"norms has shape {list(self.norms.shape)}, block_gain {[n, layers]} (expected {[n, layers + 1]})"
        if len(self.provenance.prompts) != n or tuple(self.provenance.lengths.shape) != (n,):
            return f"{len(self.provenance.prompts)} prompts recorded for {n} rows of block_gain"
        if self.norms_in is not None and tuple(self.norms_in.shape) != (n, layers):
            return f"norms_in has shape {list(self.norms_in.shape)}, not {[n, layers]}"
        if self.per_token_gain is not None and tuple(self.per_token_gain.shape[:2]) != (n, layers):
            return f"per_token_gain has shape {list(self.per_token_gain.shape)}, not [{n}, {layers}, pos]"
        if not (isinstance(self.level, float) and 0 < self.level < 1):
            return f"level {self.level!r} is not in (0, 1)"
        if self.regime_by not in self.summaries:
            return f"regime_by {self.regime_by[:60]!r} is not one of its summaries"
        return None

    # ------------------------------------------------------------ named summaries (their definitions: SUMMARIES)
    last_block_gain = _Summary()
    penultimate_gain = _Summary()
    first_block_gain = _Summary()
    geometric_mean_gain = _Summary()
    total_amplification = _Summary()
    max_block_gain = _Summary()

    # ------------------------------------------------------------ derived views
    @property
    def scope_definition(self) -> str:
        return TOKEN_SCOPES[self.token_scope]

    @property
    def layer_summary(self) -> SummaryStats:
        """Per-layer ``G_l`` across prompts (arrays of length L: mean, sd ddof=1, se, CI)."""
        return summarize(self.block_gain, level=self.level)

    @property
    def notes(self) -> list[str]:
        """Caveats that apply to these numbers."""
        out = []
        if self.post_ln:
            out.append(_POST_LN_NOTE)
        if self.weights != "raw":
            out.append("weights are processed (LayerNorm folded / writing weights centered): residual "
                       "norms differ from the raw model the paper measured")
        if any(self.truncated):
            out.append(f"{sum(self.truncated)} prompt(s) truncated to the context length")
        if self.n_prompts < 2:
            out.append("one prompt: no SD/SE/CI, regime undetermined")
        if self.provenance.intervened:
            n_sae = sum(h.attached == "sae" for h in self.hooks)
            n_hooks = len(self.hooks) - n_sae
            what = " and ".join(w for w in (f"{n_hooks} hook(s)" if n_hooks else "",
                                             f"{n_sae} SAE(s)" if n_sae else "") if w)
            out.append(f"measured under {what} (an intervened run, not the clean model)")
        if self.provenance.origin == "ActivationCache":
            matched = f"; {self.provenance.cache_match}" if self.provenance.cache_match else ""
            out.append(f"measured from an ActivationCache (no forward pass{matched}); the hooks active when it was "
                       "made are not recorded")
        if self.provenance.padding:
            out.append(self.provenance.padding)
        return out

    def select(self, prompts: Any = None, **dims: object) -> Result:
        """The result restricted to ``prompts`` (indices into the prompt list, negative from the
        end; or a boolean mask), summaries, CIs and regime recomputed on them: a
        :class:`GainResult`. With named dimensions (``layer=slice(0, 4)``, ``prompt=[0, 2]``) the
        generic :meth:`Result.select` (a :class:`~thermo_lens.core.result.Selection`)."""
        if dims or prompts is None:
            return Result.select(self, **({"prompt": prompts} if prompts is not None else {}), **dims)
        idx = _prompt_index(prompts, self.n_prompts)
        summaries = {k: summarize(np.asarray(s.values, dtype=np.float64)[idx.numpy()], level=self.level)
                     for k, s in self.summaries.items()}
        pick = lambda t: None if t is None else t[idx].clone()  # noqa: E731
        return GainResult(block_gain=self.block_gain[idx].clone(), norms=self.norms[idx].clone(),
                          token_scope=self.token_scope, summaries=summaries,
                          regime=regime_from_summary(summaries[self.regime_by]), regime_by=self.regime_by,
                          provenance=self.provenance.select(idx), per_token_gain=pick(self.per_token_gain),
                          level=self.level, norms_in=pick(self.norms_in))

    def layers(self, layers: Any) -> Float[Tensor, "prompt layer"]:
        """``block_gain`` columns of ``layers`` (0-based block indices, negative from the end)."""
        L = self.n_layers
        ls = [layers] if isinstance(layers, int) else list(layers)
        bad = [l for l in ls if not -L <= int(l) < L]
        if bad:
            raise ThermoLensInputError(f"layer(s) {bad} out of range: blocks 0..{L - 1} (negative from the end)")
        return self.block_gain[:, [int(l) % L for l in ls]]

    def per_prompt(self, name: str) -> Float[Tensor, " prompt"]:
        """Per-prompt values of summary ``name`` (float32)."""
        if name not in self.summaries:
            raise KeyError(f"unknown summary {name!r}; available: {', '.join(self.summaries)}")
        return torch.as_tensor(self.summaries[name].values, dtype=torch.float32)

    # ------------------------------------------------------------ frames
    def _common(self) -> dict[str, Any]:
        return {"token_scope": self.token_scope, **self.provenance.columns()}

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame, one row per (prompt, layer).

        Columns: ``prompt, layer, block_gain, norm_in, norm_out, n_tokens, text`` plus the
        definition columns (``token_scope, model, prepend_bos, dtype, weights, post_ln, hooks``).

        * ``layer``: 0-based block index (``blocks.{layer}``), the same ``layer`` as every other
          thermo-lens frame (spectral, sheaf, attribution), so frames merge on ``layer``
          (and ``head``). Block ``layer`` maps ``resid_pre`` to ``resid_post``; the paper's
          ``G_l`` (1-based) is ``layer = l - 1``.
        * ``norm_in`` / ``norm_out``: the scope-reduced norms of the block's input
          ``blocks.{layer}.hook_resid_pre`` and output ``blocks.{layer}.hook_resid_post``.
        * ``block_gain``: for ``last`` and ``frobenius`` it equals ``norm_out / norm_in``; for
          ``all_but_first`` / ``all`` it is the **mean of per-token ratios**
          ``mean_t ||x_out[t]|| / ||x_in[t]||``, while ``norm_in`` / ``norm_out`` are mean
          per-token norms, so ``norm_out / norm_in`` is the ratio of means and differs.
        """
        P, L = self.block_gain.shape
        g = self.block_gain.numpy().astype(np.float64)
        nrm = self.norms.numpy().astype(np.float64)
        nin = (self.norms_in.numpy().astype(np.float64) if self.norms_in is not None else nrm[:, :-1])
        df = pd.DataFrame({
            "prompt": np.repeat(np.arange(P), L),
            "layer": np.tile(np.arange(L), P),
            "block_gain": g.reshape(-1),
            "norm_in": nin.reshape(-1),
            "norm_out": nrm[:, 1:].reshape(-1),
            "n_tokens": np.repeat(self.n_tokens.numpy(), L),
            "text": np.repeat(np.array(self.prompts, dtype=object), L),
        })
        for k, v in self._common().items():
            df[k] = v
        return df

    def prompt_frame(self) -> pd.DataFrame:
        """One row per prompt: ``prompt, text, n_tokens, truncated`` and every summary's value."""
        df = pd.DataFrame({"prompt": np.arange(self.n_prompts), "text": list(self.prompts),
                           "n_tokens": self.n_tokens.numpy(), "truncated": list(self.truncated)})
        for name, s in self.summaries.items():
            df[name] = np.asarray(s.values, dtype=np.float64)
        for k, v in self._common().items():
            df[k] = v
        return df

    def summary_frame(self) -> pd.DataFrame:
        """One row per named summary: ``summary, mean, sd (ddof=1), se, ci_low, ci_high, n, level,
        decides_regime, definition`` plus the definition columns."""
        rows = []
        for name, s in self.summaries.items():
            rows.append({"summary": name, **{k: v for k, v in s.to_dict().items()},
                         "decides_regime": name == self.regime_by, "definition": SUMMARIES[name]})
        df = pd.DataFrame(rows)
        for k, v in self._common().items():
            df[k] = v
        return df

    # ------------------------------------------------------------ printing
    def __repr__(self) -> str:
        m = self.model
        head = (f"GainResult({m.get('name')}: L={self.n_layers}, {m.get('norm_placement', '?')}-LN, "
                f"{self.provenance.weights_text} weights, {self.dtype}; {self.n_prompts} prompt(s), "
                f"prepend_bos={self.prepend_bos!r})")
        lines = [head, f"  token_scope={self.token_scope!r}: {self.scope_definition}"]
        decider = self.summaries[self.regime_by]
        why = {"expander": "95% CI above 1", "dampener": "95% CI below 1",
               "neutral": "95% CI contains 1", "undetermined": "no CI"}[self.regime]
        if self.level != 0.95:
            why = why.replace("95%", f"{100 * self.level:g}%")
        lines.append(f"  regime: {self.regime} (by {self.regime_by} = {decider.mean:.4g}, {why})")
        lines.append(f"  {'summary':<21} {'mean':>9} {'SE':>9} {'SD(ddof=1)':>10}  {100 * self.level:g}% CI")
        for name, s in self.summaries.items():
            lines.append(f"  {name:<21} {s.mean:>9.4g} {s.se:>9.3g} {s.sd:>10.3g}  "
                         f"[{s.ci_low:.4g}, {s.ci_high:.4g}]")
        per_layer = np.asarray(self.layer_summary.mean)
        shown = " ".join(f"{v:.3g}" for v in per_layer[:12]) + (" ..." if per_layer.size > 12 else "")
        lines.append(f"  mean block gain by layer 0..{self.n_layers - 1}: {shown}")
        lines.append(f"  hooks: {self.provenance.hooks_text}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def summary(self) -> str:
        return repr(self)


# ---------------------------------------------------------------------------- computing
def _gain_from_collected(
    collected: object,
    token_scope: str = DEFAULT_SCOPE,
    *,
    per_token: bool = False,
    regime_by: str = DEFAULT_REGIME_BY,
    level: float | int = 0.95,
) -> GainResult:
    """The :class:`GainResult` of a pass already made by :func:`thermo_lens.core.passes.collect`.

    Pure: no forward pass. ``collected`` must include the :func:`~thermo_lens.measures.gain.residual_norms`
    reduction. Use it to derive every token scope, and the other metrics, from one pass.

    Raises:
        ThermoLensInputError: unknown ``token_scope``/``regime_by``; ``token_scope="all_but_first"``
            with a prompt of fewer than 2 tokens (nothing left after position 0); or
            ``collected`` without residual norms.
        ThermoLensNumericsError: the scope's ratio is undefined because a denominator state has
            zero norm on a token in scope (e.g. a zero BOS embedding with ``token_scope="all"``).
    """
    _check_scope(token_scope)
    _check_regime_by(regime_by)
    level = validate.confidence_level("level", level)
    if not isinstance(collected, Collected):
        raise ThermoLensInputError(
            f"gain_from_collected expects a thermo_lens.core.passes.Collected, got {type(collected).__name__}; "
            "use residual_gain(model, prompts) to run the model"
        )
    try:
        # Batch by batch ([L+1, batch, pos_b] float32, NaN on padding): nothing is padded to the
        # longest prompt of the whole run, so memory follows the real token counts.
        parts = list(collected.batches("resid_norm"))
    except KeyError:
        raise ThermoLensInputError(
            "this Collected has no residual norms: run collect(model, prompts, [residual_norms, ...])"
        ) from None
    view: ModelView = collected.view
    lengths = collected.lengths.to(torch.long)
    if token_scope == "all_but_first" and bool((lengths < 2).any()):
        bad = [i for i, n in enumerate(lengths.tolist()) if n < 2]
        raise ThermoLensInputError(
            f"token_scope='all_but_first' excludes position 0, but prompt(s) {bad} have only 1 token "
            f"(prepend_bos={collected.prepend_bos!r}); use prepend_bos=True or token_scope='last', "
            "'all' or 'frobenius'"
        )
    L = parts[0][0].shape[0] - 1
    # Block l reads blocks.{l}.hook_resid_pre: the same tensor as x_l unless a user hook changed it
    # there (a patch); the block's gain is measured against what it actually read.
    has_in = "block_in_norm" in collected.recorder.names
    in_parts: list[tuple[Tensor | None, Tensor]] = (list(collected.batches("block_in_norm")) if has_in
                                                    else [(None, ln) for _, ln in parts])
    reduce = _ScopeReducer(token_scope, L, max(n.shape[-1] for n, _ in parts), has_in)
    # [prompt, 2L + 1 (+ L)]: block gains, total, state norms (, input norms), in the caller's order. The
    # batches of one width are reduced together (nothing padded beyond its own batch's width), each
    # prompt's row by the same element-wise float64 ops as alone.
    widths: dict[int, list[int]] = {}
    for i, (n, _) in enumerate(parts):
        widths.setdefault(int(n.shape[-1]), []).append(i)
    if len(widths) == 1:
        every = reduce(*_joined(parts, in_parts, range(len(parts))))
    else:
        starts = np.cumsum([0] + [int(n.shape[1]) for n, _ in parts])
        pieces = [(torch.as_tensor(np.concatenate([np.arange(starts[i], starts[i + 1]) for i in group])),
                   reduce(*_joined(parts, in_parts, group))) for group in widths.values()]
        every = torch.empty(int(starts[-1]), pieces[0][1].shape[1], dtype=torch.float64)
        for rows, got in pieces:
            every.index_copy_(0, rows, got)
    every = collected.in_caller_order(every)
    block, total = every[:, :L].contiguous(), every[:, L]
    state_norms = every[:, L + 1:2 * L + 2]
    in_norms = every[:, 2 * L + 2:] if has_in else state_norms[:, :L]
    if not (bool(torch.isfinite(block).all()) and bool(torch.isfinite(total).all())):
        _check_finite(block, total, collected.stack("resid_norm"), lengths, token_scope, view)

    block32 = block.float()
    total32 = total.float()
    nan = torch.full_like(block32[:, 0], float("nan"))
    per_prompt = {
        "last_block_gain": block32[:, L - 1],
        "penultimate_gain": block32[:, L - 2] if L >= 2 else nan,
        "first_block_gain": block32[:, 0],
        "geometric_mean_gain": total.pow(1.0 / L).float(),
        "total_amplification": total32,
        "max_block_gain": block32.max(dim=1).values,
    }
    summaries = {k: summarize(v, level=level) for k, v in per_prompt.items()}
    per_tok = None
    if per_token:  # asked for: [prompt, layer, pos], padded to the longest prompt
        norms = collected.stack("resid_norm")
        norms_in = collected.stack("block_in_norm") if has_in else norms[:-1]
        per_tok = (norms[1:] / norms_in).permute(1, 0, 2).contiguous().float()
    return GainResult(
        block_gain=block32,
        norms=state_norms.float(),
        token_scope=token_scope,
        summaries=summaries,
        regime=regime_from_summary(summaries[regime_by]),
        regime_by=regime_by,
        provenance=collected.provenance(),
        per_token_gain=per_tok,
        level=level,
        norms_in=in_norms.float(),
    )


#: The same as :meth:`GainResult.from_collected` (deprecated name, kept for one release; silent:
#: callers that treat every warning as an error keep working).
gain_from_collected = GainResult.from_collected


def _check_finite(block: Tensor, total: Tensor, norms: Tensor, lengths: Tensor, token_scope: str,
                  view: ModelView) -> None:
    """A scope ratio is undefined when a state in its denominator has zero norm: say where."""
    if bool(torch.isfinite(block).all()) and bool(torch.isfinite(total).all()):
        return
    bad = ~torch.isfinite(torch.cat([block, total[:, None]], dim=1))
    p, col = (int(i) for i in bad.nonzero()[0])
    state = col if col < block.shape[1] else 0  # denominator state x_{l-1} (or x_0 for the total)
    zero = (norms[state, p, : int(lengths[p])] == 0).nonzero().flatten().tolist()
    raise ThermoLensNumericsError(
        f"{view.name}: the {token_scope!r} gain of prompt {p} is undefined: x_{state} "
        f"({view.resid_hook_names[state]}) has zero norm at position(s) {zero[:8]} (e.g. a token "
        "whose embedding is zero, such as a padding token used as BOS). Use a token scope that "
        "excludes those positions (token_scope='all_but_first' excludes position 0; 'frobenius' "
        "pools all tokens) or another BOS."
    )


@dataclass(frozen=True)
class GainOptions(registry.Options):
    """The options of the gain (checked when made)."""

    token_scope: TokenScope = option(DEFAULT_SCOPE, "the tokens the per-token ratios are reduced over", _check_scope)
    per_token: bool = option(False, "also keep [prompt, layer, pos] gains", lambda v: validate.boolean("per_token", v))
    regime_by: str = option(DEFAULT_REGIME_BY, "the summary whose CI decides the regime", _check_regime_by)
    level: float = option(0.95, "confidence level of the CIs", lambda v: validate.confidence_level("level", v))


@dataclass(frozen=True)
class GainReadout(registry.Readout):
    """A gain per prompt, in the run's token scope: a block's (``<layer>``; ``last_block_gain`` the
    last block's) or the total amplification. Reads every residual norm up to the block's output."""

    def parse(self, text: str, n_layers: int, n_heads: int | None = None) -> registry.Probe:
        probe = super().parse(text, n_layers, n_heads)
        return replace(probe, layer=n_layers - 1) if self.name == "last_block_gain" else probe

    def keep(self, probe: registry.Probe, key: tuple[str, int]) -> bool:
        return True  # the norms of every state (gain_from_collected builds the whole result)

    def values(self, collected: Any, probe: registry.Probe, m: registry.Measurement,
               row_name: Callable[[int], str]) -> Tensor:
        token_scope = m.options.token_scope
        try:
            g = GainResult.from_collected(collected, token_scope)
        except ThermoLensNumericsError:  # a denominator state with zero norm in some row: NaN there
            return _gain_with_nan(collected, probe.layer, token_scope)
        if probe.layer is None:
            return torch.as_tensor(g.summaries["total_amplification"].values).double()
        return g.block_gain[:, probe.layer].double()


def _gain_with_nan(got: Collected, layer: int | None, token_scope: str) -> Tensor:
    """The gain readout of every row as :func:`gain_from_collected` computes it (float32 values),
    NaN where it is undefined: a condition that zeroes the residual at a token in scope
    (zero-ablating ``hook_resid_pre`` there) leaves a ratio with a zero denominator. A sweep names
    those cells instead of failing the whole run."""
    parts = list(got.batches("resid_norm"))
    has_in = "block_in_norm" in got.recorder.names
    in_parts = list(got.batches("block_in_norm")) if has_in else [(n[:-1], ln) for n, ln in parts]
    if layer is None:
        L = parts[0][0].shape[0] - 1
        out = got.in_caller_order(torch.cat([scope_ratio(n[0], n[L], ln, token_scope) for n, ln in parts]))
    else:
        out = got.in_caller_order(torch.cat([scope_ratio(ni[layer], n[layer + 1], ln, token_scope)
                                             for (n, ln), (ni, _) in zip(parts, in_parts)]))
    out = out.float().double()
    return torch.where(torch.isfinite(out), out, torch.full_like(out, float("nan")))


@register_measurement
class Gain(registry.Measurement[GainOptions]):
    """The residual gain per block (:class:`GainResult`)."""

    name = "gain"
    title = "Residual gain per block"
    summary = ("how much each block amplifies (> 1) or dampens (< 1) the residual stream, per prompt, with the "
               "named model summaries (G_L, G_{L-1}, total amplification ...) and the regime")
    result = GainResult
    section = "gain"
    Options = GainOptions
    readouts = (
        GainReadout("total_amplification", "the total amplification ||x_L|| / ||x_0|| of residual_gain, in the "
                    "run's token_scope", carried="resid_norm"),
        GainReadout("last_block_gain", "the last block's gain ||x_L|| / ||x_{L-1}|| of residual_gain, in the run's "
                    "token_scope", reads_next_state=True, carried="resid_norm"),
        GainReadout("block_gain:<layer>", "block <layer>'s gain ||x_{layer+1}|| / ||x_layer|| of residual_gain "
                    "(block_gain[:, layer]), in the run's token_scope", reads_next_state=True, carried="resid_norm"),
    )

    def reductions(self) -> list[Any]:
        return [residual_norms]

    def build(self, ctx: BuildContext) -> GainResult:
        o = self.options
        return GainResult.from_collected(ctx.collected, o.token_scope, per_token=o.per_token, regime_by=o.regime_by,
                                   level=o.level)


@documents_cache
@validates_own_inputs
def residual_gain(
    model: TransformerLensModel | ModelView,
    prompts: Prompts,
    *,
    token_scope: TokenScope = DEFAULT_SCOPE,
    per_token: bool = False,
    regime_by: str = DEFAULT_REGIME_BY,
    level: float = 0.95,
    settings: RunSettings | None = None,
    cache: Any = None,
    **run: Unpack[RunOptions],
) -> GainResult:
    """Residual gain of ``model`` on ``prompts``: one forward pass per batch, norms reduced in-hook.

    Args:
        model: a TransformerLens ``TransformerBridge``, ``HookedTransformer`` or
            ``HookedSAETransformer`` (or a :class:`~thermo_lens.core.model.ModelView`).
        prompts: a string, a list of strings, a built-in prompt set name (``"paper25"``),
            ``{category: [...]}``, a PromptSet, or token ids (:data:`thermo_lens.core.inputs.Prompts`).
        token_scope: ``"all_but_first"`` (the default), ``"last"``, ``"all"`` or ``"frobenius"``
            (:data:`thermo_lens.core.tokens.TOKEN_SCOPES`).
        per_token: also keep ``per_token_gain`` ``[prompt, layer, pos]`` (default ``False``).
        regime_by: the summary whose CI decides the regime (default ``"last_block_gain"``;
            :data:`SUMMARIES`).
        level: confidence level of the CIs (default ``0.95``).
        settings, **run: run options (:class:`thermo_lens.core.settings.RunOptions`): ``prepend_bos``
            (default ``"host"``: as ``model.to_tokens``; recorded), ``batch_size``, ``truncate``,
            ``fwd_hooks`` (your own ``(hook_name, fn)`` hooks: ablation, patching; batches then
            keep your prompt order, each hook can read ``hook.ctx["batch"]``, and the hooks are
            recorded in the result), ``progress``, ``sort_by_length``.
        cache: <CACHE_DOC>

    Returns:
        :class:`GainResult`.

    Raises:
        ThermoLensInputError: empty prompt list, empty or non-string prompt, a prompt longer than
            the context (with ``truncate=False``), unknown ``token_scope``/``regime_by``/option,
            or a 1-token prompt with ``token_scope="all_but_first"``.
        thermo_lens.core.errors.ThermoLensNumericsError: NaN/inf in a residual state (names the layer).
        thermo_lens.core.errors.ThermoLensHookError: one of your hooks failed (names it).

    Example::

        g = residual_gain(model, ["The capital of France is", "Water boils at"])
        g.last_block_gain.mean, g.regime, g.to_frame()
    """
    view = as_view(model)
    options = dict(token_scope=token_scope, per_token=per_token, regime_by=regime_by, level=level)
    Gain.make_options(options)  # bad options fail before the warning and the pass
    view.warn_if_processed("residual norms, hence gains, differ from the raw model's", stacklevel=2)
    return measure.run(view, prompts, {"gain": options}, settings=settings, cache=cache, **run).gain
