"""The measurements: gain, anisotropy, attribution, sheaf, spectral, depth, write norms, SAEs, profile."""

from thermo_lens._lazy import submodules

__getattr__ = submodules(__name__)  # `thermo_lens.<folder>.<module>` without importing it first
