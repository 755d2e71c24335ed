"""The registries: one entry per metric and one per measurement, the single source of each.

**Metrics** (:class:`Metric`) are the numbers: name, symbol, formula, shape, unit, reference.
**Measurements** (:class:`Measurement`) are what produces them: classes registered by type (as
SAELens registers its SAE classes with their config dataclasses), each with a frozen
:class:`Options` dataclass checked once when made, its result class, its in-pass reductions, the
pure method that builds its result from a pass, and its per-prompt :class:`Readout` s
(``block_gain:<layer>``, ``write_norm:<layer>.<head>`` ...); a weight measurement (the spectral
signature) needs no pass. :func:`thermo_lens.run` runs any set of measurements in one forward pass;
:func:`thermo_lens.measures.profile` runs those marked ``in_profile`` (or those named); paired differences
compare their per-prompt metrics; sweeps measure their readouts; the report's sections, its
glossary, the summary rows and the definitions page iterate over both registries. Adding a
measurement is one module (its reductions, result class, metrics and measurement class,
registered at import) plus one line in :data:`_PROVIDERS`; one defined outside the package
registers the same way (:func:`register_measurement`).

Every number thermo-lens reports is registered here once, by the module that computes it, with
its name (the attribute / frame column), a short symbol, the formula in words, its shape, unit
and reference (a section of the definitions page, :mod:`thermo_lens.definitions`, and the paper's section
where the paper defines it). Results, frames (``to_frame`` / ``to_row``), hover text, panels, the
report glossary and the definitions page all iterate over the registry, so a metric is defined in
one place.

A weight-based per-head metric also registers the function that computes it from a
:class:`~thermo_lens.measures.spectral.HeadWeights` accessor (cached per-head weights, Gram matrices and their square-root factors)::

    @register_head_metric(Metric("qk_norm", symbol="||W_Q W_K^T||_2", ...))
    def qk_norm(w: HeadWeights) -> Float[Tensor, "layer head"]:
        return torch.linalg.svdvals(w.R_Q @ w.R_K[:, w.kv_head_of].mT)[..., 0]

and :func:`thermo_lens.spectral_signature` computes it for every layer and head, with the
definition carried everywhere. (In the style of SAELens' ``registry.py``.)
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, ClassVar, Generic, Literal, Mapping, TypeVar, get_args, get_origin

from thermo_lens.core.errors import ThermoLensInputError

__all__ = ["Metric", "register_metric", "register_head_metric", "get", "metrics", "definitions", "SECTIONS",
           "Options", "option", "Measurement", "BuildContext", "register_measurement", "unregister_measurement",
           "measurement", "measurements", "measurement_of", "Readout", "Probe", "readouts", "readout",
           "carrier", "register_result_type", "result_type"]

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
    "thermo_lens.measures.gain",
    "thermo_lens.measures.anisotropy",
    "thermo_lens.measures.spectral",
    "thermo_lens.measures.sheaf.traces",
    "thermo_lens.measures.depth",
    "thermo_lens.measures.attribution",
    "thermo_lens.measures.write_norm",
    "thermo_lens.measures.ablation",
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

    def values(self, result: object) -> Any:
        """This metric's values on ``result`` (an instance of :attr:`result`, or a ThermoProfile
        holding one), following :attr:`attr`."""
        obj = carrier(result, self.result)
        for part in (self.attr or self.name).split("."):
            # a dict key or a frame column, else an attribute
            obj = _item(obj, part) if isinstance(obj, dict) or hasattr(obj, "columns") else getattr(obj, part)
        return obj

    def row_value(self, result: object) -> float:
        """The one number per model of :attr:`row` (:attr:`row_reduce` of the values)."""
        values = self.values(result)
        if self.row_reduce is not None:
            return float(self.row_reduce(values))
        import numpy as np

        arr = np.asarray(values.detach().double().cpu() if hasattr(values, "detach") else values, dtype=np.float64)
        finite = arr[np.isfinite(arr)]
        return float(finite.mean()) if finite.size else float("nan")


def _item(obj: object, key: str) -> object:
    """``obj[key]`` of a dict or a frame (a column)."""
    getter: Callable[[str], object] | None = getattr(obj, "__getitem__", None)
    if getter is None:
        raise TypeError(f"{type(obj).__name__} has no items")
    return getter(key)


def carrier(obj: object, result: str | type) -> object:
    """``obj`` itself if it is a ``result`` instance, else the result of that class that ``obj``
    (a ThermoProfile, :class:`thermo_lens.core.measure.Measurements`) holds. ``result``: the class, or
    the name a metric gives (resolved to its class by :func:`result_type`); matched by type
    (``isinstance``), never by a class's name."""
    cls = result if isinstance(result, type) else result_type(result)
    if cls is None:
        raise TypeError(f"no result class {result!r} is registered (a thermo_lens.core.result.Result subclass)")
    if isinstance(obj, cls):
        return obj
    held = getattr(obj, "results", None)
    values = list(held.values()) if isinstance(held, dict) else list(getattr(obj, "__dict__", {}).values())
    for value in values:
        if isinstance(value, cls):
            return value
    raise TypeError(f"{type(obj).__name__} holds no {cls.__name__}")


