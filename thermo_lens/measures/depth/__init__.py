"""L*: the depth of maximal sheaf-trace change, empirical and predicted.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures", section 5.3 (eq. 6) and
appendix E; ``thermo_lens.definitions`` §4.

The layer trace ``T_l`` is the sheaf Laplacian trace of layer ``l`` summed over heads and averaged
over prompts (:attr:`thermo_lens.measures.sheaf.SheafTraces.mean_layer_trace`). Layers are indexed by the
**0-based block index**: ``T_l`` is the trace of ``blocks.{l}.attn`` (``l = 0 .. L-1``), the
index the paper's notebooks got from ``np.argmax`` (its calibration values, e.g. GPT-2 ``L* = 9``).

Empirical rules, by name (the registry :data:`thermo_lens.measures.depth.rules.L_STAR_RULES` is the one
source of these texts; the definitions page shows the same, generated):

``"steepest_step"`` (the default; thermo-lens's, not the paper's)
    with d_k = T_{k+1} - T_k (k = 0 .. L-2), L* = k + 1 for the k with the largest |d_k|: the
    deeper layer of the steepest step between adjacent layers; every d_k is a difference of two
    layers, so each has the same variance under layer noise and no layer gets a noisier difference
    than another (L* is 1 .. L-1; under a random walk every step is equally likely); ties go to
    the shallowest step; NaN with a note when T is flat (no step above 1e-12 max |T_l|).
    On ``T = [0, 3, 3, 3, 8, 8]`` it gives 4 (the step 3 -> 4); the paper's rule gives 0.
``"argmax_abs_gradient"`` (the paper's rule: D'Elia (2026), appendix E; reported beside the default)
    L* = argmax_l |dT/dl| with dT/dl = np.gradient(T): central differences
    (T_{l+1} - T_{l-1}) / 2 inside, one-sided differences at the first and last layer; ties go to
    the shallowest layer; a flat T gives 0 (with a note). The one-sided differences
    have 2 (random walk) to 4 (independent layer noise) times the variance of the central ones,
    so L* lands on the first or last layer more often than chance (a random walk of 12 layers:
    0.39 against 2/12).
``"notebook_v3_first_peak"`` (one released notebook's rule, not the paper's text; formerly
``"paper_v3_sign_change"``)
    with d_i = T_{i+1} - T_i, the first i with d_i > 0 and d_{i+1} < 0 (a strict scan: a plateau
    d = 0 is not a turn), L* = i + 1, the first local peak; valleys are skipped; when there is
    none, the peak L* = argmax_l T_l. On ``T = [1, 2, 2, 3, 5, 4]`` it gives 4 (the vectorised
    ``np.diff(np.sign(np.diff(T))) < 0`` fired on the plateau and gave 1).
``"first_turning_point"`` (thermo-lens's own; formerly ``"first_sign_change"``)
    with d_k = T_{k+1} - T_k, the smallest k in 1 .. L-2 whose d_k has the opposite sign of the
    last nonzero d_j, j < k: the first layer where T turns, a peak or a valley; NaN when T is
    monotone. On ``T = [5, 3, 2, 4, 6, 5]`` it gives 2 (the valley) where
    ``"notebook_v3_first_peak"`` gives 4 (the peak).

Aggregation over prompts, by name: ``"mean_trace"`` (default here: the rule on ``T_l`` averaged
over prompts) or ``"per_prompt_mean"`` (the rule on each prompt's own trace, then the mean: what
the notebook's v3 table reports). :class:`LStarResult` carries both when per-prompt traces are given.

Predicted (eq. 6, :func:`thermo_lens.measures.depth.predicted.predicted_l_star`):
``L* = L (0.11 + 0.012 L + 4.9 / H)`` (``H`` query heads per layer; the paper calibrated it on
0-based argmax values and excludes ALiBi models from its scope). It warns when the prediction
exceeds ``L``. The fit-free baseline ``L / 2`` is always reported beside it (``baselines``): on
the paper's own six validation models a paired test cannot tell the two apart
(:func:`thermo_lens.paper.lstar.l_star_predictor_test`).

Errors, by name: ``"ape"``, the absolute percentage error ``|pred - emp| / emp`` (as a fraction;
NaN when ``emp = 0``), and ``"paper"``, the paper's ``|pred - emp| / L``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypeGuard, runtime_checkable

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.core.registry import BuildContext, Measurement, Options, option, register_measurement

from thermo_lens.measures.depth.predicted import (L_STAR_BASELINES, PREDICTED_DEFINITION, LStarBeyondDepthWarning,
                                         l_star_baselines, predicted_l_star)
from thermo_lens.measures.depth.rules import (DEFAULT_L_STAR_RULE, DEPRECATED_VARIANTS, L_STAR_RULES, PAPER_L_STAR_RULE,
                                     LStarRule, rules_markdown)
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.registry import Metric, register_metric
from thermo_lens.core.result import Result

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from thermo_lens.core.registry import BuildContext

__all__ = [
    "L_STAR_RULES",
    "L_STAR_VARIANTS",
    "PAPER_L_STAR_RULE",
    "DEFAULT_L_STAR_RULE",
    "LStarRule",
    "ERROR_METRICS",
    "LStarResult",
    "predicted_l_star",
    "l_star_baselines",
    "L_STAR_BASELINES",
    "PREDICTED_DEFINITION",
    "LStarBeyondDepthWarning",
    "DEPRECATED_VARIANTS",
    "rules_markdown",
    "trace_derivative",
    "empirical_l_star",
    "l_star_note",
    "l_star_error",
    "l_star_from_traces",
]

LStarVariant = Literal["steepest_step", "argmax_abs_gradient", "notebook_v3_first_peak", "first_turning_point"]
ErrorMetric = Literal["ape", "paper"]

#: Rule name -> its definition (the registry's text; kept for the report's glossary and old code).
L_STAR_VARIANTS: dict[str, str] = {name: r.definition for name, r in L_STAR_RULES.items()}
ERROR_METRICS: dict[str, str] = {
    "ape": "|pred - emp| / emp (absolute percentage error, as a fraction)",
    "paper": "|pred - emp| / L (the paper's error)",
}
LAYER_INDEXING = "0-based block index: layer l is blocks.{l} (l = 0 .. L-1)"

register_metric(Metric(
    "l_star", symbol="L*", formula="empirical L*: the layer of maximal change of the layer trace T_l (sum over "
    "heads, mean over prompts) under the named rule (default steepest_step: the deeper layer of the largest |T_{k+1} - T_k|, "
    "differences of equal variance at every layer; the paper's appendix E rule argmax_l |dT/dl| with np.gradient "
    "beside it); 0-based block index", shape="", result="LStarResult", section="l_star",
    paper="D'Elia (2026), appendix E", unit="layer", column="empirical_l_star", attr="empirical", row="l_star",
    summary_table=True))
register_metric(Metric(
    "l_star_predicted", symbol="L*_pred", formula=PREDICTED_DEFINITION, shape="", result="LStarResult",
    section="l_star", paper="D'Elia (2026), eq. 6", unit="layer", column="predicted_l_star", attr="predicted",
    row="l_star_predicted", summary_table=True))


def _check_variant(variant: object) -> str:
    if isinstance(variant, str) and variant in DEPRECATED_VARIANTS:
        new = DEPRECATED_VARIANTS[variant]
        why = ("it accepts valleys as well as peaks" if variant == "first_sign_change" else
               "it is one released notebook's rule, not the paper's (appendix E defines argmax_abs_gradient), "
               "and it is now a strict scan that a plateau does not trip")
        warnings.warn(f"L* variant {variant!r} is deprecated: {why}; it was renamed {new!r}. The paper's own "
                      f"rule is {PAPER_L_STAR_RULE!r}", DeprecationWarning, stacklevel=3)
        return new
    if variant not in L_STAR_RULES:
        raise ThermoLensInputError(
            f"unknown L* variant {variant!r}; choose one of {sorted(L_STAR_RULES)} "
            f"({PAPER_L_STAR_RULE!r} is the paper's)"
        )
    return str(variant)


def _positive_int(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < 1:
        raise ThermoLensInputError(f"{what} must be a positive integer, got {v!r}")
    return int(v)


def _as_trace(layer_trace: Tensor | ArrayLike, minimum: int) -> np.ndarray:
    t = layer_trace.detach().cpu().double().numpy() if isinstance(layer_trace, Tensor) else np.asarray(layer_trace, dtype=np.float64)
    if t.ndim != 1:
        raise ThermoLensInputError(
            f"the layer trace must be 1-D [layer], got shape {t.shape}; for [prompt, layer] take "
            "the mean over prompts (SheafTraces.mean_layer_trace)"
        )
    if t.size < minimum:
        raise ThermoLensInputError(f"the layer trace has {t.size} layer(s); this L* variant needs at least {minimum}")
    if not np.isfinite(t).all():
        raise ThermoLensInputError(f"the layer trace has NaN/inf at layer(s) {np.flatnonzero(~np.isfinite(t)).tolist()}")
    return t


def trace_derivative(layer_trace: Tensor | ArrayLike, variant: str = DEFAULT_L_STAR_RULE) -> np.ndarray:
    """``dT/dl`` as the rule reads it: ``np.gradient(T)`` ``[L]`` or ``np.diff(T)`` ``[L-1]``."""
    rule = L_STAR_RULES[_check_variant(variant)]
    t = _as_trace(layer_trace, 2)
    return np.gradient(t) if rule.derivative == "gradient" else np.diff(t)


def _apply(t: np.ndarray, variant: str) -> tuple[float, str]:
    rule = L_STAR_RULES[variant]
    return rule.apply(_as_trace(t, rule.min_layers))


def empirical_l_star(layer_trace: Tensor | ArrayLike, variant: str = DEFAULT_L_STAR_RULE) -> float:
    """Empirical L* of a layer trace ``T [layer]`` (0-based block index; NaN when undefined).

    ``variant``: a rule of :data:`L_STAR_RULES` (see the module docstring). The default
    ``"steepest_step"`` is the deeper layer of the steepest step ``|T_{k+1} - T_k|`` (NaN on a flat
    trace; :func:`l_star_note` says why); ``"argmax_abs_gradient"`` is the paper's (appendix E).
    """
    variant = _check_variant(variant)
    return _apply(_as_trace(layer_trace, 1), variant)[0]


def l_star_note(layer_trace: Tensor | ArrayLike, variant: str = DEFAULT_L_STAR_RULE) -> str:
    """Why :func:`empirical_l_star` is NaN (or conventional) on this trace under ``variant``; "" when it is not."""
    variant = _check_variant(variant)
    return _apply(_as_trace(layer_trace, 1), variant)[1]


def l_star_error(predicted: float, empirical: float, metric: str = "ape", n_layers: int | None = None) -> float:
    """Error of a predicted L* against an empirical one, by name.

    ``"ape"``: ``|pred - emp| / emp`` (NaN when ``emp == 0``: undefined); ``"paper"``:
    ``|pred - emp| / L`` (needs ``n_layers``). Fractions, not percent. NaN in, NaN out.
    """
    if metric not in ERROR_METRICS:
        raise ThermoLensInputError(f"unknown L* error metric {metric!r}; choose 'ape' or 'paper'")
    pred, emp = float(predicted), float(empirical)
    if metric == "paper":
        if n_layers is None:
            raise ThermoLensInputError("the 'paper' error |pred - emp| / L needs n_layers")
        return abs(pred - emp) / _positive_int(n_layers, "n_layers")
    return abs(pred - emp) / abs(emp) if emp != 0 else math.nan


@dataclass(frozen=True, eq=False)
class LStarResult(Result):
    """Empirical and predicted L* of one model, each number with its definition.

    Attributes:
        variant, definition: the empirical rule's name and text (:data:`L_STAR_RULES`).
        provenance: where that rule comes from (only ``argmax_abs_gradient`` is the paper's).
        layer_indexing: how layers are numbered (0-based block index).
        layer_trace: ``[layer]`` the ``T_l`` used (sum over heads, mean over prompts), float64.
        derivative: ``dT/dl`` as the variant uses it (``[layer]`` or ``[layer - 1]``).
        empirical: the empirical L* (NaN when undefined; see ``note``).
        per_prompt: ``[prompt]`` L* of each prompt's own layer trace (None without per-prompt
            traces; the paper's sign-change rows averaged these).
        predicted, predicted_definition: eq. 6 and its text.
        n_layers, n_heads: ``L`` and ``H``.
        ape: ``|pred - emp| / emp``; paper_error: ``|pred - emp| / L`` (fractions).
        note: why a value is NaN, or "".
        source: where the trace came from (trace formula, BOS mode, model metadata), or {}.
        paper_rule_empirical: L* of the same trace by the paper's rule (``argmax_abs_gradient``,
            appendix E), reported beside the result's own rule (equal to ``empirical`` when that
            rule is the paper's); ``paper_rule_note`` says when it is conventional (a flat trace).
    """

    variant: str
    definition: str
    layer_indexing: str
    layer_trace: Float[Tensor, " layer"]
    derivative: Float[Tensor, " step"]
    empirical: float
    per_prompt: Float[Tensor, " prompt"] | None
    predicted: float
    predicted_definition: str
    n_layers: int
    n_heads: int
    ape: float
    paper_error: float
    note: str
    source: dict
    per_prompt_mean: float = math.nan
    baselines: dict = field(default_factory=dict)
    warnings: tuple = ()
    provenance: str = ""
    paper_rule_empirical: float = math.nan
    paper_rule_note: str = ""

    @property
    def paper_rule(self) -> bool:
        """Whether ``variant`` is the paper's own rule (appendix E: ``argmax_abs_gradient``)."""
        return self.variant == PAPER_L_STAR_RULE

    @property
    def aggregations(self) -> dict[str, float]:
        """``{"mean_trace": empirical, "per_prompt_mean": mean of per-prompt L*}`` (the paper's v3
        table averaged per-prompt values; NaN without per-prompt traces)."""
        return {"mean_trace": self.empirical, "per_prompt_mean": self.per_prompt_mean}

    def baseline_errors(self, metric: ErrorMetric = "ape") -> dict[str, float]:
        """Error of eq. 6 and of each baseline against the empirical L*, by ``metric``."""
        out = {"eq6": self.error(metric)}
        for k, v in self.baselines.items():
            out[k] = l_star_error(v, self.empirical, metric, self.n_layers)
        return out

    def error(self, metric: str = "ape") -> float:
        """``"ape"`` or ``"paper"`` (see :func:`l_star_error`)."""
        return l_star_error(self.predicted, self.empirical, metric, self.n_layers)

    @property
    def paper_rule_l_star(self) -> float:
        """The paper's rule's L* on this trace: ``empirical`` when that is the rule used, else
        ``paper_rule_empirical`` (NaN for a result stored before it was recorded)."""
        return self.empirical if self.paper_rule else self.paper_rule_empirical

    def paper_rule_error(self, metric: str = "ape") -> float:
        """Eq. 6's error against the paper's rule's L* on the same trace (:attr:`paper_rule_l_star`)."""
        return l_star_error(self.predicted, self.paper_rule_l_star, metric, self.n_layers)

    def to_frame(self) -> pd.DataFrame:
        """One row per layer: ``T_l``, the derivative used, whether it is the empirical L*.

        ``derivative`` is the rule's ``dT/dl``: ``np.gradient`` at layer ``l``, or for a difference rule
        ``d_k = T_{k+1} - T_k`` in row ``k`` (the last row NaN). The paper's rule's L* on the same trace
        is in ``paper_rule_l_star``.
        """
        L = self.n_layers
        deriv = self.derivative.numpy()
        col = np.full(L, np.nan)
        col[: deriv.size] = deriv
        emp = self.empirical
        return pd.DataFrame({
            "layer": np.arange(L),
            "layer_trace": self.layer_trace.numpy(),
            "derivative": col,
            "is_l_star": np.arange(L) == (int(emp) if not math.isnan(emp) else -1),
            "variant": self.variant,
            "empirical_l_star": emp,
            "paper_rule": PAPER_L_STAR_RULE,
            "paper_rule_l_star": self.paper_rule_l_star,
            "predicted_l_star": self.predicted,
            "ape": self.ape,
            "paper_error": self.paper_error,
            "n_layers": L,
            "n_heads": self.n_heads,
            "model": self.source.get("model", {}).get("name") if self.source else None,
        })

    def __repr__(self) -> str:
        emp = "undefined" if math.isnan(self.empirical) else f"{self.empirical:g}"
        spread = ""
        if self.per_prompt is not None and self.per_prompt.numel():
            pp = self.per_prompt[~torch.isnan(self.per_prompt)]
            if pp.numel():
                spread = f"; per prompt mean {pp.mean().item():.3g} (n={pp.numel()})"
        note = f"\n  note: {self.note}" if self.note else ""
        if self.baselines:
            be = self.baseline_errors("ape")
            bp = self.baseline_errors("paper")
            note += "\n  baselines: " + "; ".join(
                f"{k} = {v:.4g} (APE {be[k]:.3g}, paper {bp[k]:.3g})" for k, v in self.baselines.items())
        if not self.paper_rule:
            pe = "undefined" if math.isnan(self.paper_rule_empirical) else f"{self.paper_rule_empirical:g}"
            note += (f"\n  beside it, the paper's rule ({PAPER_L_STAR_RULE}, appendix E): L* = {pe}, APE "
                     f"{self.paper_rule_error('ape'):.3g}, paper |pred-emp|/L {self.paper_rule_error('paper'):.3g}"
                     + (f" ({self.paper_rule_note})" if self.paper_rule_note else ""))
        for w in self.warnings:
            note += f"\n  warning: {w}"
        model = (self.source.get("model") or {}).get("name") if self.source else None
        return (
            f"LStarResult({model + ': ' if model else ''}empirical L* = {emp} [{self.variant}, "
            f"{'the paper' if self.paper_rule else 'not the paper'}'s rule; "
            f"{self.layer_indexing}]{spread}; predicted {self.predicted:.4g} = "
            f"L (0.11 + 0.012 L + 4.9/H) with L={self.n_layers}, H={self.n_heads}; "
            f"APE |pred-emp|/emp = {self.ape:.3g}, paper |pred-emp|/L = {self.paper_error:.3g})"
            f"{note}"
        )


