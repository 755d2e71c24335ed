"""The result of a patching or ablation sweep: per-prompt effects per cell, paired CIs, Holm.

The effect of a cell (a layer and head, a layer and position, or all three) on prompt ``p`` is
``m(p | condition) - m(p)``: the measure under the condition (the activation patched from the
clean prompt, or ablated) minus the measure of the same prompt without it. Across prompts: the
mean, its Student-t CI (SD with ``ddof=1``), a two-sided paired t-test (``H0``: mean effect 0;
NaN with fewer than 2 prompts or zero variance), and Holm-adjusted p-values over every cell of
the sweep (one family). The per-prompt effects are paired differences (the measure with the
condition minus without it), so the statistics are those of a
:class:`~thermo_lens.stats.paired.PairedDifference` (:attr:`SweepResult.paired`), in scipy.stats'
vocabulary: ``statistic``, ``pvalue``, ``df``, ``pvalue_holm``, ``confidence_interval(level)``.

For patching, the fraction of the clean-vs-corrupted difference the
cell restores, ``mean_p(effect) / mean_p(m(clean_p) - m(corrupted_p))``, with a delta-method
t-CI (a ratio of means, so prompts with a small clean-corrupted gap do not blow it up).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from thermo_lens._lazy import pandas as pd
from thermo_lens._lazy import scipy_stats
from thermo_lens.core.errors import ThermoLensWarning
from thermo_lens.stats.paired import PairedDifference, PairedTest, deprecated_alias, paired_t
from thermo_lens.core.provenance import Provenance, ProvenanceFields
from thermo_lens.core.result import Result, cell_frame

__all__ = ["SweepResult", "build_result", "fraction_restored"]


@dataclass(frozen=True, repr=False, eq=False)
class SweepResult(PairedTest, ProvenanceFields, Result):
    """Per-cell effects of a patching or ablation sweep (:func:`thermo_lens.patch_sweep`,
    :func:`thermo_lens.ablation_sweep`).

    Attributes:
        kind: ``"patch"`` or ``"ablation"``.
        method: ``"patch"`` (clean activation into the corrupted prompt), ``"zero"``, ``"mean"`` or
            ``"resample"``.
        hook: the per-layer hook point (``"attn.hook_z"``: ``blocks.{layer}.attn.hook_z``).
        over: the sweep's cell axes after ``layer``: ``("head",)``, ``("pos",)`` or ``("head", "pos")``.
        measure: the per-prompt measure (``"total_amplification"``, ``"last_block_gain"``,
            ``"block_gain:<layer>"``, ``"attribution_total:<layer>"``, ``"attribution_head:<layer>[.<head>]"``,
            ``"sheaf_trace:<layer>[.<head>]"``, or ``"logits:<function name>"``).
        layers, heads, positions: the labels of the cell axes (``positions`` as given: negative
            from each prompt's own end, non-negative from its start; empty where the axis is not swept).
        per_prompt: ``[prompt, layer, head]`` / ``[prompt, layer, pos]`` / ``[prompt, layer, head, pos]``
            float64, the effect per prompt and cell.
        baseline: ``[prompt]`` the measure without any condition (the corrupted prompts for patching).
        clean: ``[prompt]`` the measure of the clean prompts (patching; empty for ablation).
        effect, ci_low, ci_high, pvalue, pvalue_holm: per cell (``per_prompt`` without the
            prompt axis): mean effect, its ``level`` t-CI (:meth:`confidence_interval` gives any
            level), the paired t-test's p (its t: :attr:`statistic`, with :attr:`df`), Holm over the
            cells. ``pvalue_adjusted`` is the deprecated old name of ``pvalue_holm``.
        fraction, fraction_low, fraction_high: patching: the fraction of the clean-corrupted
            difference each cell restores and its delta-method t-CI (empty for ablation).
        token_scope: the measure's token scope (``"n/a"`` for a logit measure; all real tokens for a
            sheaf trace).
        patched_positions: what each condition replaces besides its cell: ``"all"`` or a position list.
        reference: where ablation values come from (mean: the reference prompts; resample: the
            source prompt of each prompt and the seed); ``""`` otherwise.
        provenance: the (corrupted) prompts, BOS mode, model and user hooks of the run.
        level: confidence level of the CIs (default ``0.95``).
        measure_definition: what the measure is (:func:`thermo_lens.experiments.sweeps.measure_definitions`).
        passes: how the passes ran: from each cell's layer (the host's start-at-layer, the unpatched
            residual there) or every one from the embedding, and why (:mod:`thermo_lens.experiments.sweeps.start`).
        alignment: how positions align across prompts of different token lengths (non-negative from
            each prompt's start, negative from its own end), and the lengths.
        head_kind: ``"head"``, or ``"kv_head"`` for a key/value hook (``attn.hook_k``, ``attn.hook_v``:
            ``heads`` are then the KV heads, ``n_kv_heads`` of them under grouped-query attention); the
            frames' column name.
        notes: where a number is NaN and why (a cell whose measure is not finite for some prompt, a
            fraction restored of a zero clean-corrupted gap); each was also warned about.
    """

    kind: str
    method: str
    hook: str
    over: tuple[str, ...]
    measure: str
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    positions: tuple[int, ...]
    per_prompt: Tensor
    baseline: Tensor
    clean: Tensor
    effect: Tensor
    ci_low: Tensor
    ci_high: Tensor
    pvalue: Tensor
    pvalue_holm: Tensor
    fraction: Tensor
    fraction_low: Tensor
    fraction_high: Tensor
    token_scope: str
    patched_positions: str
    reference: str
    provenance: Provenance
    level: float = 0.95
    measure_definition: str = ""
    passes: str = ""
    alignment: str = ""
    head_kind: str = "head"
    notes: tuple[str, ...] = ()

    # 2: ``pvalue_adjusted`` is stored as ``pvalue_holm``
    schema_version: ClassVar[int] = 2
    renamed_fields: ClassVar[dict[int, dict[str, str]]] = {2: {"pvalue_adjusted": "pvalue_holm"}}

    pvalue_adjusted = deprecated_alias("pvalue_adjusted", "pvalue_holm")

    @property
    def dims(self) -> tuple[str, ...]:
        """The cell axes' names: ``layer``, then ``head`` (``kv_head`` for a key/value hook) and/or ``pos``."""
        return _cell_dims(self.over, self.head_kind)

    def paired_values(self) -> Tensor:
        return self.per_prompt.double()

    def _per_cell(self, values: np.ndarray) -> Tensor:
        return torch.as_tensor(np.ascontiguousarray(values, dtype=np.float64))

    @cached_property
    def paired(self) -> PairedDifference:
        """The sweep as a :class:`~thermo_lens.stats.paired.PairedDifference` over its cells: ``a`` the
        measure without the condition (``baseline``, on every cell), ``b`` with it (``baseline +
        per_prompt``), ``difference`` the per-prompt effects; its tests are this sweep's. Its cells are
        positions along ``layers`` / ``heads`` / ``positions`` (its frame numbers them from 0): the
        sweep's own :meth:`to_frame` carries the labels."""
        return _paired(self.per_prompt.double(), self.baseline.double(), self.level, self.provenance, self.measure,
                       self.dims, self.notes)

    @property
    def statistic(self) -> Tensor:
        """Per cell, the paired t statistic of the effect (NaN where the test is undefined)."""
        return self._per_cell(self.paired.statistic)

    @property
    def n_tested(self) -> int:
        """The cells with a p-value: the Holm family (NaN cells are left out of it)."""
        return int(np.isfinite(self.pvalue.double().numpy()).sum())

    @property
    def holm_text(self) -> str:
        """``"Holm over the 14 cells with a p-value (2 NaN: ...)"``: the family the adjustment used."""
        n, total = self.n_tested, self.effect.numel()
        if n == total:
            return f"Holm over the {total} cells"
        return (f"Holm over the {n} cells with a p-value ({total - n} of {total} have none: NaN, from fewer than 2 "
                "prompts, zero variance or an undefined measure)")

    def _dim_arrays(self) -> list[tuple[tuple[str, ...], Any]]:
        return [(("prompt",) + self.dims, self.per_prompt)]

    def settings(self) -> dict[str, Any]:
        """The definition of every number: ``kind, method, hook, measure, token_scope, prepend_bos,
        n_prompts, level, patched_positions, reference, measure_definition, passes, alignment,
        holm_family`` (the cells Holm adjusted over) and ``notes``."""
        return {"kind": self.kind, "method": self.method, "hook": self.hook, "measure": self.measure,
                "token_scope": self.token_scope, "prepend_bos": str(self.prepend_bos),
                "n_prompts": self.n_prompts, "level": self.level, "patched_positions": self.patched_positions,
                "reference": self.reference, "measure_definition": self.measure_definition,
                "passes": self.passes, "alignment": self.alignment, "holm_family": self.n_tested,
                "notes": "; ".join(self.notes)}

    def to_frame(self) -> pd.DataFrame:
        """One row per cell: ``layer`` (and ``head`` or ``kv_head`` / ``pos``), ``effect, ci_low, ci_high, pvalue,
        pvalue_adjusted, significant`` (adjusted p below ``1 - level``), for patching ``fraction_restored,
        fraction_ci_low, fraction_ci_high``, the means ``baseline`` (and ``clean``), and the settings and
        definition columns (``measure, method, hook, token_scope, prepend_bos, n_prompts, model, hooks`` ...).
        Merges with the spectral, sheaf and attribution frames on ``layer`` / ``head``."""
        df = self._cells()
        shape = tuple(self.effect.shape)
        flat = lambda t: t.double().numpy().reshape(-1)  # noqa: E731
        for col, t in (("effect", self.effect), ("ci_low", self.ci_low), ("ci_high", self.ci_high),
                       ("pvalue", self.pvalue), ("pvalue_adjusted", self.pvalue_holm)):
            df[col] = flat(t)
        df["significant"] = df["pvalue_adjusted"] < 1 - self.level
        if self.kind == "patch":
            df["fraction_restored"] = flat(self.fraction)
            df["fraction_ci_low"], df["fraction_ci_high"] = flat(self.fraction_low), flat(self.fraction_high)
            df["clean"] = float(self.clean.double().mean())
        df["baseline"] = float(self.baseline.double().mean())
        if "feature" in self.over:  # an SAE's latents (heads holds the features): merges on (sae_hook, feature)
            df["sae_hook"] = self.hook.removesuffix(".hook_sae_acts_post")
        assert len(df) == int(np.prod(shape))
        return self._with_settings(df)

    def _with_settings(self, df: pd.DataFrame) -> pd.DataFrame:
        """``df`` with the settings and provenance columns (a column already there is kept)."""
        for k, v in self.settings().items():
            df[k] = v
        for k, v in self.provenance.columns().items():
            if k not in df:
                df[k] = v
        return df

    def _cells(self) -> pd.DataFrame:
        """The cell labels, one row per cell in ``effect``'s (C) order."""
        labels = {"layer": self.layers, self.head_kind: self.heads, "feature": self.heads, "pos": self.positions}
        return cell_frame(self.dims, [labels[d] for d in self.dims])

    def prompt_frame(self) -> pd.DataFrame:
        """One row per (prompt, cell): ``prompt`` (the index in your prompt list, as every per-prompt
        frame of the package), ``text`` (the corrupted prompt for patching), ``n_tokens``, the cell
        labels, the per-prompt ``effect``, ``baseline`` (and ``clean``) and the settings columns."""
        cells = self._cells()
        C, P = len(cells), self.n_prompts
        df = pd.DataFrame({"prompt": np.repeat(np.arange(P), C), "text": np.repeat(np.asarray(self.prompts,
                                                                                                dtype=object), C),
                           "n_tokens": np.repeat(self.provenance.lengths.numpy(), C)})
        for col in cells.columns:
            df[col] = np.tile(cells[col].to_numpy(), P)
        df["effect"] = self.per_prompt.double().numpy().reshape(P, C).reshape(-1)
        df["baseline"] = np.repeat(self.baseline.double().numpy(), C)
        if self.kind == "patch":
            df["clean"] = np.repeat(self.clean.double().numpy(), C)
        return self._with_settings(df)

    def top(self, k: int = 10) -> pd.DataFrame:
        """The ``k`` cells with the largest ``|effect|`` (rows of :meth:`to_frame`)."""
        df = self.to_frame()
        return df.reindex(df["effect"].abs().sort_values(ascending=False).index).head(k)

    def __repr__(self) -> str:
        dims = ", ".join(("prompt",) + self.dims)
        what = (f"patching {self.hook} from clean into corrupted prompts" if self.kind == "patch"
                else f"{self.method}-ablating {self.hook}")
        lines = [f"SweepResult({self.model.get('name')}: {what}, over {'/'.join(self.over)}; "
                 f"measure={self.measure!r}, token_scope={self.token_scope!r}, prepend_bos={self.prepend_bos!r}, "
                 f"{self.n_prompts} prompts, per_prompt [{dims}] {tuple(self.per_prompt.shape)})",
                 f"  effect = measure under the condition - measure without it; {100 * self.level:g}% paired t-CI, "
                 f"two-sided paired t-test, {self.holm_text}"]
        if self.measure_definition:
            lines.append(f"  measure: {self.measure_definition}")
        if self.reference:
            lines.append(f"  values from: {self.reference}")
        if self.passes:
            lines.append(f"  passes: {self.passes}")
        if self.alignment:
            lines.append(f"  positions: {self.alignment}")
        lines.append(f"  baseline mean {float(self.baseline.double().mean()):.4g}"
                     + (f"; clean mean {float(self.clean.double().mean()):.4g}" if self.kind == "patch" else ""))
        p = self.pvalue_holm.numpy()
        n_sig = int(np.sum(p < 1 - self.level))
        lines.append(f"  {n_sig} of {self.n_tested} tested cells with Holm-adjusted p < {1 - self.level:.2g}; "
                     "largest |effect|:")
        for _, row in self.top(5).iterrows():
            at = ", ".join(f"{d} {int(row[d])}" for d in self.dims)
            frac = f", restores {row['fraction_restored']:+.3g}" if self.kind == "patch" else ""
            lines.append(f"    {at:<22} {row['effect']:+.4g} [{row['ci_low']:+.4g}, {row['ci_high']:+.4g}] "
                         f"p_adj={row['pvalue_adjusted']:.3g}{frac}")
        lines.append(f"  hooks: {self.provenance.hooks_text}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


#: A mean clean-corrupted gap at most this fraction of the measures' mean magnitude is no gap
#: (float32 rounding is ~1e-7 relative; the measures come from passes of different batch shapes).
_GAP_RTOL = 1e-6


def fraction_restored(effect: Tensor, gap: Tensor, level: float) -> tuple[Tensor, Tensor, Tensor]:
    """``mean(effect) / mean(gap)`` per cell (``effect`` ``[prompt, *cells]``, ``gap`` ``[prompt]``) and
    its delta-method t-CI: ``Var(R) ~ (Var(E) - 2 R Cov(E, D) + R^2 Var(D)) / (n mean(D)^2)``."""
    e = effect.double()
    d = gap.double().reshape((-1,) + (1,) * (e.ndim - 1))
    n = e.shape[0]
    me, md = e.mean(0), d.mean(0)
    # a zero mean gap (clean and corrupted measure the same on average, e.g. a pair set and its swap)
    # leaves no fraction to restore: NaN, not +-inf (the sweep notes it)
    r = torch.where(md != 0, me / torch.where(md != 0, md, 1.0), float("nan"))
    if n < 2:
        nan = torch.full_like(r, float("nan"))
        return r, nan, nan
    ve = e.var(0, unbiased=True)
    vd = d.var(0, unbiased=True)
    cov = ((e - me) * (d - md)).sum(0) / (n - 1)
    se = torch.sqrt(torch.clamp(ve - 2 * r * cov + r * r * vd, min=0.0) / n) / md.abs()
    q = float(scipy_stats.t.ppf(0.5 + level / 2, df=n - 1))
    return r, r - q * se, r + q * se


def _cell_dims(over: tuple[str, ...], head_kind: str) -> tuple[str, ...]:
    return ("layer",) + tuple(head_kind if d == "head" else d for d in over)


def _paired(d: Tensor, baseline: Tensor, level: float, provenance: Provenance, measure: str,
            dims: tuple[str, ...], notes: tuple[str, ...]) -> PairedDifference:
    """The paired difference of a sweep: per-prompt effects ``d`` ``[prompt, *cells]`` against the
    measure without any condition, ``baseline`` ``[prompt]``."""
    a = baseline.reshape((-1,) + (1,) * (d.ndim - 1)).expand_as(d)  # a view: the same value on every cell
    summary, t, p = paired_t(d, level)
    return PairedDifference(quantity=measure, result_type="SweepResult", dims=dims, difference=d, a=a, b=a + d,
                            summary=summary, statistic=t, pvalue=p, provenance_a=provenance, provenance_b=provenance,
                            level=level, notes=notes)


def build_result(*, per_prompt: Tensor, baseline: Tensor, clean: Tensor | None, level: float,
                 **fields: Any) -> SweepResult:
    """Summaries, tests and Holm over the cells of ``per_prompt`` ``[prompt, *cells]``: those of
    its :class:`~thermo_lens.stats.paired.PairedDifference` (:func:`_paired`)."""
    d = per_prompt.double()
    cells = tuple(d.shape[1:])
    test = _paired(d, baseline.double(), level, fields["provenance"], str(fields.get("measure", "")),
                   _cell_dims(tuple(fields.get("over", ())), str(fields.get("head_kind", "head"))), ())
    summary, p, adj = test.summary, test.pvalue, test.pvalue_holm

    def t(v: object) -> Tensor:
        return torch.as_tensor(np.broadcast_to(np.asarray(v, dtype=np.float64), cells).copy())
    empty = torch.zeros(0, dtype=torch.float64)
    notes = list(fields.pop("notes", ()))
    if clean is not None:
        gap = clean.double() - baseline.double()
        frac, lo, hi = fraction_restored(d, gap, level)
        # A mean gap within float32 rounding of the measures (e.g. pairs and their swaps, whose gaps
        # cancel) is no difference to restore: its ratio would be +-inf or noise, so NaN and a note.
        scale = float(torch.cat([clean.double(), baseline.double()]).abs().mean())
        if bool(torch.isfinite(gap).all()) and abs(float(gap.mean())) <= _GAP_RTOL * scale:
            frac, lo, hi = (torch.full_like(frac, float("nan")) for _ in range(3))
            note = (f"the clean and corrupted prompts' mean {fields.get('measure')} are equal (mean gap "
                    f"{float(gap.mean()):.2g}, within float32 rounding of the measure's scale {scale:.3g}; e.g. pairs "
                    "and their swaps): there is no difference to restore, so every cell's fraction restored is NaN")
            notes.append(note)
            warnings.warn(note, ThermoLensWarning, stacklevel=3)
    else:
        frac = lo = hi = empty
    return SweepResult(per_prompt=d, baseline=baseline.double(), clean=empty if clean is None else clean.double(),
                       effect=t(summary.mean), ci_low=t(summary.ci_low), ci_high=t(summary.ci_high), pvalue=t(p),
                       pvalue_holm=t(adj), fraction=frac, fraction_low=lo, fraction_high=hi, level=level,
                       notes=tuple(notes), **fields)
