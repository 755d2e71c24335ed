"""Paired comparisons of two runs on the same prompts (e.g. ablated minus clean).

``paired_difference(b, a)`` (also ``b - a``) takes two results of the same kind, measured on the
same prompts, model and settings and differing only in their user hooks, and returns per-prompt
differences ``b - a`` with, per layer (and head), the mean difference, its Student-t CI (paired:
computed from the per-prompt differences, SD with ``ddof=1``) and a two-sided paired t-test
(``H0``: mean difference 0). The test reads as scipy's (``scipy.stats.ttest_rel``): ``statistic``,
``pvalue``, ``df``, ``confidence_interval(level)`` (computed from the stored per-prompt
differences at any level), and ``pvalue_holm`` (Holm over every element with a p-value).
The t statistic is undefined (NaN, and the frame's ``t_test`` column says why) with fewer than 2
prompts or when every difference is equal (zero variance: e.g. a layer upstream of an ablation, or
an identity hook, whose differences are exactly 0: two runs of the same prompts and settings batch
identically, so nothing but the hooks differs). Pairs on different prompts or settings are refused
with the reason; hooks already on the model that differ between the two runs (``model.add_hook``,
``model.hooks(...)``, SAEs), a different batch plan or a cache are said in ``notes`` (repr and
frame).

Quantities compared: every registered metric of the result's class with one value per prompt
(:func:`quantities`; shape ``"prompt ..."`` in :mod:`thermo_lens.core.registry`), the first by default.
E.g. :class:`~thermo_lens.measures.gain.GainResult`: ``block_gain`` ``[prompt, layer]`` (and each named
summary, ``[prompt]``); :class:`~thermo_lens.measures.sheaf.SheafTraces`: ``trace`` ``[prompt, layer, head]``;
:class:`~thermo_lens.measures.anisotropy.AnisotropyResult`: ``values`` ``[prompt, state]`` (states
``x_0..x_L``: ``state`` 0 is the embedding, state ``s`` the output of block ``s - 1``);
:class:`~thermo_lens.measures.attribution.GainAttribution`: ``head`` ``[prompt, layer, head]`` (and
``total``, ``mlp`` ... through ``quantity=``); :class:`~thermo_lens.measures.write_norm.HeadWriteNorms`:
``write_norm`` ``[prompt, layer, head]``. A measurement that registers such a metric pairs with
no code here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from torch import Tensor

from thermo_lens.core import registry
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.registry import Metric
from thermo_lens.core.provenance import Provenance
from thermo_lens.core.result import Result, cell_frame
from thermo_lens.stats import SummaryStats, holm, summarize
from thermo_lens.stats.exact import ConfidenceInterval

__all__ = ["PairedDifference", "PairedTest", "PairedResult", "paired_difference", "paired_t", "quantities"]


@runtime_checkable
class PairedResult(Protocol):
    """A result :func:`paired_difference` can pair: its provenance says which prompts, model and
    settings it ran on; its per-prompt metrics are the registry's (:func:`quantities`)."""

    provenance: Provenance

def deprecated_alias(old: str, new: str, since: str = "0.4") -> property:
    """A read-only property ``old`` that returns attribute ``new`` with a :class:`DeprecationWarning`
    (the old name of a result attribute, kept for one release)."""
    def get(self: object) -> object:
        warnings.warn(f"{type(self).__name__}.{old} is deprecated since thermo-lens {since} and will be removed in "
                      f"the next release; use .{new} (the scipy.stats name)", DeprecationWarning, stacklevel=2)
        return getattr(self, new)
    return property(get, doc=f"Deprecated alias of :attr:`{new}`.")