#: Result class name -> class: every :class:`thermo_lens.core.result.Result` subclass registers
#: itself here when it is defined (the name is what stored JSON and a :class:`Metric` write).
_RESULT_TYPES: dict[str, type] = {}


def register_result_type(cls: type) -> type:
    """Record the result class ``cls`` under its name (``Result.__init_subclass__`` calls it; a
    class of the same name defined again, as a notebook cell re-run does, replaces it)."""
    _RESULT_TYPES[cls.__name__] = cls
    return cls


def result_type(name: str) -> type | None:
    """The result class called ``name``: the result of a registered measurement, else a registered
    result class (None: no such class)."""
    made = next((m.result for m in _MEASUREMENTS.values() if m.result.__name__ == name), None)
    return made if made is not None else _RESULT_TYPES.get(name)


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

    The function takes a :class:`~thermo_lens.measures.spectral.HeadWeights` (a chunk of layers) and returns
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


def metrics(*, result: str | type | None = None, shape: str | None = None, computed: bool | None = None,
            load: bool = True) -> tuple[Metric, ...]:
    """Registered metrics in registration order, optionally filtered.

    Args:
        result: only those carried by this result class: the class itself (matched by type: the
            metric's result name resolves to that very class, :func:`result_type`), or its name
            (``"SpectralSignature"``).
        shape: only this shape (``"layer head"``).
        computed: only weight-based metrics with a compute function (True) or only the others.
        load: import every providing module first (False: only what is registered so far, used by
            the providing modules themselves while they load).
    """
    if load:
        _load()
    def carried(m: Metric) -> bool:
        if isinstance(result, type):
            return m.result == result.__name__ and result_type(m.result) is result
        return result is None or m.result == result

    chosen = [
        m for m in _METRICS.values()
        if carried(m) and (shape is None or m.shape == shape)
        and (computed is None or (m.compute is not None) == computed)
    ]
    # A fixed order whatever the import order: by the measurement that produces the result (the
    # providers' order, i.e. the data flow), results of no measurement last; then as registered.
    order = {m.result.__name__: i for i, m in enumerate(measurements(load=False))}
    return tuple(sorted(chosen, key=lambda m: order.get(m.result, len(order))))


def definitions(*, result: str | type | None = None, shape: str | None = None,
                computed: bool | None = None) -> dict[str, str]:
    """``{name: formula}`` of the registered metrics (filters as in :func:`metrics`)."""
    return {m.name: m.formula for m in metrics(result=result, shape=shape, computed=computed)}


# ---------------------------------------------------------------------------- measurements
T = TypeVar("T")


def option(default: T, doc: str, check: Callable[[Any], object] | None = None) -> T:
    """A field of a measurement's :class:`Options`: its default, what it means (listed in errors and
    the docs) and, where its annotation does not say enough, the function that checks a given value
    and returns it normalised (raising :class:`~thermo_lens.core.errors.ThermoLensInputError`)."""
    return field(default=default, metadata={"doc": doc, "check": check})


