"""thermo-lens: residual gain, head spectral signatures and sheaf Laplacians for TransformerLens.

The public API, re-exported. Every definition is on the definitions page
(:mod:`thermo_lens.definitions`); the paper: D'Elia (2026), "Thermodynamic Constraints in
Transformer Architectures: A Sheaf-Theoretic Perspective".

The measurement core (model view, hooks, gain, spectral, sheaf, L*, profile) loads with the
package; the figures (``views``), the report, studies, laws, the paper's reference numbers, prompt
sets and the embedded models load on first use (PEP 562 ``__getattr__``), so ``import thermo_lens``
does not pay for plotly, scipy.stats or the study machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from thermo_lens.anisotropy import AnisotropyResult, anisotropy_profile
from thermo_lens.attribution import GainAttribution, gain_attribution
from thermo_lens.depth import LStarResult, l_star_from_traces, predicted_l_star
from thermo_lens.gain import GainResult, residual_gain
from thermo_lens.paper.metrics import paper_metric
from thermo_lens.passes import Recorder, collect
from thermo_lens.errors import ThermoLensError, ThermoLensNumericsError
from thermo_lens.inputs import as_prompts
from thermo_lens.interventions import Patch, patch_from
from thermo_lens.tokens import BatchInfo
from thermo_lens.errors import ThermoLensHookError
from thermo_lens.model import ModelView
from thermo_lens.errors import ThermoLensInputError
from thermo_lens.paired import PairedDifference, paired_difference
from thermo_lens.profile import ThermoProfile, profile, profiles_frame
from thermo_lens.provenance import HookRecord, Provenance
from thermo_lens.sheaf import SheafLaplacian, SheafTraces, sheaf_laplacian, sheaf_traces
from thermo_lens.settings import RunSettings
from thermo_lens.spectral import SpectralSignature, spectral_signature

if TYPE_CHECKING:  # the lazy names, for type checkers and IDEs
    from thermo_lens import definitions, laws, paper, prompts, reference, registry, report, study, views, zoo
    from thermo_lens.report import write_report
    from thermo_lens.robustness import input_robustness
    from thermo_lens.sae import SAEGainChange, sae_gain_change

__version__ = "0.1.0"

# Submodules loaded on first attribute access, and functions loaded from them.
_LAZY_MODULES = ("definitions", "laws", "paper", "prompts", "reference", "registry", "report", "study", "views", "zoo")
_LAZY_ATTRS = {"write_report": "thermo_lens.report", "input_robustness": "thermo_lens.robustness",
               "sae_gain_change": "thermo_lens.sae", "SAEGainChange": "thermo_lens.sae"}


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"thermo_lens.{name}")
    if name in _LAZY_ATTRS:
        value = getattr(importlib.import_module(_LAZY_ATTRS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'thermo_lens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_ATTRS))


__all__ = [
    "BatchInfo", "ThermoLensError", "GainAttribution", "HookRecord", "PairedDifference", "Patch", "Provenance", "RunSettings",
    "ThermoLensHookError", "as_prompts", "gain_attribution", "paired_difference", "patch_from",
    "AnisotropyResult", "GainResult", "LStarResult", "ModelView", "Recorder", "SheafLaplacian",
    "SheafTraces", "SpectralSignature", "ThermoLensInputError", "ThermoLensNumericsError",
    "ThermoProfile", "anisotropy_profile", "collect", "definitions", "input_robustness", "l_star_from_traces",
    "laws", "paper", "paper_metric", "predicted_l_star", "profile", "profiles_frame", "prompts",
    "reference", "registry", "residual_gain", "SAEGainChange", "sae_gain_change", "views", "write_report", "sheaf_laplacian", "sheaf_traces",
    "spectral_signature", "study", "report", "zoo",
]
