"""Cross-model "laws", computed with p-values, never asserted.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures: A Sheaf-Theoretic
Perspective", states five cross-model regularities. Each is a test on a plain table with **one row
per model** (a ``pandas.DataFrame``; a list of dicts, or of objects with ``.to_row()`` /
``.to_dict()``, is accepted too), so the paper's own numbers (:mod:`thermo_lens.paper.reference`) and new
measurements go through the same code. One file per law:

- :func:`kleiber`   (``laws/kleiber.py``) bound ``G_max = 10**(1/L)`` per model and per gain column
  (:func:`bound_table`), violations with CIs (:func:`kleiber_violations` over several tables),
  Pearson/Spearman of gain vs head density rho, vs depth L and vs the bound (paper section 4.1, Fig. 1).
- :func:`heritage`  (``laws/heritage.py``) lab x regime contingency table, one exact test per lab
  (that lab vs the rest, dampener vs not: Blaker's p with the odds-ratio interval inverting it),
  per-lab mean gain +- SE (paper section 4.2, Fig. 2).
- :func:`crowding`  (``laws/crowding.py``) accuracy of the rule ``rho > rho_crit => dampener`` on a
  threshold grid against the majority baseline with a permutation p, a logistic fit
  (``laws/logistic.py``), and the depth confound ``r(gain, rho | L)``; :func:`crowding_comparison`
  puts within-family and across-family tables side by side (paper section 5.4).
- :func:`twin`      (``laws/twin.py``) base vs fine-tuned pairs: is the sign of ``G - 1`` kept?
  (paper section 5.5).
- :func:`hierarchy` (``laws/hierarchy.py``) groups (labs, families) ranked by mean gain with SE and
  t-based 95% CI (paper abstract).

Every result carries its tests as :class:`StatTest` records (``result.tests``,
``result.tests_frame()``, ``result.primary``): the test, ``n``, an effect size with its CI (and
whether the CI inverts the same test), the p-value valid at that ``n`` (exact or permutation for
small samples), and a leave-one-out sensitivity. Each law declares one primary test (the paper's
claim), a secondary family of distinct nulls (Holm over them only) and sensitivity tests that
restate a null by another statistic (never counted twice); ``thermo_lens.definitions`` §5 lists
them. With 8 or 16 models these are fragile: the ``repr`` prints all of it. Results subclass
:class:`thermo_lens.core.result.Result` (exact JSON round-trip) and offer
``summary()`` and ``to_dict()``. Table coercion and measured regimes live in ``laws/table.py``;
the shared statistics (t interval, regime rule, Holm, ...) in :mod:`thermo_lens.stats`.
"""

from thermo_lens.laws.base import (ROLES, CorrelationResult, LawResult, StatTest, TestResult, correlation, declare,
                                   tests_frame)
from thermo_lens.laws.crowding import (CrowdingComparison, CrowdingResult, crowding,
                                       crowding_comparison, threshold_rule_pvalue)
from thermo_lens.laws.heritage import PAPER_HERITAGE_LAB, FisherResult, HeritageResult, heritage
from thermo_lens.laws.hierarchy import HierarchyResult, family_of, hierarchy
from thermo_lens.laws.kleiber import (BOUND_GAINS, KleiberResult, bound_table, kleiber, kleiber_bound,
                                      kleiber_violations)
from thermo_lens.laws.logistic import LogisticFit, logistic_fit
from thermo_lens.laws.table import REGIMES, add_regimes, gain_ci, regime_from_gain
# table helpers the views reuse (private; kept reachable under their old names)
from thermo_lens.laws.table import _as_frame, _labels, _numeric, _regimes, _require, _rho  # noqa: F401
from thermo_lens.laws.twin import TwinResult, twin

__all__ = [
    "REGIMES",
    "LawResult",
    "StatTest",
    "TestResult",
    "CorrelationResult",
    "KleiberResult",
    "FisherResult",
    "HeritageResult",
    "LogisticFit",
    "CrowdingResult",
    "CrowdingComparison",
    "TwinResult",
    "HierarchyResult",
    "correlation",
    "tests_frame",
    "kleiber_bound",
    "kleiber",
    "kleiber_violations",
    "bound_table",
    "BOUND_GAINS",
    "PAPER_HERITAGE_LAB",
    "ROLES",
    "declare",
    "regime_from_gain",
    "gain_ci",
    "add_regimes",
    "heritage",
    "crowding",
    "crowding_comparison",
    "threshold_rule_pvalue",
    "logistic_fit",
    "twin",
    "hierarchy",
    "family_of",
]
