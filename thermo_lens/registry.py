"""The metric registry: one entry per metric, the single source of its name and definition.

Every number thermo-lens reports is registered here once, by the module that computes it, with
its name (the attribute / frame column), a short symbol, the formula in words, its shape, unit
and reference (a section of the definitions page, :mod:`thermo_lens.definitions`, and the paper's section
where the paper defines it). Results, frames (``to_frame`` / ``to_row``), hover text, panels, the
report glossary and the definitions page all iterate over the registry, so a metric is defined in
one place.

A weight-based per-head metric also registers the function that computes it from a
:class:`~thermo_lens.spectral.HeadWeights` accessor (cached per-head weights, Gram matrices and their square-root factors)::

    @register_head_metric(Metric("qk_norm", symbol="||W_Q W_K^T||_2", ...))
    def qk_norm(w: HeadWeights) -> Float[Tensor, "layer head"]:
        return torch.linalg.svdvals(w.R_Q @ w.R_K[:, w.kv_head_of].mT)[..., 0]

and :func:`thermo_lens.spectral_signature` computes it for every layer and head, with the
definition carried everywhere. (In the style of SAELens' ``registry.py``.)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Metric", "register_metric", "register_head_metric", "get", "metrics", "definitions", "SECTIONS"]

#: Sections of the definitions page (``thermo_lens/definitions.md``, printed by
#: ``python -m thermo_lens.definitions``): key -> numbered title.
SECTIONS: dict[str, str] = {
    "gain": "1. Residual states and gain",
    "spectral": "2. Spectral signature",
    "sheaf": "3. Sheaf restriction maps and Laplacian",
    "l_star": "4. L*, the depth of maximal trace change",
    "laws": "5. Cross-model laws",
    "numerics": "6. Numerics and provenance",
}

# Modules that register metrics; imported on first full listing so the registry is complete.
_PROVIDERS = (
    "thermo_lens.gain",
    "thermo_lens.anisotropy",
    "thermo_lens.spectral",
    "thermo_lens.sheaf.traces",
    "thermo_lens.depth",
    "thermo_lens.views.panels",
)

#: Results in data-flow order: the registry lists their metrics in this order.
RESULT_ORDER = ("GainResult", "AnisotropyResult", "SpectralSignature", "SheafTraces", "LStarResult", "AttentionPanel")

#: Shapes a metric can have (dimension names as in the jaxtyping annotations).
SHAPES = ("layer head", "layer kv_head", "layer", "prompt layer", "prompt state", "prompt",
          "prompt layer head", "head", "")


@dataclass(frozen=True)
class Metric:
    """One metric's definition.

    Attributes:
        name: attribute and frame column name (``"ov_norm"``).
        symbol: short mathematical label for axes and tables (``"||W_V W_O||_2"``).
        formula: the definition in words and symbols (shown in hover text, tables, the glossary).
        shape: dimension names of the stored values (``"layer head"``; ``""`` for a scalar).
        result: the result class that carries it (``"SpectralSignature"``).
        section: its section on the definitions page, a key of :data:`SECTIONS` (``"spectral"``).
        paper: where the paper defines it (``"D'Elia (2026), sec. 4.3"``), or ``""`` when it is
            a thermo-lens addition.
        unit: what the numbers measure (``"weight norm"``, ``"ratio"``, ...).
        frame: method of ``result`` whose frame has the column (``"to_frame"``).
        frame_kwargs: keyword arguments of that method (``{"per": "kv_head"}``).
        column: the column name in that frame (default ``name``).
        attr: dotted path of the values on the result (default ``name``; dict keys and frame
            columns allowed: ``"summaries.last_block_gain.values"``).
        row: the column in :meth:`ThermoProfile.to_row` (one number per model), or None.
        summary_table: shown in the report's per-model summary table.
        panel: shown in the per-head table of :func:`thermo_lens.views.attention_panel`.
        weights: the weights a weight-based metric reads (``("W_V", "W_O")``).
        compute: for weight-based per-head / per-KV-head metrics, ``compute(w: HeadWeights)``.
    """

    name: str
    symbol: str
    formula: str
    shape: str
    result: str
    section: str
    paper: str = ""
    unit: str = ""
    frame: str = "to_frame"
    frame_kwargs: dict[str, Any] = field(default_factory=dict)
    column: str | None = None
    attr: str | None = None
    row: str | None = None
    summary_table: bool = False
    panel: bool = False
    weights: tuple[str, ...] = ()
    compute: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    @property
    def reference(self) -> str:
        """Where the definition is written: the definitions page section and the paper's."""
        number, _, title = SECTIONS[self.section].partition(". ")
        ref = f"thermo_lens.definitions §{number} ({title})"
        return f"{ref}; {self.paper}" if self.paper else ref

    @property
    def frame_column(self) -> str:
        return self.column or self.name

    @property
    def dims(self) -> tuple[str, ...]:
        return tuple(self.shape.split())

    def values(self, result: Any) -> Any:
        """This metric's values on ``result`` (an instance of :attr:`result`, or a ThermoProfile
        holding one), following :attr:`attr`."""
        obj = carrier(result, self.result)
        for part in (self.attr or self.name).split("."):
            if isinstance(obj, dict) or hasattr(obj, "columns"):
                obj = obj[part]
            else:
                obj = getattr(obj, part)
        return obj


