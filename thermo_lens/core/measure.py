"""The public forward pass: any set of measurements from one pass per batch.

::

    import thermo_lens as tl

    res = tl.run(model, prompts, ["gain", "attribution", "write_norm"], token_scope="last")
    res.gain                      # GainResult
    res["attribution"]            # GainAttribution
    res = tl.run(model, prompts, {"gain": {"per_token": True}, "sheaf": {}}, fwd_hooks=ablate)

    tokens = model.to_tokens(prompts)                     # from a cache you already have:
    _, cache = model.run_with_cache(tokens)               # no second forward pass
    res = tl.run(model, tokens, ["gain", "attribution"], cache=cache)

Each measurement (:func:`thermo_lens.core.registry.measurements`) registers its in-pass reductions on
one :class:`~thermo_lens.core.passes.Recorder`; the prompts run once, in padded batches, with your
hooks first (:mod:`thermo_lens.core.passes`); then every result is built from that one pass. The
simple entry points (:func:`thermo_lens.residual_gain`, :func:`thermo_lens.gain_attribution` ...)
are one-measurement uses of the same pass, and :func:`thermo_lens.measures.profile` runs the whole battery.

With ``cache=`` (the ``ActivationCache`` of ``model.run_with_cache`` on the same tokens, passed as
the prompts), no forward pass runs: the cached activations are replayed through the same reductions
in forward order (:func:`thermo_lens.core.passes.collect_cached`), so the numbers are the pass's.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from thermo_lens.core import registry
from thermo_lens.core.errors import PromptTooShortError, ThermoLensInputError, ThermoLensWarning
from thermo_lens.core.inputs import Prompts, as_model_prompts
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.core.passes import Collected, Reduction, collect, collect_cached
from thermo_lens.core.passes.cached import documents_cache
from thermo_lens.core.result import Result
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.core.tokens import check_token_scope
from thermo_lens.core.validate import validates_own_inputs

if TYPE_CHECKING:
    from torch import Tensor
    from transformer_lens import ActivationCache

    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["Measurements", "run", "run_measurements", "MeasureRequest"]

#: What ``measures=`` accepts: a measurement name, a list of names, or ``{name: {option: value}}``.
MeasureRequest = str | Sequence[str] | Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, repr=False, eq=False)
class Measurements(Result):
    """The results of one pass: measurement name -> result.

    Attributes:
        results: ``{name: result}`` in the registry's order (``"gain"`` -> :class:`GainResult` ...);
            also readable as ``res.gain`` / ``res["gain"]``.
        skipped: ``{name: why}`` for measurements that have no exact definition on this model
            (only when asked to skip them, as :func:`thermo_lens.measures.profile` does).
        options: ``{name: {option: value}}`` every option each measurement ran with.
    """

    results: dict[str, Result]
    skipped: dict[str, str] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    # Any: the result's class depends on the name (a GainResult for "gain" ...), which the core
    # layer cannot name without importing the measures above it.
    def __getitem__(self, name: str) -> Any:
        if name not in self.results:
            why = f" ({self.skipped[name]})" if name in self.skipped else ""
            raise KeyError(f"no {name!r} in this run{why}; it holds {', '.join(self.results) or 'nothing'}")
        return self.results[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("results", "skipped", "options"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(e.args[0]) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __contains__(self, name: object) -> bool:
        return name in self.results

    def __repr__(self) -> str:
        lines = [f"Measurements({', '.join(self.results)})"]
        for name, res in self.results.items():
            lines += ["", f"[{name}]", repr(res)]
        lines += [f"[{name}] skipped: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def _requests(measures: object) -> dict[str, dict[str, Any]]:
    """``{name: options}`` from a name, a list of names or a ``{name: {option: value}}`` mapping."""
    if isinstance(measures, str):
        return {measures: {}}
    if isinstance(measures, Mapping):
        out: dict[str, dict[str, Any]] = {}
        for k, v in measures.items():
            if v is not None and not isinstance(v, Mapping):
                raise ThermoLensInputError(
                    f"measures[{k!r}] must be a dict of options (e.g. {{'token_scope': 'last'}}), got {type(v).__name__}")
            out[str(k)] = dict(v or {})
        return out
    if isinstance(measures, (set, frozenset)):
        raise ThermoLensInputError("measures given as a set has no order; pass a list of names")
    try:
        if not isinstance(measures, Iterable):
            raise TypeError
        names = list(measures)
    except TypeError:
        raise ThermoLensInputError(
            f"measures must be a name, a list of names or {{name: {{option: value}}}}, got {type(measures).__name__}"
        ) from None
    out = {}
    for n in names:
        if not isinstance(n, str):
            raise ThermoLensInputError(f"measures: each entry must be a measurement name, got {n!r}")
        if n in out:
            raise ThermoLensInputError(f"measures: {n!r} is listed twice")
        out[n] = {}
    return out


def _with_needs(requests: dict[str, dict[str, Any]]) -> dict[str, type[registry.Measurement]]:
    """The measurements to run, dependencies first (a needed one runs with its defaults)."""
    chosen: dict[str, type[registry.Measurement]] = {}

    def add(name: str) -> None:
        m = registry.measurement(name)
        for dep in m.needs:
            if dep not in chosen:
                add(dep)
        chosen.setdefault(name, m)

    for name in requests:
        add(name)
    return chosen


def run_measurements(
    view: ModelView,
    prompts: Prompts,
    requests: dict[str, dict[str, Any]],
    settings: RunSettings,
    *,
    shared: Mapping[str, Any] | None = None,
    skip_inapplicable: bool = False,
    cache: object = None,
) -> tuple[Measurements, Collected | None]:
    """The engine of :func:`run` and :func:`thermo_lens.measures.profile`: ``(Measurements, collected)``.

    ``shared`` options (e.g. ``token_scope``) apply to every measurement that declares them,
    unless its own request sets them. With ``skip_inapplicable``, a measurement whose
    ``applies(view)`` gives a reason is recorded in ``skipped`` instead of raising, and an
    ``optional`` one whose build fails is recorded with a warning. With ``cache`` (an
    ``ActivationCache``), the reductions read it instead of running the model
    (:func:`thermo_lens.core.passes.collect_cached`).
    """
    chosen = _with_needs(requests)
    made: dict[str, registry.Measurement] = {}
    skipped: dict[str, str] = {}
    for name, cls in chosen.items():
        given = {k: v for k, v in (shared or {}).items() if cls.takes(k) and v is not None}
        given.update(requests.get(name, {}))
        made[name] = cls(cls.make_options(given))  # every option checked here, once
        why = cls.applies(view)
        if why is not None or any(dep in skipped for dep in cls.needs):
            why = why or f"needs {', '.join(d for d in cls.needs if d in skipped)}, which was skipped"
            if not skip_inapplicable:
                raise ThermoLensInputError(f"{view.name}: {name} cannot be measured: {why}")
            skipped[name] = why
    active = {n: m for n, m in made.items() if n not in skipped}
    reductions: list[Reduction] = []
    for m in active.values():
        if m.needs_pass:
            for r in m.reductions():
                if r not in reductions:  # two measurements sharing one reduction register it once
                    reductions.append(r)
    collected = None
    if reductions:
        need = max((m.min_tokens() for m in active.values() if m.needs_pass), default=1)
        try:
            if cache is not None:
                collected = collect_cached(view, prompts, cache, reductions, settings, min_tokens=need)
            else:
                collected = collect(view, prompts, reductions, settings, min_tokens=need)
        except PromptTooShortError as e:
            scoped = [n for n, m in active.items() if getattr(m.options, "token_scope", None) == "all_but_first"]
            if need == 2 and scoped:
                raise PromptTooShortError(
                    f"{e} token_scope='all_but_first' ({', '.join(scoped)}) excludes position 0, so every prompt "
                    "needs 2 tokens: pass prepend_bos=True (adds a BOS token) or use token_scope='last', 'all' "
                    "or 'frobenius'.") from None
            raise
    results: dict[str, Result] = {}
    for name, m in active.items():
        ctx = registry.BuildContext(collected=collected, view=view, results=results)
        try:
            results[name] = m.build(ctx)
        except ThermoLensInputError as e:
            if not (skip_inapplicable and m.optional):
                raise
            skipped[name] = str(e)
            warnings.warn(f"{view.name}: {m.title.lower()} skipped: {e}", ThermoLensWarning, stacklevel=3)
    kept = {n: made[n].options.as_dict() for n in results}
    return Measurements(results=results, skipped=skipped, options=kept), collected


@documents_cache
@validates_own_inputs
def run(
    model: TransformerLensModel | ModelView,
    prompts: Prompts,
    measures: MeasureRequest = ("gain",),
    *,
    token_scope: str | None = None,
    settings: RunSettings | Mapping[str, Any] | None = None,
    cache: ActivationCache | Mapping[str, Tensor] | None = None,
    **run_options: Unpack[RunOptions],
) -> Measurements:
    """Measure ``model`` on ``prompts``: every requested measurement from one forward pass per batch.

    Args:
        model: a TransformerLens model (``TransformerBridge``, ``HookedTransformer``,
            ``HookedSAETransformer``) or a :class:`~thermo_lens.core.model.ModelView`.
        prompts: anything :data:`thermo_lens.core.inputs.Prompts` describes (strings, a set name,
            ``{category: [...]}``, token ids).
        measures: a measurement name, a list of names, or ``{name: {option: value}}``; the names
            are those of :func:`thermo_lens.core.registry.measurements` (``"gain"``, ``"anisotropy"``,
            ``"sheaf"``, ``"attribution"``, ``"write_norm"``, ``"spectral"``, ``"l_star"``).
            Default ``("gain",)``.
        token_scope: the token scope of every measurement that takes one (``None``: each one's own
            default); a measurement's own options win.
        settings, **run_options: run options (:class:`thermo_lens.RunSettings`: ``prepend_bos``,
            ``batch_size``, ``truncate``, ``fwd_hooks``, ``progress``, ``sort_by_length``).
        cache: <CACHE_DOC>

    Returns:
        :class:`Measurements` (``res.gain``, ``res["attribution"]``).

    Raises:
        ThermoLensInputError: an unknown measurement or option, or a measurement with no exact
            definition on this model (the message says why).
    """
    view = as_view(model)
    run_settings = RunSettings.resolve(settings, **run_options)
    requests = _requests(measures)
    if not requests:
        raise ThermoLensInputError("measures is empty; name at least one measurement (e.g. 'gain')")
    if token_scope is not None:
        check_token_scope(token_scope)
        if not any(registry.measurement(n).takes("token_scope") for n in requests):
            raise ThermoLensInputError(
                f"token_scope={token_scope!r} was given, but {', '.join(requests)} take(s) no token scope "
                "(e.g. the sheaf traces sum over every real token of each prompt): drop token_scope")
    ps = prompts if cache is not None else as_model_prompts(view, prompts)  # the cache path lays out tokens itself
    out, _ = run_measurements(view, ps, requests, run_settings, shared={"token_scope": token_scope}, cache=cache)
    return out
