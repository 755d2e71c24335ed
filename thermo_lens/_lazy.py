"""Modules imported on first use, so that ``import thermo_lens`` costs little beyond torch.

``pandas`` takes ~0.5 s to import and is needed only when a result is turned into a frame;
``scipy.stats`` only by the statistics. A module here is a stand-in whose first attribute access
imports the real module (annotations such as ``-> pd.DataFrame`` resolve through it too).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

__all__ = ["pandas", "scipy_stats", "submodules"]


class _LazyModule:
    """Stand-in for the module ``name``, imported on the first attribute access."""

    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}{'' if self._module is None else ' (imported)'}>"


if TYPE_CHECKING:  # type checkers see the modules themselves
    import pandas
    from scipy import stats as scipy_stats
else:
    pandas = _LazyModule("pandas")
    scipy_stats = _LazyModule("scipy.stats")


def submodules(package: str) -> Callable[[str], ModuleType]:
    """A package's ``__getattr__`` that imports ``package.<name>`` on first access, so that
    ``thermo_lens.measures.gain`` resolves after ``import thermo_lens`` alone (a layer folder)."""

    def __getattr__(name: str) -> ModuleType:
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__
