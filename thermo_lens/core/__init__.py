"""The ground: host adapters, the model view, tokens, settings, the pass, results, the registry."""

from thermo_lens._lazy import submodules

__getattr__ = submodules(__name__)  # `thermo_lens.<folder>.<module>` without importing it first