def _check_by_annotation(owner: str, name: str, value: object, hint: object) -> object:
    """``value`` checked against a field's annotation: one of a ``Literal``'s values, or a bool."""
    if get_origin(hint) is Literal:
        allowed = get_args(hint)
        if any(value == a and type(value) is type(a) for a in allowed):
            return value
        raise ThermoLensInputError(f"{owner}: {name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    if hint is bool:
        if type(value).__name__ not in ("bool", "bool_"):
            raise ThermoLensInputError(f"{owner}: {name} must be True or False, got {value!r}")
        return bool(value)
    return value


def _field_types(cls: type) -> dict[str, Any]:
    """The evaluated annotations of a dataclass's fields (``typing.get_type_hints`` answers nothing
    for a class marked ``__no_type_check__``, as :class:`Options` is)."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        module = sys.modules.get(klass.__module__)
        names = {**(vars(module) if module is not None else {}), **vars(klass)}
        for k, v in klass.__dict__.get("__annotations__", {}).items():
            out[k] = eval(v, names) if isinstance(v, str) else v  # noqa: S307 - the class's own source text
    return out


@dataclass(frozen=True)
class Options:
    """The options of a measurement: a frozen dataclass, every field checked once when it is made.

    A subclass declares its fields with :func:`option` (default, doc, optional check); a field
    with no check is checked against its annotation (a ``Literal``'s values, a bool). Made by
    :meth:`Measurement.make_options`, which refuses an unknown option by name.
    """

    # The fields are checked here, each with its own message (what was wrong, what to do); a
    # runtime type checker (jaxtyping's import hook under the tests) would pre-empt those messages.
    __no_type_check__: ClassVar[bool] = True

    def __post_init__(self) -> None:
        hints = _field_types(type(self))
        for f in fields(self):
            value = getattr(self, f.name)
            check = f.metadata.get("check")
            value = check(value) if check is not None else _check_by_annotation(
                type(self).__qualname__, f.name, value, hints.get(f.name))
            object.__setattr__(self, f.name, value)

    @classmethod
    def docs(cls) -> dict[str, str]:
        """``{option: what it means}``."""
        return {f.name: str(f.metadata.get("doc", "")) for f in fields(cls)}

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class BuildContext:
    """What a measurement's ``build`` gets: the pass (``collected``, None for weight
    measurements), the model view, and the results already built in the same run (for
    measurements derived from others, e.g. L* from the sheaf traces)."""

    collected: Any
    view: Any
    results: dict[str, Any]


_Options = Options
OptionsT = TypeVar("OptionsT", bound=Options)


class Measurement(Generic[OptionsT]):
    """One measurement: a class registered by type (:func:`register_measurement`), made with its
    checked :class:`Options` (``Gain(token_scope="last")``, ``Gain.make_options({...})``).

    Class attributes:
        name: its name in :func:`thermo_lens.run`, profiles (``profile.gain``) and reports.
        title: a human heading (report section, glossary).
        summary: one sentence: what it measures.
        result: its result class (:class:`~thermo_lens.measures.gain.GainResult`); the metrics registered
            for that class are this measurement's metrics.
        section: its section of the definitions page (a key of :data:`SECTIONS`).
        Options: its frozen options dataclass (a subclass of :class:`Options`).
        readouts: its per-prompt scalars (:class:`Readout`), named as in sweeps
            (``"write_norm:<layer>.<head>"``).
        needs: measurements whose results ``build`` reads (built first, in the same pass).
        needs_pass: False for a measurement that needs no forward pass of its own (from the
            weights, or from another measurement's result).
        in_profile: part of :func:`thermo_lens.measures.profile`'s battery.
        optional: in a profile, a failure of this measurement is recorded (with a warning) and the
            other results kept.

    Methods a subclass defines: :meth:`build` (the result from one pass: pure), and where it
    runs in the pass :meth:`reductions`; :meth:`min_tokens` and :meth:`applies` as needed.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    summary: ClassVar[str]
    result: ClassVar[type]
    section: ClassVar[str]
    Options: ClassVar[type[_Options]] = _Options
    readouts: ClassVar[tuple["Readout", ...]] = ()
    needs: ClassVar[tuple[str, ...]] = ()
    needs_pass: ClassVar[bool] = True
    in_profile: ClassVar[bool] = True
    optional: ClassVar[bool] = False

    def __init__(self, options: OptionsT | None = None, /, **given: object) -> None:
        if options is not None and (given or not isinstance(options, self.Options)):
            raise ThermoLensInputError(f"measurement {self.name!r} takes its {self.Options.__qualname__} or "
                                       "options by keyword, not both")
        self.options: OptionsT = options if options is not None else self.make_options(given)  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options})"

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls.Options))

    @classmethod
    def option_values(cls, name: str) -> tuple[Any, ...] | None:
        """The values option ``name`` may take where its annotation is a ``Literal`` (None else)."""
        hint = _field_types(cls.Options).get(name)
        return get_args(hint) if get_origin(hint) is Literal else None

    @classmethod
    def takes(cls, option: str) -> bool:
        """Whether it has an option called ``option`` (``"token_scope"``)."""
        return option in cls.option_names()

    @classmethod
    def make_options(cls, given: Mapping[str, Any]) -> _Options:
        """Its :class:`Options` from ``given`` over the defaults, checked; an unknown option raises."""
        unknown = sorted(set(given) - set(cls.option_names()))
        if unknown:
            known = ", ".join(cls.option_names()) or "none"
            raise ThermoLensInputError(
                f"measurement {cls.name!r} has no option(s) {', '.join(map(repr, unknown))}; its options: {known}")
        return cls.Options(**given)

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every option's value: ``given`` (checked) over the defaults, as a dict."""
        return cls.make_options(given).as_dict()

    @classmethod
    def applies(cls, view: Any) -> str | None:
        """None, or why this measurement has no exact definition on this model (a profile records
        the reason instead of the result; :func:`thermo_lens.run` raises it)."""
        return None

    @classmethod
    def metric_list(cls) -> tuple[Metric, ...]:
        """The registered metrics of this measurement's result."""
        return metrics(result=cls.result)

    def reductions(self) -> list[Any]:
        """The in-pass reductions to register (functions ``(view, recorder) -> None``)."""
        return []

    def min_tokens(self) -> int:
        """The fewest real tokens a prompt needs: 2 where the token scope drops position 0."""
        return 2 if self.needs_pass and getattr(self.options, "token_scope", None) == "all_but_first" else 1

    def build(self, ctx: BuildContext) -> Any:
        """The result from one pass (pure: no forward pass)."""
        raise NotImplementedError(f"{type(self).__name__}.build")


