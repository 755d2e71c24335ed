"""Old module paths, kept importable for one release after the package moved into layer folders.

``import thermo_lens.gain`` still works and returns the very module ``thermo_lens.measures.gain``
(one module object, so ``isinstance`` and ``unittest.mock.patch`` behave), with a
``DeprecationWarning`` that names the new path. Nothing is imported until an old path is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "new_name"]

#: Old top-level name -> the folder it moved into.
MOVED: dict[str, str] = {
    "errors": "core",
    "attached": "core",
    "validate": "core",
    "settings": "core",
    "host": "core",
    "hosts": "core",
    "tokens": "core",
    "inputs": "core",
    "prompts": "core",
    "model": "core",
    "layout": "core",
    "result": "core",
    "provenance": "core",
    "safe_io": "core",
    "registry": "core",
    "packed": "core",
    "passes": "core",
    "interventions": "core",
    "offload": "core",
    "cache_match": "core",
    "census": "core",
    "measure": "core",
    "products": "core",
    "gain": "measures",
    "anisotropy": "measures",
    "attribution": "measures",
    "sheaf": "measures",
    "spectral": "measures",
    "depth": "measures",
    "write_norm": "measures",
    "sae": "measures",
    "robustness": "measures",
    "profile": "measures",
    "ablation": "measures",
    "paired": "stats",
    "sweeps": "experiments",
    "study": "experiments",
    "lab": "experiments",
}


def new_name(fullname: str) -> str | None:
    """The new dotted path of an old ``thermo_lens.<name>[.<sub>]`` path, or None if it did not move."""
    parts = fullname.split(".")
    if len(parts) < 2 or parts[0] != "thermo_lens" or parts[1] not in MOVED:
        return None
    return ".".join(["thermo_lens", MOVED[parts[1]], *parts[1:]])


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:  # already executed under its new name
        pass


class _OldPaths(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; import it from there (the old path goes in the next release)",
                      DeprecationWarning, stacklevel=3)
        real = importlib.import_module(new)
        return importlib.machinery.ModuleSpec(fullname, _Alias(new), is_package=hasattr(real, "__path__"))


def install() -> None:
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())
