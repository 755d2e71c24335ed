"""Everything specific to D'Elia (2026), in one namespace.

"Thermodynamic Constraints in Transformer Architectures: A Sheaf-Theoretic Perspective". The rest
of thermo-lens measures under its own named definitions; this package holds the paper's side:

- :mod:`~thermo_lens.paper.metrics`   the paper's gain metrics (``paper_metric``, ``PAPER_METRICS``),
  measured by default on the prompt set the paper used for that metric and experiment.
- :mod:`~thermo_lens.paper.reference` the per-model numbers in the paper's result files.
- :mod:`~thermo_lens.paper.prompts`   which prompt set went with which experiment.
- :mod:`~thermo_lens.paper.lstar`     eq. 6 against the trivial baselines (``l_star_predictor_test``: a paired
  exact test); the formula itself is :mod:`thermo_lens.measures.depth.predicted`.
- :mod:`~thermo_lens.paper.findings`  what the paper's own numbers say when recomputed with
  :mod:`thermo_lens.laws` (the README's numbers are generated from it).
"""

from __future__ import annotations

from typing import Any

from thermo_lens.paper import lstar, prompts, reference
from thermo_lens.paper.lstar import (L_STAR_BASELINES, l_star_baselines, l_star_comparison, l_star_predictor_test,
                                     predicted_l_star)

__all__ = ["findings", "lstar", "metrics", "prompts", "reference", "L_STAR_BASELINES", "PAPER_METRICS",
           "PaperMetric", "PaperMetricResult", "l_star_baselines", "l_star_comparison", "l_star_predictor_test",
           "paper_metric",
           "predicted_l_star"]

_LAZY = {"PAPER_METRICS": "metrics", "PaperMetric": "metrics", "PaperMetricResult": "metrics",
         "paper_metric": "metrics", "metrics": None, "findings": None}


def __getattr__(name: str) -> Any:
    # metrics needs the gain machinery (torch hooks), findings needs scipy: load them on first use.
    if name in _LAZY:
        import importlib

        mod = importlib.import_module(f"thermo_lens.paper.{_LAZY[name] or name}")
        return mod if _LAZY[name] is None else getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