@runtime_checkable
class LayerTraces(Protocol):
    """What L* reads of a :class:`thermo_lens.measures.sheaf.SheafTraces` (duck-typed: depth does not import sheaf)."""

    @property
    def mean_layer_trace(self) -> Tensor: ...
    @property
    def layer_trace(self) -> Tensor: ...
    @property
    def formula(self) -> str: ...
    @property
    def definition(self) -> str: ...
    @property
    def prepend_bos(self) -> object: ...
    @property
    def n_prompts(self) -> int: ...
    @property
    def model(self) -> object: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def n_heads(self) -> int: ...


def _is_sheaf_traces(obj: object) -> TypeGuard[LayerTraces]:
    # Duck-typed so that depth does not import sheaf (sheaf's SheafTraces.l_star imports depth).
    return all(hasattr(obj, a) for a in ("mean_layer_trace", "layer_trace", "formula", "n_heads"))


def l_star_from_traces(
    traces: LayerTraces | Tensor | ArrayLike,
    n_layers: int | None = None,
    n_heads: int | None = None,
    *,
    variant: str = DEFAULT_L_STAR_RULE,
) -> LStarResult:
    """Empirical and predicted L* from sheaf traces (``thermo_lens.definitions`` §4).

    Args:
        traces: a :class:`thermo_lens.measures.sheaf.SheafTraces` (``T_l`` = its ``mean_layer_trace``;
            ``n_layers``/``n_heads`` from it), a ``[layer]`` layer trace, or a
            ``[prompt, layer]`` array of per-prompt layer traces (``T_l`` = mean over prompts).
        n_layers: ``L`` (must match the trace's length; optional for ``SheafTraces``).
        n_heads: ``H`` for the predicted formula (optional for ``SheafTraces``).
        variant: a rule of :data:`L_STAR_RULES`: ``"steepest_step"`` (default),
            ``"argmax_abs_gradient"`` (the paper's, always computed beside the others as
            ``paper_rule_empirical``), ``"notebook_v3_first_peak"`` (one released notebook's) or
            ``"first_turning_point"``.
    """
    variant = _check_variant(variant)
    source: dict = {}
    per_prompt_traces = None
    if _is_sheaf_traces(traces):
        T = traces.mean_layer_trace
        per_prompt_traces = traces.layer_trace
        source = {"trace_formula": traces.formula, "trace_definition": traces.definition,
                  "prepend_bos": traces.prepend_bos, "n_prompts": traces.n_prompts, "model": traces.model}
        for given, have, what in ((n_layers, traces.n_layers, "n_layers"), (n_heads, traces.n_heads, "n_heads")):
            if given is not None and int(given) != have:
                raise ThermoLensInputError(f"{what}={given} disagrees with the traces, which have {have}")
        n_layers, n_heads = traces.n_layers, traces.n_heads
    else:
        arr = traces.detach().cpu().double() if isinstance(traces, Tensor) else torch.as_tensor(np.asarray(traces, dtype=np.float64))
        if arr.ndim == 2:
            per_prompt_traces, T = arr, arr.mean(dim=0)
        else:
            T = arr
        if n_heads is None:
            raise ThermoLensInputError("pass n_heads (attention heads per layer) for the predicted L*")
    t = _as_trace(T, L_STAR_RULES[variant].min_layers)
    if n_layers is None:
        n_layers = t.size
    n_layers, n_heads = _positive_int(n_layers, "n_layers"), _positive_int(n_heads, "n_heads")
    if n_layers != t.size:
        raise ThermoLensInputError(
            f"the layer trace has {t.size} entries but n_layers={n_layers}; pass one trace per block"
        )
    emp, rule_note = _apply(t, variant)
    paper_emp, paper_note = _apply(t, PAPER_L_STAR_RULE)
    pred = predicted_l_star(n_layers, n_heads, warn=False)
    warns: list[str] = []
    if pred > n_layers:  # recorded and printed with the result (tiny models trip it every time)
        warns.append(f"eq. 6 predicts L* = {pred:.4g} > L = {n_layers}: outside the network")
    notes = [rule_note] if rule_note else []
    if not math.isnan(emp) and emp == 0:
        notes.append("empirical L* = 0, so the APE |pred - emp| / emp is undefined (NaN)")
    per_prompt = None
    if per_prompt_traces is not None:
        rows = (per_prompt_traces.detach().double().cpu().numpy() if isinstance(per_prompt_traces, torch.Tensor)
                else np.asarray(per_prompt_traces, dtype=np.float64))  # one host read, not one per prompt
        per_prompt = torch.tensor([_apply(row, variant)[0] for row in rows], dtype=torch.float64)
    return LStarResult(
        variant=variant,
        definition=L_STAR_RULES[variant].definition,
        provenance=L_STAR_RULES[variant].provenance,
        layer_indexing=LAYER_INDEXING,
        layer_trace=torch.as_tensor(t),
        derivative=torch.as_tensor(trace_derivative(t, variant)),
        empirical=emp,
        per_prompt=per_prompt,
        predicted=pred,
        predicted_definition=PREDICTED_DEFINITION,
        n_layers=n_layers,
        n_heads=n_heads,
        ape=l_star_error(pred, emp, "ape"),
        paper_error=l_star_error(pred, emp, "paper", n_layers),
        note="; ".join(notes),
        source=source,
        per_prompt_mean=(float(np.nanmean(per_prompt.numpy())) if per_prompt is not None
                         and bool((~torch.isnan(per_prompt)).any()) else math.nan),
        baselines=l_star_baselines(n_layers),
        warnings=tuple(warns),
        paper_rule_empirical=paper_emp,
        paper_rule_note=paper_note,
    )


# ---------------------------------------------------------------------------- the measurement
@dataclass(frozen=True)
class LStarOptions(Options):
    """The options of L* (checked when made)."""

    variant: str = option(DEFAULT_L_STAR_RULE, "the empirical L* rule (the paper's is reported beside it)",
                          _check_variant)


@register_measurement
class LStar(Measurement[LStarOptions]):
    """L*, from the sheaf traces of the same run (:class:`LStarResult`)."""

    name = "l_star"
    title = "L*, the depth of maximal trace change"
    summary = "the block where the layer sheaf trace T_l changes most (empirical) against the paper's eq. 6"
    result = LStarResult
    section = "l_star"
    Options = LStarOptions
    needs = ("sheaf",)
    needs_pass = False

    def build(self, ctx: BuildContext) -> LStarResult:
        return l_star_from_traces(ctx.results["sheaf"], variant=self.options.variant)
