"""thermo-lens: residual gain, head spectral signatures and sheaf Laplacians for TransformerLens.

The public surface, in one screen::

    import thermo_lens as tl

    tl.run(model, prompts, ["gain", "attribution"])      # any measurements, one pass per batch
    tl.profile(model)                                      # the whole battery (report, studies)
    tl.residual_gain(model, prompts)                       # one measurement each ...
    tl.gain_attribution(model, prompts); tl.anisotropy_profile(...); tl.sheaf_traces(...)
    tl.spectral_signature(model); tl.sheaf_laplacian(model, prompt, layer, head)
    tl.head_ablation(model, prompts, layer); tl.patch_from(model, clean, hook)   # circuits work
    tl.patch_sweep(model, clean, corrupted, "attn.hook_z"); tl.ablation_sweep(model, prompts, "attn.hook_z")
    tl.paired_difference(b, a)  # or b - a                 # paired CIs and t-tests
    tl.sae_gain_change(model, prompts); tl.input_robustness(model)
    tl.write_report(profiles)

Run options (``prepend_bos``, ``batch_size``, ``truncate``, ``fwd_hooks``, ``progress``,
``sort_by_length``) are the same keywords everywhere (:class:`RunSettings`). Every error is a
:class:`ThermoLensError`. Submodules: ``prompts`` (the paper's prompt sets), ``zoo`` (embedded
models), ``views`` (figures), ``laws`` and ``paper`` (cross-model laws, the paper's definitions and
numbers), ``study`` (many-model studies), ``registry`` (every metric and measurement),
``definitions`` (what every number means). Result classes live in their modules
(``thermo_lens.measures.gain.GainResult`` ...). Every definition: :mod:`thermo_lens.definitions`; the
paper: D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures: A Sheaf-Theoretic
Perspective".

The measurement core loads with the package; figures, the report, studies, laws, the paper's
numbers, prompt sets and the embedded models load on first use (PEP 562 ``__getattr__``), so
``import thermo_lens`` does not pay for plotly, scipy.stats or the study machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from thermo_lens import _moved
from thermo_lens.measures.ablation import head_ablation
from thermo_lens.measures.anisotropy import anisotropy_profile
from thermo_lens.measures.attribution import gain_attribution
from thermo_lens.core.errors import ThermoLensError, ThermoLensInputError
from thermo_lens.measures.gain import residual_gain
from thermo_lens.core.interventions import patch_from
from thermo_lens.core.measure import run
from thermo_lens.core.model import ModelView
from thermo_lens.stats.paired import paired_difference
from thermo_lens.measures.profile import profile, profiles_frame
from thermo_lens.core.settings import RunSettings
from thermo_lens.measures.sheaf import sheaf_laplacian, sheaf_traces
from thermo_lens.measures.spectral import spectral_signature
from thermo_lens.experiments.sweeps import ablation_sweep, patch_sweep

_moved.install()  # old module paths (thermo_lens.gain ...) keep importing for one release

if TYPE_CHECKING:  # the lazy names, for type checkers and IDEs
    from thermo_lens import definitions, laws, paper, views, zoo
    from thermo_lens.core import prompts, registry
    from thermo_lens.experiments import study
    from thermo_lens.report import write_report
    from thermo_lens.measures.robustness import input_robustness
    from thermo_lens.measures.sae import sae_gain_change

__version__ = "0.1.0"

# Submodules loaded on first attribute access, and functions loaded from them.
_LAZY_MODULES = {"definitions": "thermo_lens.definitions", "laws": "thermo_lens.laws", "paper": "thermo_lens.paper",
                 "prompts": "thermo_lens.core.prompts", "registry": "thermo_lens.core.registry",
                 "study": "thermo_lens.experiments.study", "views": "thermo_lens.views", "zoo": "thermo_lens.zoo"}
_LAZY_ATTRS = {"write_report": "thermo_lens.report", "input_robustness": "thermo_lens.measures.robustness",
               "sae_gain_change": "thermo_lens.measures.sae"}


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    if name in _moved.MOVED:  # tl.sweeps, tl.gain ...: the module in its layer folder (importing the old path warns)
        module = importlib.import_module(f"thermo_lens.{_moved.MOVED[name]}.{name}")
        globals()[name] = module
        return module
    if name in _LAZY_ATTRS:
        value = getattr(importlib.import_module(_LAZY_ATTRS[name]), name)
        globals()[name] = value
        return value
    from thermo_lens.core.result import _result_class

    cls = _result_class(name) if name[:1].isupper() else None  # a result class, to read a stored one
    if cls is not None and not name.startswith("_"):
        return cls
    raise AttributeError(f"module 'thermo_lens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(__all__) | {"__version__"})


__all__ = [
    # measuring
    "run", "profile", "residual_gain", "gain_attribution", "anisotropy_profile", "sheaf_traces",
    "sheaf_laplacian", "spectral_signature", "input_robustness",
    # circuits work and comparisons
    "head_ablation", "patch_from", "patch_sweep", "ablation_sweep", "paired_difference", "sae_gain_change",
    # tables and reports
    "profiles_frame", "write_report",
    # the model, run options, errors
    "ModelView", "RunSettings", "ThermoLensError", "ThermoLensInputError",
    # submodules
    "definitions", "laws", "paper", "prompts", "registry", "study", "views", "zoo",
]
