"""Patching and ablation sweeps (issue 22): :func:`patch_sweep`, :func:`ablation_sweep`, :class:`SweepResult`.

* :mod:`thermo_lens.sweeps.api`: the entry points, cells and value sources;
* :mod:`thermo_lens.sweeps.engine`: hook layouts, measures, many conditions per forward pass;
* :mod:`thermo_lens.sweeps.logits`: :class:`LogitDifference`, a logit difference from the final residual;
* :mod:`thermo_lens.sweeps.start`: passes that start at the cell's layer from the unpatched residual;
* :mod:`thermo_lens.sweeps.result`: per-prompt effects, paired CIs, Holm, fraction restored.
"""

from thermo_lens.sweeps.api import METHODS, OVER, ablation_sweep, patch_sweep
from thermo_lens.sweeps.engine import GAIN_MEASURES, MEASURE_DEFINITIONS
from thermo_lens.sweeps.logits import LogitDifference
from thermo_lens.sweeps.result import SweepResult

__all__ = ["patch_sweep", "ablation_sweep", "SweepResult", "METHODS", "OVER", "GAIN_MEASURES", "MEASURE_DEFINITIONS",
           "LogitDifference"]
