"""Hierarchy: groups (labs, families) ranked by mean gain with uncertainty (D'Elia 2026, abstract).

The abstract's Pythia (0.80) < Mistral (1.11) < LLaMA (1.48) < Gemma (2.31) ranks one model per
group: with n = 1 per group there is no within-group spread, so no test separates the groups.

Declared tests (``thermo_lens.definitions`` §5): the primary is whether the groups differ at all,
a Kruskal-Wallis H with a permutation p (exact over every labeling up to ``exact_max`` labelings,
20,000 by default and up to 10^8 when asked, e.g. for the paper's 16-model survey, 60,540,480
labelings, a few seconds; above it a Monte Carlo estimate whose method string gives its Monte Carlo
standard error); the secondary family is
each pair of groups adjacent in the observed ranking (both n >= 2), a permutation test of the
difference in means with the shift interval that inverts it (Welch's t p beside it), Holm over
them. The pairs are picked by the data's own order, so read them as post hoc.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from thermo_lens.laws.base import LawResult, StatTest, declare, leave_one_out
from thermo_lens.stats.exact import permutation_mean_difference
from thermo_lens.laws.table import Table, _as_frame, _group_stats, _labels, _numeric, _require

__all__ = ["HierarchyResult", "hierarchy", "family_of", "KRUSKAL_EXACT_MAX"]

#: Up to this many labelings the Kruskal-Wallis permutation p is exact by default; above, Monte Carlo.
KRUSKAL_EXACT_MAX = 20_000
#: The most labelings ``exact_max`` may ask to enumerate (10^8 take seconds).
KRUSKAL_EXACT_LIMIT = 100_000_000

_FAMILIES = (
    ("pythia", r"pythia"), ("gpt-neox", r"gpt-?neox"), ("gpt-neo", r"gpt-?neo"),
    ("gpt-j", r"gpt-?j"), ("gpt2", r"gpt-?2"), ("opt", r"(^|/)opt"), ("bloom", r"bloom"),
    ("llama", r"llama"), ("mistral", r"mistral"), ("gemma", r"gemma"), ("falcon", r"falcon"),
    ("stablelm", r"stablelm"), ("apertus", r"apertus"), ("qwen", r"qwen"), ("phi", r"(^|/)phi"),
)


def family_of(model: str) -> str:
    """Model family from a model name or HF id (``"EleutherAI/pythia-1b"`` -> ``"pythia"``).

    Known families by pattern; otherwise the name's first ``-``-separated token, lower-cased.
    """
    s = str(model).lower()
    for fam, pat in _FAMILIES:
        if re.search(pat, s):
            return fam
    return s.split("/")[-1].split("-")[0]


@dataclass(frozen=True, repr=False, eq=False)
class HierarchyResult(LawResult):
    """Groups ranked by mean gain (D'Elia 2026, abstract).

    ``groups`` per group: ``rank, group, n, mean, sd`` (ddof=1), ``se``, ``ci_low, ci_high``
    (t distribution, n - 1 df, NaN for n = 1), ``min, max``. ``separated_from_next``: whether the
    group's CI and the next group's CI are disjoint (a crude check; NaN CIs count as not separated).
    """

    groups: pd.DataFrame
    by: str
    level: float
    stat_tests: tuple = ()

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(self.groups["group"])

    def to_frame(self) -> pd.DataFrame:
        return self.groups.copy()

    def summary(self) -> str:
        lines = [f"HierarchyResult(by {self.by!r}, {len(self.groups)} groups, {self.level:.0%} t CI): "
                 + " < ".join(f"{g} ({m:.3f})" for g, m in zip(self.groups["group"], self.groups["mean"]))]
        for _, r in self.groups.iterrows():
            ci = (f"[{r['ci_low']:.4f}, {r['ci_high']:.4f}]" if np.isfinite(r["ci_low"])
                  else "(n=1, no CI)")
            lines.append(f"  {int(r['rank'])}. {r['group']}: n={int(r['n'])}, mean={r['mean']:.4f}, "
                         f"SE={r['se']:.4f}, CI {ci}")
        if self.tests:
            lines += self.tests_summary()
        else:
            lines.append("  no test: every group has one model (no within-group spread)")
        return "\n".join(lines)


def hierarchy(table: Table, by: str = "lab", gain: str = "gain", level: float = 0.95,
              ascending: bool = True, exact_max: int = KRUSKAL_EXACT_MAX) -> HierarchyResult:
    """Rank groups of models by mean gain, with SE and a t-based CI.

    ``by`` is a column (``"lab"``, ``"family"``, ...). ``by="family"`` without a ``family`` column
    derives it from ``model`` (or ``hf_id``) with :func:`family_of`. ``exact_max``: the primary
    test's p is exact up to this many labelings (at most 10^8), a Monte Carlo estimate with its
    standard error above.
    """
    if not isinstance(exact_max, int) or not 0 <= exact_max <= KRUSKAL_EXACT_LIMIT:
        raise ValueError(f"hierarchy: exact_max must be an int in [0, {KRUSKAL_EXACT_LIMIT:,}], got {exact_max!r}")
    func = "hierarchy"
    df = _as_frame(table, func)
    if by == "family" and "family" not in df.columns:
        src = "model" if "model" in df.columns else ("hf_id" if "hf_id" in df.columns else None)
        if src is None:
            raise ValueError(f"{func}: no 'family' column and no 'model'/'hf_id' to derive it from")
        df["family"] = [family_of(m) for m in df[src]]
    _require(df, [by], func)
    if df[by].isna().any():
        raise ValueError(f"{func}: column {by!r} has missing values")
    g = _numeric(df, gain, func)
    if not 0 < level < 1:
        raise ValueError(f"{func}: level must be in (0, 1)")
    keys = df[by].astype(str).to_numpy()
    rows = [{"group": k, **_group_stats(g[keys == k], level)} for k in dict.fromkeys(keys)]
    out = pd.DataFrame(rows).sort_values("mean", ascending=ascending, kind="stable").reset_index(drop=True)
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    lo, hi = out["ci_low"].to_numpy(), out["ci_high"].to_numpy()
    sep = [bool(np.isfinite(hi[i]) and np.isfinite(lo[i + 1]) and
                (hi[i] < lo[i + 1] if ascending else lo[i] > hi[i + 1]))
           for i in range(len(out) - 1)] + [False]
    out["separated_from_next"] = sep
    glob = _global_test(keys, g, _labels(df), exact_max)
    tests = ([glob] if glob is not None else []) + list(_adjacent_tests(out, keys, g, _labels(df), level))
    return HierarchyResult(groups=out, by=by, level=level, stat_tests=declare(tests))


def _arrangements(sizes: np.ndarray, n: int) -> np.ndarray:
    """Every distinct assignment of group codes with these sizes to ``n`` positions ``[m, n]``."""
    from itertools import combinations

    out = [np.full(n, -1, dtype=np.int64)]
    for j, size in enumerate(sizes):
        nxt = []
        for a in out:
            free = np.flatnonzero(a < 0)
            for idx in combinations(free.tolist(), int(size)):
                b = a.copy()
                b[list(idx)] = j
                nxt.append(b)
        out = nxt
    return np.array(out, dtype=np.int64)


_KW_MC = 20_000


def _exact_rank_sum_stat(ranks: np.ndarray, code: np.ndarray, sizes: np.ndarray, observed: float,
                         tol: float) -> tuple[int, int]:
    """``(hits, total)``: labelings (group sizes fixed) whose ``sum_j S_j^2 / n_j`` reaches ``observed``.

    Every labeling once: the largest group's members by combinations (outer, in chunks), the other
    groups by all their arrangements of the remaining positions (inner, precomputed once), so the work
    is vectorised over ``C(n, n_1)`` x ``n! / prod(n_j!)`` / ``C(n, n_1)`` rank sums.
    """
    from itertools import combinations

    n = ranks.size
    first = int(np.argmax(sizes))
    rest = [j for j in range(sizes.size) if j != first]
    inner = _arrangements(sizes[rest].astype(int), n - int(sizes[first]))        # [m, n - n_1] codes 0..k-2
    onehots = [(inner == i).astype(np.float64) for i in range(len(rest))]        # [m, n - n_1] each
    hits = total = 0
    outer = list(combinations(range(n), int(sizes[first])))
    for start in range(0, len(outer), 256):
        chunk = np.array(outer[start:start + 256], dtype=np.int64)                # [c, n_1]
        mask = np.ones((chunk.shape[0], n), dtype=bool)
        np.put_along_axis(mask, chunk, False, axis=1)
        r_first = ranks[chunk].sum(axis=1)                                        # [c]
        r_rest = ranks[np.nonzero(mask)[1].reshape(chunk.shape[0], -1)]           # [c, n - n_1]
        stat = np.repeat((r_first ** 2 / sizes[first])[:, None], inner.shape[0], axis=1)
        for i, j in enumerate(rest):
            stat += (r_rest @ onehots[i].T) ** 2 / sizes[j]                       # [c, m]
        hits += int(np.count_nonzero(stat >= observed - tol))
        total += stat.size
    return hits, total


def _kruskal_perm(keys: np.ndarray, g: np.ndarray, seed: int = 0,
                  exact_max: int = KRUSKAL_EXACT_MAX) -> tuple[float, float, str]:
    """Kruskal-Wallis H and its permutation p (group labels exchangeable).

    Exact over every labeling with the observed group sizes when there are at most ``exact_max``;
    otherwise ``20,000`` random labelings with ``seed``, and the method string gives the estimate's
    Monte Carlo standard error ``sqrt(p (1 - p) / 20000)``.
    """
    import math

    from scipy import stats

    groups = list(dict.fromkeys(keys))
    code = np.array([groups.index(k) for k in keys])
    ranks = stats.rankdata(g)
    n = g.size
    sizes = np.bincount(code, minlength=len(groups)).astype(float)
    counts = np.unique(g, return_counts=True)[1]
    ties = 1 - np.sum(counts ** 3 - counts) / (n ** 3 - n)
    if ties <= 0:  # every gain equal: no ranks to compare
        return 0.0, 1.0, "all values tied: no test"

    def h(perm_codes: np.ndarray) -> np.ndarray:  # [m, n] group codes
        sums = np.stack([(ranks * (perm_codes == j)).sum(axis=1) for j in range(len(groups))], axis=1)
        return (12 / (n * (n + 1)) * (sums ** 2 / sizes).sum(axis=1) - 3 * (n + 1)) / ties

    total = math.factorial(n) // int(np.prod([math.factorial(int(c)) for c in sizes]))
    obs = float(h(code[None, :])[0])
    if total <= min(20_000, exact_max):
        perms = _arrangements(sizes.astype(int), n)
        return obs, float(np.mean(h(perms) >= obs - 1e-9)), f"exact permutation (all {total} labelings)"
    if total <= exact_max:
        # H is increasing in sum_j S_j^2 / n_j: count the labelings whose sum reaches the observed one
        sums = np.array([ranks[code == j].sum() for j in range(len(groups))])
        t_obs = float((sums ** 2 / sizes).sum())
        hits, count = _exact_rank_sum_stat(ranks, code, sizes, t_obs, 1e-9 * t_obs)
        assert count == total
        return obs, hits / total, f"exact permutation (all {total:,} labelings)"
    rng = np.random.default_rng(seed)
    perms = rng.permuted(np.tile(code, (_KW_MC, 1)), axis=1)
    p = float(np.mean(h(perms) >= obs - 1e-9))
    return obs, p, (f"Monte Carlo permutation ({_KW_MC} labelings, seed {seed}; Monte Carlo SE "
                    f"{math.sqrt(p * (1 - p) / _KW_MC):.4f})")


def _global_test(keys: np.ndarray, g: np.ndarray, labels: list,
                 exact_max: int = KRUSKAL_EXACT_MAX) -> StatTest | None:
    """The primary: do the groups differ at all? (None when no group has two models.)"""
    from thermo_lens.stats import kruskal_effect_size

    groups = list(dict.fromkeys(keys))
    if len(groups) < 2 or max(int(np.sum(keys == k)) for k in groups) < 2:
        return None
    hstat, p, how = _kruskal_perm(keys, g, exact_max=exact_max)
    eps = kruskal_effect_size(hstat, g.size, len(groups))["epsilon_squared"]

    def loo(keep):  # Monte Carlo above 20,000 labelings: n exact enumerations could cost seconds each
        if len(set(keys[keep])) < 2:
            raise ValueError("one group")
        h2, p2, _ = _kruskal_perm(keys[keep], g[keep], exact_max=20_000)
        return h2, p2

    return StatTest(
        family="hierarchy", name="groups differ in gain (all groups)", test="Kruskal-Wallis H, permutation test",
        n=int(g.size), statistic=hstat, effect="epsilon squared H/(n-1)", effect_value=eps,
        ci_low=float("nan"), ci_high=float("nan"), pvalue=p, pvalue_method=how, role="primary",
        hypothesis="gain exchangeable across groups", note=f"{len(groups)} groups; groups of one model add no spread",
        **leave_one_out(labels, loo, hstat))


def _perm_p(u: np.ndarray, v: np.ndarray) -> tuple[float, str]:
    """Two-sided permutation p of mean(u) - mean(v): P(|diff_perm| >= |diff_obs|) over the splits."""
    import math

    from scipy import stats

    total = math.comb(u.size + v.size, u.size)
    exact = total <= 20_000
    res = stats.permutation_test((u, v), lambda a, b, axis=-1: np.abs(a.mean(axis=axis) - b.mean(axis=axis)),
                                 vectorized=True, alternative="greater",
                                 n_resamples=np.inf if exact else 20_000, rng=np.random.default_rng(0))
    how = (f"exact permutation (all {total} splits)" if exact
           else "Monte Carlo permutation (20000 resamples, seed 0)")
    return float(res.pvalue), how


def _adjacent_tests(groups: pd.DataFrame, keys: np.ndarray, g: np.ndarray, labels: list, level: float) -> list:
    """Each pair of groups adjacent in the observed order (both n >= 2): the difference in mean gain,
    its exact permutation p and the shift interval inverting it, Welch's t p beside them."""
    from scipy import stats

    tests = []
    order = list(groups["group"])
    for a, b in zip(order[:-1], order[1:]):
        xa, xb = g[keys == a], g[keys == b]
        if xa.size < 2 or xb.size < 2:
            continue
        w = stats.ttest_ind(xb, xa, equal_var=False)
        md = permutation_mean_difference(xb, xa)
        ci = md.confidence_interval(level)
        sel = (keys == a) | (keys == b)
        sub_keys, sub_g, sub_labels = keys[sel], g[sel], [lab for lab, s in zip(labels, sel) if s]

        def loo(keep, sub_keys=sub_keys, sub_g=sub_g, a=a, b=b):
            ua, ub = sub_g[keep][sub_keys[keep] == a], sub_g[keep][sub_keys[keep] == b]
            if ua.size < 2 or ub.size < 2:
                raise ValueError("group too small")
            return float(ub.mean() - ua.mean()), _perm_p(ub, ua)[0]

        tests.append(StatTest(
            family="hierarchy", name=f"{b} - {a}", test="difference in mean gain, permutation test",
            n=int(xa.size + xb.size), statistic=md.statistic, effect="difference in mean gain",
            effect_value=md.statistic, ci_low=ci.low, ci_high=ci.high, pvalue=md.pvalue,
            pvalue_method=md.method, pvalue_other=float(w.pvalue), pvalue_other_method="Welch t",
            role="secondary", hypothesis=f"{a} and {b} exchangeable",
            ci_method="shifts the permutation test does not reject (it inverts the same test)",
            note="a pair adjacent in the observed ranking: chosen by the data, read it as post hoc",
            **leave_one_out(sub_labels, loo, md.statistic)))
    return tests