class PairedTest:
    """The scipy.stats vocabulary of a two-sided paired t-test per element, computed from stored
    per-prompt differences ``[prompt, *cells]`` (:meth:`paired_values`).

    Shared by :class:`PairedDifference` and :class:`~thermo_lens.experiments.sweeps.SweepResult` (whose
    per-prompt effects are paired differences): ``df`` (``n - 1``) and
    ``confidence_interval(level)`` (the Student-t interval of the mean difference at any level,
    ``scipy.stats.t.interval(level, n - 1, mean, se)``: the interval that inverts the t-test).
    ``statistic``, ``pvalue`` and ``pvalue_holm`` are each class's own (stored or derived).
    """

    if TYPE_CHECKING:
        level: float

    def paired_values(self) -> Tensor:
        """The per-prompt differences ``[prompt, *cells]`` (float64) the tests are computed from."""
        raise NotImplementedError

    def _per_cell(self, values: np.ndarray) -> np.ndarray | Tensor:
        """Per-cell values in this result's array type (numpy here; a sweep gives tensors)."""
        return values

    @property
    def df(self) -> np.ndarray | Tensor:
        """Degrees of freedom of each element's t-test, ``n - 1`` (as ``scipy.stats.ttest_rel``)."""
        d = self.paired_values()
        return self._per_cell(np.full(tuple(d.shape[1:]), float(d.shape[0] - 1)))

    def confidence_interval(self, level: float = 0.95) -> ConfidenceInterval:
        """``(low, high)`` per element: the ``level`` Student-t interval of the mean difference
        (SD with ``ddof=1``, ``n - 1`` degrees of freedom), computed from the per-prompt
        differences; NaN with fewer than 2 prompts. The interval of the paired t-test: it excludes
        0 exactly when the two-sided ``pvalue`` is below ``1 - level``."""
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < float(level) < 1:
            raise ThermoLensInputError(f"level must be a number in (0, 1), got {level!r}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            s = summarize(self.paired_values(), level=float(level), keep_values=False)
        lo, hi = (np.asarray(v, dtype=np.float64) for v in (s.ci_low, s.ci_high))
        # one interval per cell: arrays (a sweep's: tensors) in the fields a single interval holds as
        # floats (a generic NamedTuple would say so, but the test-time type checker refuses one)
        return ConfidenceInterval(self._per_cell(lo), self._per_cell(hi))  # type: ignore[arg-type]


@dataclass(frozen=True, repr=False, eq=False)
class PairedDifference(PairedTest, Result):
    """Per-prompt differences ``b - a`` of two paired runs, with paired CIs and t-tests.

    Attributes:
        quantity: the compared quantity (e.g. ``"block_gain"``) of a ``result_type``.
        dims: the dimension names after ``prompt`` (e.g. ``("layer",)``, ``("layer", "head")``).
        difference: ``[prompt, *dims]`` float64, ``b - a`` per prompt.
        a, b: the per-prompt values of each run.
        summary: mean, SD (ddof=1), SE and the ``level`` t-CI of the difference per element.
        statistic, pvalue: two-sided paired t-test per element (t and its p, as
            ``scipy.stats.ttest_rel``); NaN where it is undefined (fewer than 2 prompts, or zero
            variance: every difference equal), see :attr:`t_test`. ``t_statistic`` is the
            deprecated old name of ``statistic``.
        provenance_a, provenance_b: what each run was (prompts, settings, hooks).
        level: the confidence level of ``summary`` and of the repr and frame's ``ci_low`` /
            ``ci_high``; :meth:`confidence_interval` gives any other level.
        notes: what the comparison must say besides its numbers (hooks already on the model that
            differ between the runs, another batch plan, a cache).
    """

    quantity: str
    result_type: str
    dims: tuple[str, ...]
    difference: Tensor
    a: Tensor
    b: Tensor
    summary: SummaryStats
    statistic: np.ndarray
    pvalue: np.ndarray
    provenance_a: Provenance
    provenance_b: Provenance
    level: float = 0.95
    notes: tuple[str, ...] = ()

    # 2: ``t_statistic`` is stored as ``statistic``
    schema_version: ClassVar[int] = 2

    @classmethod
    def migrate(cls, fields: dict[str, Any], version: int) -> dict[str, Any]:
        """Results stored before schema 2 hold ``statistic`` as ``t_statistic`` (by name, not by
        version: a subclass numbers its own versions)."""
        fields = super().migrate(fields, version)
        if "t_statistic" in fields and "statistic" not in fields:
            fields["statistic"] = fields.pop("t_statistic")
        return fields

    t_statistic = deprecated_alias("t_statistic", "statistic")

    def paired_values(self) -> Tensor:
        return self.difference

    @property
    def pvalue_holm(self) -> np.ndarray:
        """Holm-adjusted ``pvalue`` over every element with a p-value (one family; NaN stays NaN)."""
        return holm(self.pvalue).reshape(np.shape(self.pvalue))

    @property
    def t_test(self) -> np.ndarray:
        """Per element, the test run (``"paired t, df = n - 1"``) or why it is undefined."""
        n = self.n_prompts
        sd = np.atleast_1d(np.asarray(self.summary.sd, dtype=np.float64))
        mean = np.atleast_1d(np.asarray(self.summary.mean, dtype=np.float64))
        out = np.empty(sd.shape, dtype=object)
        for k in range(sd.size):
            if n < 2:
                out.flat[k] = f"undefined: {n} prompt (a t-test needs 2 or more)"
            elif not sd.flat[k] > 0:
                out.flat[k] = f"undefined: zero variance (every difference is {mean.flat[k]:.4g})"
            else:
                out.flat[k] = f"paired t, df = {n - 1}"
        return out.reshape(np.shape(self.summary.sd))

    def _dim_arrays(self) -> list[tuple[tuple[str, ...], Any]]:
        return [(("prompt",) + tuple(self.dims), self.difference)]

    @property
    def mean(self) -> Tensor:
        return torch.as_tensor(np.asarray(self.summary.mean, dtype=np.float64))

    def select(self, prompts: Sequence[int] | None = None, **dims: int | Sequence[int]) -> "PairedDifference":
        """A slice: ``prompts`` (indices into the caller's prompt list) and any dimension by
        name (``layer=2``, ``layer=[0, 1]``, ``head=3``; negative indices count from the end).
        Summaries and tests are recomputed on the kept prompts."""
        unknown = set(dims) - set(self.dims)
        if unknown:
            raise ThermoLensInputError(f"unknown dimension(s) {sorted(unknown)}; this difference has {self.dims}")
        P = self.n_prompts
        if prompts is None:
            pidx = torch.arange(P)
        else:
            pidx = torch.as_tensor([_index(int(i), P, "prompt") for i in ([prompts] if isinstance(prompts, int) else prompts)])
        a, b = self.a[pidx], self.b[pidx]
        kept_dims = list(self.dims)
        for axis, name in reversed(list(enumerate(self.dims, start=1))):
            if name not in dims:
                continue
            sel = dims[name]
            n = a.shape[axis]
            if isinstance(sel, int):
                i = _index(sel, n, name)
                a, b = a.select(axis, i), b.select(axis, i)
                kept_dims.pop(axis - 1)
            else:
                idx = torch.as_tensor([_index(int(i), n, name) for i in sel])
                a, b = a.index_select(axis, idx), b.index_select(axis, idx)
        return _build(self.quantity, self.result_type, tuple(kept_dims), a, b,
                      self.provenance_a.select(pidx), self.provenance_b.select(pidx), self.level, self.notes)

    def to_frame(self) -> pd.DataFrame:
        """One row per element (``layer`` / ``head`` ...): ``mean_difference, sd, se, ci_low,
        ci_high, t, pvalue, t_test`` (the test, or why it is undefined), ``n, mean_a, mean_b``, the
        two runs' hooks and the ``notes``."""
        s = self.summary
        df = cell_frame(self.dims, [np.arange(n) for n in self.difference.shape[1:]])
        flat = lambda v: np.atleast_1d(np.asarray(v, dtype=np.float64)).ravel()  # noqa: E731
        for col, v in (("mean_difference", s.mean), ("sd", s.sd), ("se", s.se), ("ci_low", s.ci_low),
                       ("ci_high", s.ci_high), ("t", self.statistic), ("pvalue", self.pvalue),
                       ("mean_a", self.a.mean(0).numpy()), ("mean_b", self.b.mean(0).numpy())):
            df[col] = flat(v)
        df["t_test"] = np.atleast_1d(self.t_test).ravel()
        df["n"] = self.n_prompts
        df["quantity"] = self.quantity
        df["model"] = self.provenance_a.model.get("name")
        df["hooks_a"], df["hooks_b"] = self.provenance_a.hooks_text, self.provenance_b.hooks_text
        df["notes"] = "; ".join(self.notes)
        return df

    def __repr__(self) -> str:
        m = np.atleast_1d(np.asarray(self.summary.mean, dtype=np.float64))
        p = np.atleast_1d(np.asarray(self.pvalue, dtype=np.float64))
        dims = ", ".join(("prompt",) + tuple(self.dims))
        lines = [f"PairedDifference({self.result_type}.{self.quantity} [{dims}], "
                 f"b - a over {self.n_prompts} paired prompts; {100 * self.level:g}% paired t-CI, two-sided paired t-test)",
                 f"  a: {self.provenance_a.hooks_text}", f"  b: {self.provenance_b.hooks_text}"]
        if m.size <= 48:
            lo = np.atleast_1d(np.asarray(self.summary.ci_low, dtype=np.float64))
            hi = np.atleast_1d(np.asarray(self.summary.ci_high, dtype=np.float64))
            tests = np.atleast_1d(self.t_test).ravel()
            shape = tuple(self.difference.shape[1:])
            for k in range(m.size):
                at = ", ".join(f"{d} {i}" for d, i in zip(self.dims, np.unravel_index(k, shape))) if shape else "all"
                test = f"p = {p[k]:.3g}" if np.isfinite(p[k]) else f"t {tests[k]}"
                lines.append(f"  {at:<18} {m[k]:+.4g} [{lo[k]:+.4g}, {hi[k]:+.4g}]  {test}")
        else:
            undefined = int(np.sum(~np.isfinite(p)))
            lines.append(f"  {m.size} elements; largest |mean difference| {np.nanmax(np.abs(m)):.4g}; "
                         f"{int(np.sum(p < 1 - self.level))} with p < {1 - self.level:.2g} (uncorrected)"
                         + (f"; t undefined for {undefined} (fewer than 2 prompts or zero variance)" if undefined else ""))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _index(i: int, n: int, what: str) -> int:
    if not -n <= i < n:
        raise ThermoLensInputError(f"{what} index {i} out of range for {n} {what}s")
    return i % n


def paired_t(d: Tensor, level: float) -> tuple[SummaryStats, np.ndarray, np.ndarray]:
    """Summary, t statistic and two-sided p of per-prompt differences ``d`` ``[prompt, ...]``: a
    paired t-test per element, NaN where undefined (fewer than 2 prompts, or zero variance)."""
    from scipy import stats as st

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        summary = summarize(d, level=level)
        n = d.shape[0]
        mean = np.asarray(summary.mean, dtype=np.float64)
        se = np.asarray(summary.se, dtype=np.float64)
        ok = np.isfinite(se) & (se > 0) if n >= 2 else np.zeros(np.shape(mean), dtype=bool)
        t = np.where(ok, mean / np.where(ok, se, 1.0), np.nan)
        p = np.where(ok, 2 * st.t.sf(np.abs(t), df=max(n - 1, 1)), np.nan)
    return summary, np.asarray(t, dtype=np.float64), np.asarray(p, dtype=np.float64)


def _build(quantity: str, rtype: str, dims: tuple[str, ...], a: Tensor, b: Tensor, pa: Provenance, pb: Provenance,
           level: float, notes: Sequence[str] = ()) -> PairedDifference:
    d = (b - a).double()
    summary, t, p = paired_t(d, level)
    return PairedDifference(quantity=quantity, result_type=rtype, dims=dims, difference=d, a=a.double(), b=b.double(),
                            summary=summary, statistic=t, pvalue=p, provenance_a=pa, provenance_b=pb, level=level,
                            notes=tuple(notes))


def paired_difference(b: PairedResult, a: PairedResult, *, quantity: str | None = None, level: float = 0.95) -> PairedDifference:
    """``b - a`` for two runs on the same prompts (e.g. ``b`` ablated, ``a`` clean).

    Args:
        b, a: results of the same type (GainResult, SheafTraces, AnisotropyResult,
            GainAttribution) from the same model, prompts and settings.
        quantity: the compared quantity (default: the first of :func:`quantities`).
        level: confidence level of the paired CIs (default ``0.95``).

    Raises:
        ThermoLensInputError: different types, prompts, tokenization, BOS, model or token scope.
    """
    ta, tb = type(a).__name__, type(b).__name__
    if ta != tb:
        raise ThermoLensInputError(f"cannot pair a {tb} with a {ta}: compare results of the same kind")
    known = quantities(a)
    if not known:
        raise ThermoLensInputError(
            f"{ta} registers no per-prompt metric (thermo_lens.core.registry: shape 'prompt ...'), so it has no paired "
            "difference; results with one: " + ", ".join(sorted({m.result for m in registry.metrics()
                                                                 if m.dims[:1] == ("prompt",)})))
    quantity = quantity or next(iter(known))
    if quantity not in known:
        raise ThermoLensInputError(f"{ta} has no paired quantity {quantity!r}; choose one of {', '.join(known)}")
    why = a.provenance.same_run_as(b.provenance)
    for attr in ("token_scope", "formula"):
        if getattr(a, attr, None) != getattr(b, attr, None):
            why.append(f"{attr} differs ({getattr(b, attr)!r} vs {getattr(a, attr)!r})")
    if why:
        raise ThermoLensInputError(
            "these two runs are not paired: " + "; ".join(why) + ". A paired difference needs the same "
            "prompts, model and settings, differing only in fwd_hooks (e.g. ablated vs clean)")
    metric = known[quantity]
    va, vb = metric.values(a), metric.values(b)
    if not (isinstance(va, (Tensor, np.ndarray)) and isinstance(vb, (Tensor, np.ndarray))):
        raise ThermoLensInputError(f"{ta}.{quantity} is not a tensor on these results ({type(va).__name__}); "
                                   f"choose one of {', '.join(k for k in known if k != quantity)}")
    return _build(quantity, ta, metric.dims[1:], torch.as_tensor(va).detach().double(),
                  torch.as_tensor(vb).detach().double(),
                  a.provenance, b.provenance, level, a.provenance.pairing_notes(b.provenance))


def quantities(result: object) -> dict[str, Metric]:
    """The quantities a paired difference of ``result`` (a result or its class) compares: every
    registered metric of its class with one value per prompt (shape ``"prompt ..."``), by the
    attribute that holds it (``"block_gain"``, ``"head"``, ``"values"``; a summary's metric name),
    in registration order (the first is the default). The dimensions after ``prompt`` are the
    metric's."""
    cls = result if isinstance(result, type) else type(result)
    out: dict[str, Metric] = {}
    for m in registry.metrics(result=cls):
        if m.dims[:1] == ("prompt",):
            out[m.attr if m.attr and "." not in m.attr else m.name] = m
    return out


class PairedMixin:
    """``result_b - result_a`` is :func:`paired_difference` ``(result_b, result_a)``."""

    if TYPE_CHECKING:
        provenance: Provenance

    def __sub__(self, other: PairedResult) -> PairedDifference:
        return paired_difference(self, other)


