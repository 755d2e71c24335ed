"""Shared helpers of the views: definition strings, colours, hover text, input unwrapping.

Every number a thermo-lens figure shows carries the definition that produced it (every result records
the definition, token scope, dtype and BOS setting that produced it; :mod:`thermo_lens.definitions`):
the helpers here turn a result's recorded settings into the short sentence that
goes into hover text, titles and figure notes.
"""

from __future__ import annotations

import html
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, Iterable, Sequence, TypeAlias, TypeVar, Union

import numpy as np
import plotly.graph_objects as go
from thermo_lens.core.errors import ThermoLensInputError

if TYPE_CHECKING:
    from numpy.typing import ArrayLike
    import torch

R = TypeVar("R")
#: What a view that overlays models takes: one result, a list of them or a ``{name: result}`` dict
#: (:func:`named` turns each into ``[(name, result)]``).
OneOrMany: TypeAlias = Union[R, Sequence[R], Mapping[str, R]]
#: Which layers or heads a figure draws: an index, a list of them (negative from the end), or all.
Selection: TypeAlias = Union[int, np.integer, Sequence[Union[int, np.integer]], None]

#: Marker symbol and line dash used for post-LN models in every cross-model figure.
POST_LN_SYMBOL = "diamond-open"
POST_LN_DASH = "dash"
POST_LN_SUFFIX = " [post-LN]"
POST_LN_NOTE = (
    "post-LN model (dashed / open diamond): every x_l is a LayerNorm output, so the gain is "
    "bounded by that norm's weights; compare with pre-LN models with care"
)

_PALETTE = (
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd",
)

TEMPLATE = "plotly_white"


class ThermoLensViewError(ThermoLensInputError):
    """A view got input it cannot draw; the message says what was wrong and what to pass."""


def color_of(key: Hashable, keys: Sequence[Hashable]) -> str:
    """Deterministic colour of ``key`` among ``keys`` (order of first appearance)."""
    order = list(dict.fromkeys(keys))
    return _PALETTE[order.index(key) % len(_PALETTE)]


def to_numpy(x: torch.Tensor | ArrayLike) -> np.ndarray:
    """float64 numpy copy of a tensor / array / list (CPU, detached)."""
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu", torch.float64).numpy()
    except ImportError:  # pragma: no cover
        pass
    return np.asarray(x, dtype=np.float64)


def bos_text(prepend_bos: object) -> str:
    """Human reading of a BOS mode (``True`` / ``False`` / ``"tokenizer"``, or their strings)."""
    s = str(prepend_bos)
    if s == "True":
        return "BOS prepended"
    if s == "False":
        return "no BOS"
    if s == "tokenizer":
        return "special tokens as the HF tokenizer adds them (paper protocol)"
    if s == "host":
        return "tokens as the host's model.to_tokens gives them"
    if s.startswith("host:"):
        return f"host tokenization ({s[5:]})"
    return f"prepend_bos={s}"


def settings_text(*, token_scope: object = None, prepend_bos: object = None, dtype: object = None,
                  weights: object = None, post_ln: object = None, norms: str | None = "float32 norms",
                  extra: Iterable[str] = ()) -> str:
    """``"token scope all_but_first, BOS prepended, float32 norms (model float32), raw weights"``."""
    parts = []
    if token_scope is not None:
        parts.append(f"token scope {token_scope}")
    if prepend_bos is not None:
        parts.append(bos_text(prepend_bos))
    if norms:
        parts.append(norms + (f" (model {dtype})" if dtype is not None else ""))
    elif dtype is not None:
        parts.append(f"model {dtype}")
    if weights is not None:
        parts.append(f"{weights} weights")
    if post_ln is not None:
        parts.append("post-LN" if _truthy(post_ln) else "pre-LN")
    parts.extend(extra)
    return ", ".join(parts)


def _truthy(v: object) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes")
    try:
        return bool(v) and not (isinstance(v, float) and np.isnan(v))
    except (TypeError, ValueError):
        return False


is_true = _truthy


def hover(lines: Sequence[str]) -> str:
    """A plotly ``hovertemplate`` from lines (``%{...}`` placeholders allowed), no extra box."""
    return "<br>".join(lines) + "<extra></extra>"


def wrap(text: str, width: int = 110) -> str:
    """Break a long definition into ``<br>``-separated lines for hover boxes / notes."""
    import textwrap

    return "<br>".join(textwrap.wrap(text, width, break_on_hyphens=False)) if text else ""


def model_name(obj: object, default: str = "model") -> str:
    """Best display name of a result or profile (its recorded model name)."""
    meta = getattr(obj, "meta", None)
    if isinstance(meta, Mapping) and meta.get("name"):
        return str(meta["name"])
    model = getattr(obj, "model", None)
    if isinstance(model, Mapping) and model.get("name"):
        return str(model["name"])
    source = getattr(obj, "source", None)
    if isinstance(source, Mapping) and isinstance(source.get("model"), Mapping) and source["model"].get("name"):
        return str(source["model"]["name"])
    view = getattr(obj, "view", None)
    if view is not None and getattr(view, "name", None):
        return str(view.name)
    return default


