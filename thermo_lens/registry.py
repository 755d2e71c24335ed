"""The registries: one entry per metric and one per measurement, the single source of each.

**Metrics** (:class:`Metric`) are the numbers: name, symbol, formula, shape, unit, reference.
**Measurements** (:class:`Measurement`) are what produces them: an activation measurement declares
its in-pass reductions, the pure function that builds its result from a pass, its options and its
result class; a weight measurement (the spectral signature) needs no pass. :func:`thermo_lens.run`
runs any set of measurements in one forward pass; :func:`thermo_lens.profile` runs those marked
``in_profile``; the report's sections, its glossary, the summary rows and the definitions page
iterate over both registries. Adding a measurement is one module (its reductions, result class,
builder and metrics, registered at import) plus one line in :data:`_PROVIDERS`.

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

from thermo_lens.errors import ThermoLensInputError

__all__ = ["Metric", "register_metric", "register_head_metric", "get", "metrics", "definitions", "SECTIONS",
           "Option", "Measurement", "BuildContext", "register_measurement", "measurement", "measurements"]

#: Sections of the definitions page (``thermo_lens/definitions.md``, printed by
#: ``python -m thermo_lens.definitions``): key -> numbered title.
SECTIONS: dict[str, str] = {
    "gain": "1. Residual states and gain",
    "spectral": "2. Spectral signature",
    "sheaf": "3. Sheaf restriction maps and Laplacian",
    "l_star": "4. L*, the depth of maximal trace change",
    "laws": "5. Cross-model laws",
    "numerics": "6. Numerics and provenance",
    "layouts": "7. Block layouts",
}

# Modules that register metrics and measurements (the measures layer); imported on first full
# listing so the registries are complete. Views register their own figures' metrics when imported.
_PROVIDERS = (
    "thermo_lens.gain",
    "thermo_lens.anisotropy",
    "thermo_lens.spectral",
    "thermo_lens.sheaf.traces",
    "thermo_lens.depth",
    "thermo_lens.attribution",
    "thermo_lens.write_norm",
    "thermo_lens.ablation",
)


#: Shapes a metric can have (dimension names as in the jaxtyping annotations).
SHAPES = ("layer head", "layer kv_head", "layer", "prompt layer", "prompt state", "prompt",
          "prompt layer head", "prompt head", "head", "", "prompt layer expert", "prompt feature")


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
        row_reduce: how the values become that one number (default: the mean of every finite value).
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
    row_reduce: Callable[[Any], float] | None = field(default=None, compare=False, repr=False)
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

    def row_value(self, result: Any) -> float:
        """The one number per model of :attr:`row` (:attr:`row_reduce` of the values)."""
        values = self.values(result)
        if self.row_reduce is not None:
            return float(self.row_reduce(values))
        import numpy as np

        arr = np.asarray(values.detach().double().cpu() if hasattr(values, "detach") else values, dtype=np.float64)
        finite = arr[np.isfinite(arr)]
        return float(finite.mean()) if finite.size else float("nan")


def carrier(obj: Any, result: str) -> Any:
    """``obj`` itself if it is a ``result`` instance, else the result of that class that ``obj``
    (a ThermoProfile, :class:`thermo_lens.measure.Measurements`) holds."""
    if type(obj).__name__ == result:
        return obj
    held = getattr(obj, "results", None)
    values = list(held.values()) if isinstance(held, dict) else list(getattr(obj, "__dict__", {}).values())
    for value in values:
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
    # A fixed order whatever the import order: by the measurement that produces the result (the
    # providers' order, i.e. the data flow), results of no measurement last; then as registered.
    order = {m.result: i for i, m in enumerate(measurements(load=False))}
    return tuple(sorted(chosen, key=lambda m: order.get(m.result, len(order))))


def definitions(**filters: Any) -> dict[str, str]:
    """``{name: formula}`` of the registered metrics (filters as in :func:`metrics`)."""
    return {m.name: m.formula for m in metrics(**filters)}


# ---------------------------------------------------------------------------- measurements
@dataclass(frozen=True)
class Option:
    """One option of a measurement (e.g. ``token_scope``).

    Attributes:
        default: its value when not given.
        check: validates a given value and returns it normalised (raises
            :class:`~thermo_lens.errors.ThermoLensInputError` naming the option).
        doc: what it means (listed in errors and the docs).
    """

    default: Any
    check: Callable[[Any], Any]
    doc: str


@dataclass(frozen=True)
class BuildContext:
    """What a measurement's ``build`` gets: the pass (``collected``, None for weight
    measurements), the model view, and the results already built in the same run (for
    measurements derived from others, e.g. L* from the sheaf traces)."""

    collected: Any
    view: Any
    results: dict[str, Any]


@dataclass(frozen=True)
class Measurement:
    """One measurement: how it is computed in a pass and what it returns.

    Attributes:
        name: its name in :func:`thermo_lens.run`, profiles (``profile.gain``) and reports.
        title: a human heading (report section, glossary).
        summary: one sentence: what it measures.
        result: the name of its result class (``"GainResult"``); the metrics registered for that
            result are this measurement's metrics.
        section: its section of the definitions page (a key of :data:`SECTIONS`).
        options: option name -> :class:`Option` (``token_scope`` is shared by every measurement
            that declares it).
        reductions: ``reductions(**options)`` -> the in-pass reductions to register (functions
            ``(view, recorder) -> None``); None for a measurement that needs no forward pass.
        build: ``build(ctx: BuildContext, **options)`` -> the result (pure: no forward pass).
        min_tokens: ``min_tokens(**options)`` -> the fewest real tokens a prompt needs.
        applies: ``applies(view)`` -> None, or why this measurement has no exact definition on
            this model (a profile records the reason instead of the result; :func:`thermo_lens.run`
            raises it).
        needs: measurements whose results ``build`` reads (built first, in the same pass).
        in_profile: part of :func:`thermo_lens.profile`'s battery.
        optional: in a profile, a failure of this measurement is recorded (with a warning) and the
            other results kept.
    """

    name: str
    title: str
    summary: str
    result: str
    section: str
    build: Callable[..., Any]
    options: dict[str, Option] = field(default_factory=dict)
    reductions: Callable[..., Any] | None = None
    min_tokens: Callable[..., int] = field(default=lambda **options: 1)
    applies: Callable[[Any], str | None] = field(default=lambda view: None)
    needs: tuple[str, ...] = ()
    in_profile: bool = True
    optional: bool = False

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Every option's value: ``given`` (checked) over the defaults; an unknown option raises."""
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            known = ", ".join(self.options) or "none"
            raise ThermoLensInputError(
                f"measurement {self.name!r} has no option(s) {', '.join(map(repr, unknown))}; its options: {known}")
        return {k: (o.check(given[k]) if k in given else o.default) for k, o in self.options.items()}

    @property
    def metrics(self) -> tuple[Metric, ...]:
        """The registered metrics of this measurement's result."""
        return metrics(result=self.result)


