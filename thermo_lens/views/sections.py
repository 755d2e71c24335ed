"""Report sections, one per registered measurement.

:func:`thermo_lens.report.render_report` walks the measurement registry
(:func:`thermo_lens.core.registry.measurements`) and, for each measurement its profiles hold, writes a
section with the measurement's title and summary, then calls the renderer registered here for it
(:func:`register_section`), or :func:`generic_section`, which draws every registered metric of the
measurement's result with :func:`thermo_lens.views.metric_plot`. So a new measurement appears in
the report with no code here; a renderer is only for a better figure.

A renderer is ``fn(doc, results, profiles)``: ``results`` maps a model id to that measurement's
result, ``profiles`` the model id to its whole profile, and ``doc`` receives the output through
``doc.figure(anchor, make_figure, caption=None)``, ``doc.p(text, css_class)`` and ``doc.html(raw)``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

from thermo_lens._lazy import pandas as pd
from thermo_lens.core import registry

__all__ = ["register_section", "section_for", "generic_section", "MAX_PER_MODEL_FIGURES"]

#: At most this many per-model figures per section (a study may hold dozens of models).
MAX_PER_MODEL_FIGURES = 6

if TYPE_CHECKING:
    import pandas
    import plotly.graph_objects as go


@runtime_checkable
class Document(Protocol):
    """The page a section renderer writes into (the report's document)."""

    def html(self, text: str) -> None: ...

    def p(self, text: str, cls: str = "") -> None: ...

    def table(self, df: pandas.DataFrame, *, left: Sequence[str] = ()) -> None: ...

    def figure(self, fid: str, build: Callable[[], go.Figure], caption: str = "") -> None: ...


#: A section renderer: ``fn(doc, results, profiles)`` with ``results`` ``{model: that measurement's
#: result}`` and ``profiles`` ``{model: ThermoProfile}``.
Renderer = Callable[[Document, dict[str, Any], dict[str, Any]], None]
_SECTIONS: dict[str, Renderer] = {}


def register_section(measurement: str) -> Callable[[Renderer], Renderer]:
    """Decorator: the report section renderer of ``measurement``."""
    def wrap(fn: Renderer) -> Renderer:
        _SECTIONS[measurement] = fn
        return fn
    return wrap


def section_for(measurement: str) -> Renderer:
    """The renderer registered for ``measurement``, or :func:`generic_section`."""
    return _SECTIONS.get(measurement, functools.partial(generic_section, measurement=measurement))


def _meta(p: object) -> dict[str, Any]:
    m = getattr(p, "meta", None)
    return dict(m) if isinstance(m, dict) else {}


def _per_model_note(doc: Document, n: int) -> None:
    if n > MAX_PER_MODEL_FIGURES:
        doc.p(f"Per-model figures shown for the first {MAX_PER_MODEL_FIGURES} of {n} models.", "note")


def generic_section(doc: Document, results: dict[str, Any], profiles: dict[str, Any], *, measurement: str) -> None:
    """Every registered metric of the measurement's result, drawn from its shape, per model."""
    from thermo_lens.views.metrics import metric_plot

    m = registry.measurement(measurement)
    for i, (k, res) in enumerate(list(results.items())[:MAX_PER_MODEL_FIGURES]):
        for metric in m.metric_list():
            doc.figure(f"fig-{measurement}-{metric.name}-{i}",
                       functools.partial(metric_plot, res, metric.name, title=f"{k}: {metric.name} ({metric.symbol})"))
    _per_model_note(doc, len(results))


# ---------------------------------------------------------------------------- the battery's sections
def _robustness(profiles: dict[str, Any]) -> dict[str, Any]:
    """Per-category gain for profiles whose prompts carry >= 2 categories (pure, no model run)."""
    from thermo_lens.core import prompts as prompt_sets
    from thermo_lens.measures.robustness import robustness_from_gain

    out = {}
    for k, p in profiles.items():
        meta, g = _meta(p), getattr(p, "gain", None)
        if g is None:
            continue
        cats = meta.get("categories")
        if not cats:  # older profiles: recover the categories from a built-in prompt set
            try:
                ps = prompt_sets.get(str(meta.get("prompt_set")))
                cats = ps.categories if tuple(ps.prompts) == tuple(g.prompts) else None
            except (KeyError, TypeError):
                cats = None
        if not cats or len(cats) != g.n_prompts or len(set(cats)) < 2:
            continue
        out[k] = robustness_from_gain(g, list(cats), prompt_set=str(meta.get("prompt_set") or "custom"))
    return out


@register_section("gain")
def _gain(doc: Document, gains: dict[str, Any], profiles: dict[str, Any]) -> None:
    from thermo_lens import views

    doc.figure("fig-dynamics", lambda: views.layer_dynamics(gains))
    if len({g.n_layers for g in gains.values()}) > 1:
        doc.figure("fig-dynamics-relative", lambda: views.layer_dynamics(gains, x="relative_depth"),
                   "the same against relative depth l / L (models differ in depth)")
    rob = _robustness(profiles)
    if rob:
        doc.html("<h3>Input robustness by prompt category</h3>")
        doc.figure("fig-robustness", lambda: views.robustness_plot(rob))


@register_section("anisotropy")
def _anisotropy(doc: Document, aniso: dict[str, Any], profiles: dict[str, Any]) -> None:
    from thermo_lens import views

    doc.figure("fig-anisotropy", lambda: views.anisotropy_plot(aniso))


@register_section("spectral")
def _spectral(doc: Document, spec: dict[str, Any], profiles: dict[str, Any]) -> None:
    from thermo_lens import views

    labs = [str(_meta(profiles[k]).get("lab") or k) for k in spec]
    doc.figure("fig-spectral-scatter", lambda: views.spectral_scatter(spec, labs=labs))
    if len(spec) > 1:
        doc.figure("fig-spectral-models", lambda: views.spectral_scatter(spec, labs=labs, per="model"),
                   "one point per model: the mean over its heads and layers")
    for i, (k, s) in enumerate(list(spec.items())[:MAX_PER_MODEL_FIGURES]):
        # beside the spectral norms, each head's exact share of its block's squared-norm change
        attr = getattr(profiles[k], "attribution", None)
        doc.figure(f"fig-heads-{i}", functools.partial(views.spectral_heatmaps, s, name=k, attribution=attr))
    _per_model_note(doc, len(spec))


@register_section("sheaf")
def _sheaf(doc: Document, sheaves: dict[str, Any], profiles: dict[str, Any]) -> None:
    from thermo_lens import views

    for i, (k, t) in enumerate(list(sheaves.items())[:MAX_PER_MODEL_FIGURES]):
        doc.figure(f"fig-sheaf-{i}", functools.partial(views.sheaf_trace_heatmap, t, name=k))
    _per_model_note(doc, len(sheaves))


def l_star_table(lstars: dict[str, Any]) -> pd.DataFrame:
    """Empirical L* (mean trace and per-prompt mean, by the result's rule; the paper's rule's L* on
    the same trace beside it) against eq. 6 and the fit-free L/2 baseline."""
    rows = []
    for k, r in lstars.items():
        ape, pap = r.baseline_errors("ape"), r.baseline_errors("paper")
        rows.append({"model": k, "variant": r.variant, "L": r.n_layers, "H": r.n_heads,
                     "empirical (mean trace)": r.empirical, "per-prompt mean": r.per_prompt_mean,
                     "paper's rule (argmax_abs_gradient)": r.paper_rule_l_star,
                     "eq. 6": r.predicted, "L/2": r.baselines.get("half_depth", float("nan")),
                     "APE eq. 6": ape["eq6"], "APE L/2": ape.get("half_depth", float("nan")),
                     "|err|/L eq. 6": pap["eq6"], "|err|/L L/2": pap.get("half_depth", float("nan")),
                     "|err|/L eq. 6 vs paper's rule": r.paper_rule_error("paper"),
                     "warning": "; ".join(r.warnings)})
    return pd.DataFrame(rows)


@register_section("l_star")
def _l_star(doc: Document, lstars: dict[str, Any], profiles: dict[str, Any]) -> None:
    from thermo_lens import views
    from thermo_lens.views.sheaf import eq6_beyond_depth

    doc.figure("fig-lstar", lambda: views.l_star_plot(lstars))
    if len({r.n_layers for r in lstars.values()}) > 1:
        doc.figure("fig-lstar-relative", lambda: views.l_star_plot(lstars, x="relative_depth"))
    shallow = {k: r for k, r in lstars.items() if eq6_beyond_depth(r)}  # the figure leaves the same ones out
    deep = {k: r for k, r in lstars.items() if k not in shallow}
    if shallow:
        doc.p(shallow_l_star_text(shallow), "note")
    if deep:
        doc.p("Eq. 6 beside the fit-free baseline L/2 (on the paper's own validation models L/2 does as well); "
              "errors as fractions, against the empirical L* of the named rule (default steepest_step, the deeper "
              "layer of the steepest step T_{k+1} - T_k), with the paper's rule argmax_abs_gradient (np.gradient, "
              "which favours the end layers) beside it.", "note")
        doc.table(l_star_table(deep), left=("model", "variant", "warning"))
    if shallow:
        doc.html("<details><summary>The L* numbers of the shallow models (for the record)</summary>")
        doc.table(l_star_table(shallow).drop(columns=["warning"]), left=("model", "variant"))
        doc.html("</details>")


def shallow_l_star_text(shallow: dict[str, Any]) -> str:
    """What L* says (and does not say) for models where eq. 6 predicts beyond their depth."""
    groups: dict[tuple[int, int, float], list[str]] = {}
    for k, r in shallow.items():
        groups.setdefault((r.n_layers, r.n_heads, r.predicted), []).append(k)
    where = "; ".join(f"{', '.join(ks)} (L = {L}, H = {H}): eq. 6 gives {pred:.3g}" for (L, H, pred), ks in groups.items())
    emp = sorted({float(r.empirical) for r in shallow.values() if float(r.empirical) == float(r.empirical)})  # no NaN
    emp_txt = ", ".join(f"{e:g}" for e in emp)
    variant = next(iter(shallow.values())).variant
    return (f"L* is the depth at which the layer sheaf trace changes fastest (rule {variant}; 0-based layers), "
            "and the paper's eq. 6, L* = L (0.11 + 0.012 L + 4.9 / H), predicts it for models of 12 to 24 blocks "
            f"with many heads. For shallow models with few heads eq. 6 predicts a depth past the last block: {where}. "
            "So there is no prediction to test here, and the comparison is left out (the numbers are below, "
            f"folded). The measured L* of these models is {emp_txt}: in a model this shallow the largest change of the "
            "trace is simply where the early blocks mix the most; read the trace in the figure above rather than "
            "one layer index. Profile a model with 12 or more blocks to compare eq. 6 with a measurement.")


@register_section("attribution")
def _attribution(doc: Document, attrs: dict[str, Any], profiles: dict[str, Any]) -> None:
    from thermo_lens import views

    for i, (k, a) in enumerate(list(attrs.items())[:MAX_PER_MODEL_FIGURES]):
        doc.figure(f"fig-attribution-{i}", functools.partial(views.attribution_heatmap, a, name=k))
    _per_model_note(doc, len(attrs))