def named(items: object, attr: str | None, kind: str, names: Sequence[str] | None = None) -> list[tuple[str, Any]]:
    """Normalise one result, a list of results or a ``{name: result}`` dict to ``[(name, result)]``.

    ThermoProfile-like objects (with ``attr``, e.g. ``.gain``) are unwrapped to that attribute,
    and named by their ``meta["name"]``.
    """
    if items is None:
        raise ThermoLensViewError(f"expected a {kind} (or a list / dict of them), got None")
    if isinstance(items, Mapping):
        pairs: list[tuple[str | None, Any]] = [(str(k), v) for k, v in items.items()]
    elif isinstance(items, (list, tuple)):
        pairs = [(None, v) for v in items]
    else:
        pairs = [(None, items)]
    if not pairs:
        raise ThermoLensViewError(f"expected at least one {kind}, got an empty collection")
    if names is not None:
        names = list(names)
        if len(names) != len(pairs):
            raise ThermoLensViewError(f"got {len(names)} names for {len(pairs)} {kind}s")
        pairs = [(n, v) for n, (_, v) in zip(names, pairs)]
    out: list[tuple[str, Any]] = []
    for name, obj in pairs:
        label = name if name is not None else model_name(obj, default=f"model {len(out) + 1}")
        if attr is not None and hasattr(obj, "meta") and hasattr(obj, attr):
            inner = getattr(obj, attr)
            if inner is None:
                raise ThermoLensViewError(f"profile {label!r} has no {attr} (it was not measured)")
            obj = inner
        out.append((label, obj))
    seen: dict[str, int] = {}
    unique = []
    for label, obj in out:  # two results of the same model: keep both, tell them apart
        seen[label] = seen.get(label, 0) + 1
        unique.append((label if seen[label] == 1 else f"{label} ({seen[label]})", obj))
    return unique


def check_type(obj: object, cls_name: str, func: str, hint: str) -> None:
    """Raise a clear error unless ``obj`` is a ``cls_name`` (checked by name: no import cycle)."""
    names = {c.__name__ for c in type(obj).__mro__}
    if cls_name not in names:
        raise ThermoLensViewError(f"{func}: expected a {cls_name}, got {type(obj).__name__}. {hint}")


#: ``name`` of every note annotation (a page lifts them into HTML text: thermo_lens.views.page).
NOTE_NAME = "thermo-lens-note"


def note(fig: go.Figure, text: str, *, y: float = -0.18, size: int = 11) -> go.Figure:
    """Add a small paper-anchored note under the plot (definitions, caveats), named :data:`NOTE_NAME`."""
    fig.add_annotation(text=text, xref="paper", yref="paper", x=0, y=y, xanchor="left", name=NOTE_NAME,
                       yanchor="top", showarrow=False, align="left", font=dict(size=size, color="#444"))
    return fig


#: The package's figure style: one font, one template, one height scale for every figure.
FONT = dict(family="Inter, 'Segoe UI', 'Helvetica Neue', Arial, sans-serif", size=13, color="#222")
TITLE_SIZE = 17
SUBTITLE_SIZE = 12
#: Height of a standard figure's plotting area plus axes (px); heatmaps grow with their rows.
HEIGHT = 480
#: No figure is drawn shorter than this (px) in a 1,300-1,400 px wide page.
MIN_HEIGHT = 420
_SUB_LINE = 17  # px per subtitle line at SUBTITLE_SIZE


def subtitle_html(subtitle: str) -> str:
    """The subtitle as a smaller grey block under the title (``<br>`` keeps its line breaks)."""
    return f"<span style='font-size:{SUBTITLE_SIZE}px;color:#555'>{subtitle}</span>"


def base_layout(fig: go.Figure, title: str, subtitle: str | None = None, *, height: int = HEIGHT,
                bottom: int = 120) -> go.Figure:
    """The package style (font, template, title block, height) for every figure.

    The top margin grows with the subtitle's lines, so the title block never overlaps the plot;
    ``height`` is the figure's height without that growth (at least :data:`MIN_HEIGHT`).
    """
    lines = subtitle.count("<br>") + 1 if subtitle else 0
    top = 30 + TITLE_SIZE + 8 + _SUB_LINE * lines + 14
    t = title if not subtitle else f"{title}<br>{subtitle_html(subtitle)}"
    fig.update_layout(
        template=TEMPLATE, font=FONT,
        title=dict(text=t, x=0.01, xanchor="left", y=1.0, yref="container", yanchor="top",
                   pad=dict(t=14), font=dict(size=TITLE_SIZE)),
        height=max(height, MIN_HEIGHT) + max(0, top - 90), margin=dict(l=80, r=30, t=top, b=bottom),
        hoverlabel=dict(align="left", font=dict(size=12)), legend=dict(font=dict(size=12)),
    )
    return fig


def log_ticks(lo: float | int, hi: float | int) -> tuple[list[float], list[str]]:
    """Tick values and labels ``..., 0.5, 1, 2, 5, 10, 20, 50, ...`` spanning ``[lo, hi]`` for a log axis
    (plotly's ``dtick="D2"`` labels read "2, 10, 5, 2, 1"); ``([], [])`` when the range holds fewer
    than three such ticks (a narrow range: plotly's own ticks read well there)."""
    lo, hi = max(float(lo), 1e-12), max(float(hi), 1e-12)
    if hi < lo:
        lo, hi = hi, lo
    vals: list[float] = []
    steps = (1, 2, 5) if np.log10(hi / lo) <= 3 else (1,)  # many decades: powers of ten only
    for e in range(int(np.floor(np.log10(lo))) - 1, int(np.ceil(np.log10(hi))) + 1):
        for m in steps:
            v = m * 10.0 ** e
            if lo / 1.05 <= v <= hi * 1.05:
                vals.append(v)
    if len(vals) < 3:
        return [], []
    return vals, [f"{v:g}" for v in vals]  # 1e-05, 0.001, 20, 1e+06: short either way


def escape(text: object) -> str:
    return html.escape(str(text))
