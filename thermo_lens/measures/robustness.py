"""Input robustness: does the residual gain depend on what the prompt says?

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures", Fig. 7 ("Input
Robustness": residual gain across the 25 prompts per model, 5 categories x 5: Factual, Syntactic,
Cliche, Novel, Nonsense); ``thermo_lens.definitions`` §1 and §6.

:func:`input_robustness` measures the gain (:func:`thermo_lens.measures.gain.residual_gain`, any token
scope / BOS mode) on every prompt of a prompt set in one pass, then summarises each named gain
summary per prompt category: mean, SD (ddof=1), SE, 95% t-CI and the regime that category alone
would give. A Kruskal-Wallis test of the headline metric across categories
(``scipy.stats.kruskal``, H statistic and p-value) says whether the category matters, with its
effect size (epsilon^2 and eta^2_H) and the smallest effect it could detect: with 5 x 5 prompts
only large category effects are detectable, so a non-significant H is not evidence of
robustness. The paper showed error bars only. Per-prompt values are kept.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import pandas as pd
from scipy import stats as _st

from thermo_lens.measures.gain import SUMMARIES, GainResult, regime_from_summary, residual_gain
from thermo_lens.core.inputs import Prompts, as_prompts
from thermo_lens.core.model import as_view
from thermo_lens.core.prompts import PromptSet
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.result import Result
from thermo_lens.stats import (SummaryStats, format_p, kruskal_detectable_effect, kruskal_effect_size,
                                summarize)

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel
    from thermo_lens.core.model import ModelView

__all__ = ["RobustnessResult", "input_robustness", "robustness_from_gain"]


@dataclass(frozen=True, repr=False, eq=False)
class RobustnessResult(Result):
    """Gain per prompt category over a prompt set.

    Attributes:
        gain: the full :class:`~thermo_lens.measures.gain.GainResult` over every prompt (definitions, per-prompt
            and per-layer values).
        prompt_set: the prompt set's name (``"grand_unified_twin_gpt2_gptj_25"`` for ``"paper25"``).
        source: where its prompts came from.
        categories: category of each prompt (same order as ``gain.prompts``).
        metric: the headline summary (default: the one deciding ``gain.regime``).
        by_category: category -> summary name -> :class:`~thermo_lens.stats.SummaryStats` (mean,
            SD ddof=1, SE, CI; ``.values`` the per-prompt values of that category).
        category_regimes: category -> regime from that category's CI of ``metric``.
        kruskal_statistic, kruskal_pvalue: Kruskal-Wallis H test of ``metric`` across categories
            (NaN with fewer than 2 categories, or when all values are equal).
        kruskal_epsilon_squared, kruskal_eta_squared_h: its effect sizes ``H / (n - 1)`` and
            ``(H - k + 1) / (n - k)`` (:func:`thermo_lens.stats.kruskal_effect_size`).
        kruskal_detectable_eta2: the smallest eta^2 detected with 80% power at alpha = 0.05
            (:func:`thermo_lens.stats.kruskal_detectable_effect`): below it, "not significant"
            means "not measured", not "robust".
    """

    gain: GainResult
    prompt_set: str
    source: str
    categories: tuple[str, ...]
    metric: str
    by_category: dict[str, dict[str, SummaryStats]]
    category_regimes: dict[str, str]
    kruskal_statistic: float
    kruskal_pvalue: float
    kruskal_epsilon_squared: float = float("nan")
    kruskal_eta_squared_h: float = float("nan")
    kruskal_detectable_eta2: float = float("nan")

    @property
    def category_names(self) -> tuple[str, ...]:
        return tuple(self.by_category)

    @property
    def overall(self) -> SummaryStats:
        """``metric`` across all prompts."""
        return self.gain.summaries[self.metric]

    def per_prompt(self, name: str | None = None) -> np.ndarray:
        """Per-prompt values of summary ``name`` (default: ``metric``), prompt order."""
        return np.asarray(self.gain.summaries[name or self.metric].values, dtype=np.float64)

    def to_frame(self) -> pd.DataFrame:
        """One row per prompt: ``prompt, category, text, n_tokens, truncated``, every summary's
        value, and the definition columns (token scope, BOS, dtype, weights, post-LN, model)."""
        df = self.gain.prompt_frame()
        df.insert(1, "category", list(self.categories))
        df["prompt_set"] = self.prompt_set
        return df

    def summary_frame(self) -> pd.DataFrame:
        """One row per (category, summary): ``mean, sd (ddof=1), se, ci_low, ci_high, n, regime``."""
        rows = []
        for cat, per in self.by_category.items():
            for name, s in per.items():
                rows.append({"category": cat, "summary": name, **s.to_dict(),
                             "regime": regime_from_summary(s), "headline": name == self.metric})
        df = pd.DataFrame(rows)
        for k, v in self.gain._common().items():
            df[k] = v
        return df

    def __repr__(self) -> str:
        g = self.gain
        lines = [
            f"RobustnessResult({g.model.get('name')} on {self.prompt_set!r}: {g.n_prompts} prompts, "
            f"{len(self.by_category)} categories; token_scope={g.token_scope!r}, "
            f"prepend_bos={g.prepend_bos!r}, {g.dtype}, {g.weights} weights)",
            f"  metric {self.metric}: {SUMMARIES[self.metric]}",
            f"  {'category':<14} {'n':>3} {'mean':>9} {'SD(ddof=1)':>10} {'SE':>9}  95% CI             regime",
        ]
        for cat, per in self.by_category.items():
            s = per[self.metric]
            lines.append(f"  {cat[:14]:<14} {s.n:>3} {s.mean:>9.4g} {s.sd:>10.3g} {s.se:>9.3g}  "
                         f"[{s.ci_low:.4g}, {s.ci_high:.4g}]".ljust(70) + f" {self.category_regimes[cat]}")
        o = self.overall
        lines.append(f"  {'all':<14} {o.n:>3} {o.mean:>9.4g} {o.sd:>10.3g} {o.se:>9.3g}  "
                     f"[{o.ci_low:.4g}, {o.ci_high:.4g}]".ljust(70) + f" {g.regime}")
        if np.isfinite(self.kruskal_pvalue):
            lines.append(f"  category effect (Kruskal-Wallis): H = {self.kruskal_statistic:.3g}, "
                         f"p = {format_p(self.kruskal_pvalue)}, epsilon^2 = {self.kruskal_epsilon_squared:.3g}, "
                         f"eta^2_H = {self.kruskal_eta_squared_h:.3g}")
            lines.append(f"  power: with {g.n_prompts} prompts in {len(self.by_category)} categories only effects "
                         f"eta^2 >= {self.kruskal_detectable_eta2:.2f} are detected 80% of the time; a "
                         "non-significant p is not evidence of robustness")
        lines += [f"  note: {n}" for n in g.notes]
        return "\n".join(lines)


def robustness_from_gain(
    gain: GainResult,
    categories: Iterable[str],
    *,
    metric: str | None = None,
    prompt_set: str = "custom",
    source: str = "user",
) -> RobustnessResult:
    """Per-category summaries of an existing :class:`~thermo_lens.measures.gain.GainResult` (pure).

    ``categories`` gives one category per prompt of ``gain`` (e.g. ``PromptSet.categories``).
    """
    if not isinstance(gain, GainResult):
        raise ThermoLensInputError(f"expected a GainResult, got {type(gain).__name__}")
    categories = tuple(categories)
    if len(categories) != gain.n_prompts:
        raise ThermoLensInputError(
            f"{len(categories)} categories for {gain.n_prompts} prompts; give one category per prompt"
        )
    metric = metric or gain.regime_by
    if metric not in SUMMARIES:
        raise ThermoLensInputError(f"unknown metric {metric!r}; choose one of {', '.join(map(repr, SUMMARIES))}")
    cats = np.array(categories, dtype=object)
    by_category: dict[str, dict[str, SummaryStats]] = {}
    for cat in dict.fromkeys(categories):
        sel = cats == cat
        by_category[cat] = {
            name: summarize(np.asarray(s.values, dtype=np.float64)[sel], level=gain.level)
            for name, s in gain.summaries.items()
        }
    regimes = {cat: regime_from_summary(per[metric]) for cat, per in by_category.items()}
    groups = [np.asarray(per[metric].values) for per in by_category.values()]
    h = p = float("nan")
    if len(groups) >= 2 and all(np.isfinite(np.concatenate(groups))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                res = _st.kruskal(*groups)
                h, p = float(res.statistic), float(res.pvalue)
            except ValueError:  # all values identical
                pass
    n_all, k = int(sum(len(x) for x in groups)), len(groups)
    eff = kruskal_effect_size(h, n_all, k)
    return RobustnessResult(
        gain=gain, prompt_set=prompt_set, source=source, categories=categories, metric=metric,
        by_category=by_category, category_regimes=regimes, kruskal_statistic=h, kruskal_pvalue=p,
        kruskal_epsilon_squared=eff["epsilon_squared"], kruskal_eta_squared_h=eff["eta_squared_h"],
        kruskal_detectable_eta2=kruskal_detectable_effect(n_all, k) if k >= 2 else float("nan"),
    )


def input_robustness(
    model: TransformerLensModel | ModelView,
    prompt_set: Prompts = "paper25",
    *,
    metric: str | None = None,
    **gain_kwargs: Any,
) -> RobustnessResult:
    """Gain distribution per prompt category over a prompt set, from one pass.

    Args:
        model: a TransformerLens model.
        prompt_set: a built-in set name (default ``"paper25"``: the paper's 25 prompts, 5
            categories x 5), a :class:`thermo_lens.core.prompts.PromptSet`, a dict category -> prompts,
            or a list of prompts (one category, ``"all"``).
        metric: the headline summary per category (default: ``regime_by`` of the gain, i.e.
            ``"last_block_gain"``); every summary is computed regardless.
        **gain_kwargs: passed to :func:`thermo_lens.measures.gain.residual_gain` (``token_scope``,
            ``prepend_bos``, ``batch_size``, ``truncate``, ``regime_by``, ``fwd_hooks``...).

    Raises:
        ThermoLensInputError: unknown prompt-set name, bad prompts (see ``residual_gain``),
            unknown ``metric``.
    """
    if metric is not None and metric not in SUMMARIES:
        raise ThermoLensInputError(f"unknown metric {metric!r}; choose one of {', '.join(map(repr, SUMMARIES))}")
    view = as_view(model)
    ps = as_prompts(prompt_set, tokenizer=view.tokenizer, vocab_size=view.d_vocab)
    source = prompt_set.source if isinstance(prompt_set, PromptSet) else (
        "thermo_lens.core.prompts" if isinstance(prompt_set, str) and ps.name != "custom" else "user")
    gain = residual_gain(view, ps, **gain_kwargs)
    return robustness_from_gain(gain, ps.categories, metric=metric, prompt_set=ps.name, source=source)