_MEASUREMENTS: dict[str, type[Measurement]] = {}


def register_measurement(cls: type[Measurement]) -> type[Measurement]:
    """Class decorator: add the measurement ``cls`` to the registry (its name must be new, its
    result a class); returns it. Works the same from outside the package."""
    if not (isinstance(cls, type) and issubclass(cls, Measurement)):
        raise TypeError(f"register_measurement takes a Measurement subclass, got {cls!r}")
    for attr in ("name", "title", "summary", "result", "section"):
        if not hasattr(cls, attr):
            raise ValueError(f"measurement {cls.__name__} declares no {attr}")
    if cls.name in _MEASUREMENTS and _MEASUREMENTS[cls.name] is not cls:
        raise ValueError(f"measurement {cls.name!r} is already registered")
    if cls.section not in SECTIONS:
        raise ValueError(f"measurement {cls.name!r}: unknown section {cls.section!r}; one of {list(SECTIONS)}")
    if not isinstance(cls.result, type):
        raise TypeError(f"measurement {cls.name!r}: result must be its result class, got {cls.result!r}")
    if not (isinstance(cls.Options, type) and issubclass(cls.Options, Options)):
        raise TypeError(f"measurement {cls.name!r}: Options must subclass thermo_lens.core.registry.Options")
    cls.readouts = tuple(replace(r, measurement_name=cls.name) for r in cls.readouts)
    for r in cls.readouts:
        taken = next((m for m in _MEASUREMENTS.values() if m.name != cls.name
                      for o in m.readouts if o.name == r.name), None)
        if taken is not None:
            raise ValueError(f"measurement {cls.name!r}: readout {r.name!r} is already {taken.name!r}'s")
    _MEASUREMENTS[cls.name] = cls
    return cls


