"""A figure as a block of an HTML page: its title, subtitle and notes as HTML text, the plot below.

A plotly title, subtitle or note is one line of SVG text: it never wraps, so in a window narrower
than the one it was written for it runs past the figure's edge. On a page (the report) those texts
move out of the figure into HTML, which wraps at any width; the figure keeps its axes, legend and
colour bars, and its top margin shrinks to what the plot needs. The figure object itself is not
changed (a copy is drawn), so the same figure shown alone in a notebook keeps its title.

``figure_html(fig, div_id)`` returns ``<div class="figure">`` with ``.fig-title``, ``.fig-sub``, the
plotly div and ``.fig-note`` / ``.caption`` blocks; :data:`FIGURE_CSS` styles them.
"""

from __future__ import annotations

import html
import re
from typing import Any

import plotly.graph_objects as go

from thermo_lens.views._common import NOTE_NAME

__all__ = ["figure_html", "lift_texts", "plotly_text_to_html", "FIGURE_CSS"]

#: Styles of the lifted title block and notes (the report includes them).
FIGURE_CSS = """
.figure{margin:14px 0 24px 0;max-width:100%} .figure .js-plotly-plot,.figure .plotly-graph-div{max-width:100%}
.fig-title{font-size:17px;font-weight:600;margin:0 0 2px 0;overflow-wrap:anywhere}
.fig-sub{font-size:12.5px;color:#555;margin:0 0 4px 0;overflow-wrap:anywhere}
.fig-note{font-size:12px;color:#444;margin:2px 0 0 0;overflow-wrap:anywhere}
"""

# Plotly's text markup that HTML shows the same way; every other "<...>" in a label is literal text
# (e.g. "<z_h W_O^h, x_out + x_in>") and is escaped.
_KEEP = re.compile(r"&lt;(/?(?:b|i|sub|sup|br)\s*/?)&gt;", re.I)
_SPAN = re.compile(r"^<span style='[^']*'>(.*)</span>$", re.S)


def plotly_text_to_html(text: str, *, breaks: bool = False) -> str:
    """Plotly label markup as safe HTML: ``<b>``/``<i>``/``<sub>``/``<sup>`` kept, everything else
    escaped; ``<br>`` (the manual wrapping of a one-line SVG label) becomes a space unless ``breaks``."""
    out = _KEEP.sub(lambda m: "<" + m.group(1) + ">", html.escape(text, quote=False))
    return out if breaks else re.sub(r"\s*<br\s*/?>\s*", " ", out, flags=re.I)


def lift_texts(fig: go.Figure) -> tuple[go.Figure, str, str, list[str]]:
    """``(copy without title / notes, title, subtitle, notes)``: the texts as plotly markup.

    The title block is the one :func:`thermo_lens.views._common.base_layout` writes (title, ``<br>``,
    the subtitle in a grey ``<span>``); the notes are the annotations named :data:`NOTE_NAME`.
    """
    out = go.Figure(fig)
    text = out.layout.title.text or ""
    title, _, rest = text.partition("<br>")
    m = _SPAN.match(rest.strip())
    subtitle = m.group(1) if m else rest
    lifted = [a for a in out.layout.annotations if a.name == NOTE_NAME]
    notes = [a.text or "" for a in lifted]
    top, bottom = out.layout.margin.t, out.layout.margin.b
    out.layout.annotations = [a for a in out.layout.annotations if a.name != NOTE_NAME]
    # left: the room of the hover toolbar and of subplot titles (annotations on the plots' top edge)
    over_top = any(a.yref == "paper" and a.y is not None and a.y >= 1 for a in out.layout.annotations)
    new_top = 56 if over_top else 34
    # a note under the axis title leaves its room with it (90 px stay: tick labels and axis title)
    new_bottom = 90 if lifted and bottom and bottom > 90 else bottom
    shrink = (top - new_top if top is not None and top > new_top else 0) + ((bottom or 0) - (new_bottom or 0))
    update: dict[str, Any] = {"title": dict(text=""), "margin": dict(t=min(top or new_top, new_top), b=new_bottom)}
    if out.layout.height is not None:
        update["height"] = out.layout.height - shrink
    out.update_layout(**update)
    return out, title, subtitle, notes


def figure_html(fig: go.Figure, div_id: str, *, caption: str = "", config: dict[str, Any] | None = None) -> str:
    """The figure as an HTML block whose texts wrap with the window (see the module docstring);
    ``caption`` is plain text (escaped)."""
    bare, title, subtitle, notes = lift_texts(fig)
    div = bare.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config=config or {"displaylogo": False, "responsive": True})
    head = f'<div class="fig-title">{plotly_text_to_html(title)}</div>' if title else ""
    if subtitle:
        head += f'<div class="fig-sub">{plotly_text_to_html(subtitle)}</div>'
    foot = "".join(f'<div class="fig-note">{plotly_text_to_html(n)}</div>' for n in notes)
    if caption:
        foot += f'<div class="caption">{html.escape(caption)}</div>'
    return f'<div class="figure">{head}{div}{foot}</div>'