def carrier(obj: Any, result: str) -> Any:
    """``obj`` itself if it is a ``result`` instance, else the field of ``obj`` (a ThermoProfile)
    that holds one."""
    if type(obj).__name__ == result:
        return obj
    for value in getattr(obj, "__dict__", {}).values():
        if type(value).__name__ == result:
            return value
    raise TypeError(f"{type(obj).__name__} holds no {result}")


_METRICS: dict[str, Metric] = {}
_loaded = False


def register_metric(metric: Metric) -> Metric:
    """Add ``metric`` to the registry (its name must be new); returns it."""
    if metric.name in _METRICS:
        raise ValueError(f"metric {metric.name!r} is already registered")
    if metric.section not in SECTIONS:
        raise ValueError(f"metric {metric.name!r}: unknown section {metric.section!r}; one of {list(SECTIONS)}")
    if metric.shape not in SHAPES:
        raise ValueError(f"metric {metric.name!r}: unknown shape {metric.shape!r}; one of {SHAPES}")
    _METRICS[metric.name] = metric
    return metric


def register_head_metric(metric: Metric) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register a weight-based metric with the function that computes it.

    The function takes a :class:`~thermo_lens.spectral.HeadWeights` (a chunk of layers) and returns
    a ``[layer, head]`` (or ``[layer, kv_head]``) tensor; ``metric.shape`` says which.
    """
    if metric.shape not in ("layer head", "layer kv_head"):
        raise ValueError(f"head metric {metric.name!r} must have shape 'layer head' or 'layer kv_head'")

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        register_metric(Metric(**{**metric.__dict__, "compute": fn}))
        return fn

    return wrap


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in _PROVIDERS:
            importlib.import_module(mod)


def get(name: str) -> Metric:
    """The registered metric called ``name``."""
    _load()
    try:
        return _METRICS[name]
    except KeyError:
        raise KeyError(f"no metric {name!r}; registered: {', '.join(_METRICS)}") from None


def metrics(*, result: str | None = None, shape: str | None = None, computed: bool | None = None,
            load: bool = True) -> tuple[Metric, ...]:
    """Registered metrics in registration order, optionally filtered.

    Args:
        result: only those carried by this result class (``"SpectralSignature"``).
        shape: only this shape (``"layer head"``).
        computed: only weight-based metrics with a compute function (True) or only the others.
        load: import every providing module first (False: only what is registered so far, used by
            the providing modules themselves while they load).
    """
    if load:
        _load()
    chosen = [
        m for m in _METRICS.values()
        if (result is None or m.result == result) and (shape is None or m.shape == shape)
        and (computed is None or (m.compute is not None) == computed)
    ]
    # A fixed order whatever the import order: by result (the data flow), then as registered.
    order = {name: i for i, name in enumerate(RESULT_ORDER)}
    return tuple(sorted(chosen, key=lambda m: order.get(m.result, len(order))))


def definitions(**filters: Any) -> dict[str, str]:
    """``{name: formula}`` of the registered metrics (filters as in :func:`metrics`)."""
    return {m.name: m.formula for m in metrics(**filters)}
