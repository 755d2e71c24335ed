"""thermo-lens: residual gain, head spectral signatures and sheaf Laplacians for TransformerLens.

The public API, re-exported. Definitions follow METHODS.md (shipped as the module docstrings);
the paper: D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures: A
Sheaf-Theoretic Perspective".
"""

from thermo_lens import laws, prompts, reference, views, zoo
from thermo_lens.anisotropy import AnisotropyResult, anisotropy_profile
from thermo_lens.depth import LStarResult, l_star_from_traces, predicted_l_star
from thermo_lens.gain import GainResult, paper_metric, residual_gain
from thermo_lens.hooks import Recorder, ThermoLensNumericsError, collect
from thermo_lens.model import ModelView, ThermoLensInputError
from thermo_lens.profile import ThermoProfile, profile, profiles_frame
from thermo_lens.robustness import input_robustness
from thermo_lens.sheaf import SheafLaplacian, SheafTraces, sheaf_laplacian, sheaf_traces
from thermo_lens.report import write_report
from thermo_lens.spectral import SpectralSignature, spectral_signature

__version__ = "0.1.0"

__all__ = [
    "AnisotropyResult", "GainResult", "LStarResult", "ModelView", "Recorder", "SheafLaplacian",
    "SheafTraces", "SpectralSignature", "ThermoLensInputError", "ThermoLensNumericsError",
    "ThermoProfile", "anisotropy_profile", "collect", "input_robustness", "l_star_from_traces",
    "laws", "paper_metric", "predicted_l_star", "profile", "profiles_frame", "prompts",
    "reference", "residual_gain", "views", "write_report", "sheaf_laplacian", "sheaf_traces", "spectral_signature", "zoo",
]