def unregister_measurement(name: str) -> None:
    """Remove a measurement registered under ``name`` (for tests and notebooks re-running a cell)."""
    _MEASUREMENTS.pop(name, None)


def measurement(name: str) -> type[Measurement]:
    """The registered measurement called ``name`` (the error lists them)."""
    _load()
    try:
        return _MEASUREMENTS[name]
    except (KeyError, TypeError):
        raise ThermoLensInputError(
            f"no measurement {name!r}; registered: {', '.join(_MEASUREMENTS)}") from None


def measurements(*, in_profile: bool | None = None, load: bool = True) -> tuple[type[Measurement], ...]:
    """Registered measurements in registration order (dependencies first)."""
    if load:
        _load()
    chosen = [m for m in _MEASUREMENTS.values() if in_profile is None or m.in_profile == in_profile]
    # A fixed order whatever the import order: the providers' order (dependencies first), then as
    # registered.
    def rank(m: type[Measurement]) -> int:  # a provider package's submodules rank as the package
        module = str(m.__module__)
        return next((i for i, p in enumerate(_PROVIDERS) if module == p or module.startswith(p + ".")),
                    len(_PROVIDERS))

    return tuple(sorted(chosen, key=rank))


def measurement_of(result: object) -> type[Measurement] | None:
    """The registered measurement whose result class ``result`` (a class or an instance) is."""
    cls = result if isinstance(result, type) else type(result)
    return next((m for m in measurements() if issubclass(cls, m.result)), None)


