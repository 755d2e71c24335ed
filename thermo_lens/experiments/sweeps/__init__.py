"""Patching and ablation sweeps (issue 22): :func:`patch_sweep`, :func:`ablation_sweep`, :class:`SweepResult`.

* :mod:`thermo_lens.experiments.sweeps.api`: the entry points, cells and value sources;
* :mod:`thermo_lens.experiments.sweeps.engine`: hook layouts, measures, many conditions per forward pass;
* :mod:`thermo_lens.experiments.sweeps.logits`: :class:`LogitDifference`, a logit difference from the final residual;
* :mod:`thermo_lens.experiments.sweeps.start`: passes that start at the cell's layer from the unpatched residual;
* :mod:`thermo_lens.experiments.sweeps.result`: per-prompt effects, paired CIs, Holm, fraction restored.
"""

from thermo_lens.experiments.sweeps.api import METHODS, OVER, ablation_sweep, patch_sweep
from typing import TYPE_CHECKING

from thermo_lens.experiments.sweeps import engine as _engine
from thermo_lens.experiments.sweeps.engine import measure_definitions
from thermo_lens.experiments.sweeps.logits import LogitDifference
from thermo_lens.experiments.sweeps.result import SweepResult

__all__ = ["patch_sweep", "ablation_sweep", "SweepResult", "METHODS", "OVER", "measure_definitions",
           "LogitDifference"]


if TYPE_CHECKING:
    MEASURE_DEFINITIONS: dict[str, str]
    GAIN_MEASURES: tuple[str, ...]


def __getattr__(name: str) -> object:
    # MEASURE_DEFINITIONS and GAIN_MEASURES, read from the registry's readouts when asked for
    if name in ("MEASURE_DEFINITIONS", "GAIN_MEASURES"):
        return getattr(_engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
