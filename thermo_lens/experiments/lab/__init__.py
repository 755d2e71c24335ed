"""The heritage lab: controlled training experiments on what sets the sign of the residual gain.

Across public models, the lab that trained a model is confounded with its data, positional
encoding, attention layout, tied embeddings, initialisation and optimiser. The heritage lab trains
toy GPT-2 / GPT-NeoX / OPT models from scratch in which exactly one of these knobs changes per arm
(initial weights, batch order and token budget matched), for several seeds, checkpoints them at
log-spaced steps, profiles every checkpoint with the standard battery and reports, per knob, the
seed-paired effect on each gain definition with its 95% CI, a permutation test and whether the
regime flips.

>>> from thermo_lens import lab
>>> spec = lab.load_lab_spec("recipes/heritage-lab.toml")     # doctest: +SKIP
>>> lab.run_lab(spec, "heritage-lab")                         # doctest: +SKIP

or ``thermo-lens lab SPEC --out DIR``. Modules: :mod:`~thermo_lens.experiments.lab.recipe` (recipe fields and
the knob registry :data:`KNOBS`), :mod:`~thermo_lens.experiments.lab.spec` (spec files),
:mod:`~thermo_lens.experiments.lab.architecture` (HF families, matched initial weights),
:mod:`~thermo_lens.experiments.lab.corpora` (the fixed training corpora), :mod:`~thermo_lens.experiments.lab.train`,
:mod:`~thermo_lens.experiments.lab.run`, :mod:`~thermo_lens.experiments.lab.effects`, :mod:`~thermo_lens.experiments.lab.views`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["KNOBS", "Recipe", "LabSpec", "LabSpecError", "load_lab_spec", "parse_lab_spec", "run_lab", "runs_frame",
           "effects_frame", "paired_effect", "train_run", "corpora", "gain_trajectories", "effect_sizes"]

_WHERE = {"KNOBS": "recipe", "Recipe": "recipe", "LabSpecError": "recipe", "LabSpec": "spec",
          "load_lab_spec": "spec", "parse_lab_spec": "spec", "run_lab": "run", "runs_frame": "run",
          "effects_frame": "effects", "paired_effect": "effects", "train_run": "train",
          "gain_trajectories": "views", "effect_sizes": "views"}


def __getattr__(name: str) -> Any:  # lazy: importing the lab must not import torch or plotly
    if name == "corpora":
        return importlib.import_module("thermo_lens.experiments.lab.corpora")
    if name in _WHERE:
        return getattr(importlib.import_module(f"thermo_lens.experiments.lab.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'thermo_lens.experiments.lab' has no attribute {name!r}")