# ---------------------------------------------------------------------------- readouts
@dataclass(frozen=True)
class Readout:
    """A family of per-prompt scalars of a measurement, each named by filling ``pattern``:
    ``"write_norm:<layer>.<head>"`` -> ``"write_norm:3.1"``. Sweeps measure each condition with one
    (``patch_sweep(measure="write_norm:3.1")``).

    The default reads a measurement that records, per block ``l``, ``(key, l)`` as
    ``[batch, *rest]`` (``rest`` indexed by the placeholders after ``<layer>``): only block
    ``<layer>``'s hook points run. A measurement reading otherwise subclasses this and overrides
    :meth:`values` (and :meth:`keep`, :meth:`reductions`).

    Attributes:
        pattern: the name with its placeholders (``<layer>``, ``<head>``); none for one number
            per prompt (``"total_amplification"``).
        definition: what the number is.
        key: the recorder entries it reads (default: the name before ``:``).
        reads_next_state: it reads ``x_{layer+1}`` (the next block's input), so a condition at
            block ``layer + 1`` changes it.
        starts_at_block: a pass of a condition at a later block starts at block ``<layer>`` (it
            reads that block's components).
        carried: recorder entries, one per residual state, that a pass starting at block ``s``
            takes from the unpatched pass for the states before ``s``.
        scope: the tokens the number is over when not the measurement's ``token_scope``.
        measurement: the name of the measurement that declares it (set on registration).
    """

    pattern: str
    definition: str
    key: str | None = None
    reads_next_state: bool = False
    starts_at_block: bool = False
    carried: str | None = None
    scope: str | None = None
    measurement_name: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        return self.pattern.partition(":")[0]

    @property
    def placeholders(self) -> tuple[str, ...]:
        tail = self.pattern.partition(":")[2]
        return tuple(p.strip("<>") for p in tail.split(".")) if tail else ()

    def parse(self, text: str, n_layers: int, n_heads: int | None = None) -> "Probe":
        """The probe ``text`` names (``"write_norm:3.1"``; negative indices count from the end)."""
        tail = text.partition(":")[2].strip()
        parts = tail.split(".") if tail else []
        want = self.placeholders
        if len(parts) != len(want):
            example = f"{self.name}:" + ".".join("2" if p == "layer" else "0" for p in want) if want else self.name
            raise ThermoLensInputError(f"measure {text!r}: {self.name} takes {self.pattern!r}, e.g. {example!r}")
        idx: dict[str, int] = {}
        for place, part in zip(want, parts):
            size = {"layer": n_layers, "state": n_layers + 1}.get(place, n_heads)
            try:
                i = int(part)
            except ValueError:
                raise ThermoLensInputError(f"measure {text!r}: the {'block' if place == 'layer' else place} must be "
                                           f"an int, e.g. '{self.name}:" + ".".join(
                                               "2" if p == "layer" else "0" for p in want) + "'") from None
            if size is not None and not -size <= i < size:
                what = "block" if place == "layer" else place
                raise ThermoLensInputError(f"measure {text!r}: {what} {i} out of range 0..{size - 1}")
            idx[place] = i % size if size is not None else i
        label = self.name + (":" + ".".join(str(idx[p]) for p in want) if want else "")
        depth = next((p for p in want if p in ("layer", "state")), None)  # the block (or residual state) axis
        return Probe(self, label, None if depth is None else idx[depth], tuple(idx[p] for p in want if p != depth))

    # -- what a pass registers and reads (overridable)
    def reductions(self, m: Measurement) -> list[Any]:
        """The reductions a pass runs for it (those of ``m``, filtered by :meth:`keep`)."""
        return list(m.reductions())

    def keep(self, probe: "Probe", key: tuple[str, int]) -> bool:
        """Whether the pass records entry ``key`` (``(name, layer)``): only the probe's block's."""
        return probe.layer is None or key[1] == probe.layer

    def values(self, collected: Any, probe: "Probe", m: Measurement, row_name: Callable[[int], str]) -> Any:
        """``[row]`` float64: the readout of every row of a pass that ran its reductions."""
        got = collected.stack(self.key or self.name)[0].double()  # [row, *rest]
        for i in probe.index:
            got = got[:, i]
        return got

    def last_layer_read(self, probe: "Probe", n_layers: int) -> int:
        """The deepest block whose hook points it reads: a condition at a later block leaves it as
        it was without the condition."""
        if probe.layer is None:
            return n_layers - 1
        return min(probe.layer + 1 if self.reads_next_state else probe.layer, n_layers - 1)

    def start_layer(self, probe: "Probe", layer: int) -> int:
        """Where the pass of a condition at block ``layer`` starts."""
        return min(layer, probe.layer) if self.starts_at_block and probe.layer is not None else layer


@dataclass(frozen=True)
class Probe:
    """One readout at given indices (``"write_norm:3.1"``: ``layer`` 3, ``index`` ``(1,)``; ``layer``
    is the block, or the residual state of a ``<state>`` readout)."""

    readout: Readout
    label: str
    layer: int | None
    index: tuple[int, ...] = ()

    @property
    def definition(self) -> str:
        return self.readout.definition

    def measurement(self, token_scope: str | None = None) -> Measurement:
        """Its measurement, with the run's token scope where it takes one (checked there)."""
        cls = measurement(self.readout.measurement_name)
        given = {"token_scope": token_scope} if token_scope is not None and cls.takes("token_scope") else {}
        return cls(**given)


def readouts() -> dict[str, tuple[type[Measurement], Readout]]:
    """Every registered readout by pattern: ``{"block_gain:<layer>": (Gain, GainReadout(...)), ...}``."""
    return {r.pattern: (m, r) for m in measurements() for r in m.readouts}


def readout(text: object, n_layers: int, n_heads: int | None = None) -> Probe | None:
    """The probe ``text`` names (``"block_gain:3"``, ``"sheaf_trace:1.0"``), or None when no
    readout has its name (the part before ``:``)."""
    if not isinstance(text, str):
        return None
    name, _, tail = text.strip().partition(":")
    found = [r for _, r in readouts().values() if r.name == name]
    if not found:
        return None
    n = len(tail.split(".")) if tail.strip() else 0
    chosen = next((r for r in found if len(r.placeholders) == n), found[0])
    return chosen.parse(text.strip(), n_layers, n_heads)