_MEASUREMENTS: dict[str, Measurement] = {}


def register_measurement(m: Measurement) -> Measurement:
    """Add ``m`` to the registry (its name must be new); returns it."""
    if m.name in _MEASUREMENTS:
        raise ValueError(f"measurement {m.name!r} is already registered")
    if m.section not in SECTIONS:
        raise ValueError(f"measurement {m.name!r}: unknown section {m.section!r}; one of {list(SECTIONS)}")
    _MEASUREMENTS[m.name] = m
    return m


def measurement(name: str) -> Measurement:
    """The registered measurement called ``name`` (the error lists them)."""
    _load()
    try:
        return _MEASUREMENTS[name]
    except (KeyError, TypeError):
        raise ThermoLensInputError(
            f"no measurement {name!r}; registered: {', '.join(_MEASUREMENTS)}") from None


def measurements(*, in_profile: bool | None = None, load: bool = True) -> tuple[Measurement, ...]:
    """Registered measurements in registration order (dependencies first)."""
    if load:
        _load()
    chosen = [m for m in _MEASUREMENTS.values() if in_profile is None or m.in_profile == in_profile]
    # A fixed order whatever the import order: the providers' order (dependencies first), then as
    # registered.
    def rank(m: Measurement) -> int:  # a provider package's submodules rank as the package
        module = str(getattr(m.build, "__module__", ""))
        return next((i for i, p in enumerate(_PROVIDERS) if module == p or module.startswith(p + ".")),
                    len(_PROVIDERS))

    return tuple(sorted(chosen, key=rank))
