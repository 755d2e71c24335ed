"""Compositions of the pass and of measurements: sweeps, many-model studies, the heritage lab."""

from thermo_lens._lazy import submodules

__getattr__ = submodules(__name__)  # `thermo_lens.<folder>.<module>` without importing it first
