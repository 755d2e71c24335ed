"""circuitsvis panels: a layer's attention patterns next to its per-head thermodynamic metrics.

One self-contained HTML fragment that renders **offline**: the circuitsvis JavaScript bundle
shipped inside the installed ``circuitsvis`` package (``circuitsvis/dist/cdn/iife.js``, the same
file ``circuitsvis.utils.render.render_local`` inlines) is embedded in the fragment, so nothing is
fetched from a CDN (``circuitsvis``' own ``RenderedHTML._repr_html_`` probes ``google.com`` and
uses unpkg when online; this module never does).

Per-head metrics shown next to the patterns (D'Elia 2026, "Thermodynamic Constraints in
Transformer Architectures"; ``thermo_lens.definitions`` §1-3):

* ``delta_block_gain``: the change in the layer's block gain ``G_{l+1} = ||x_{l+1}|| / ||x_l||``
  (block ``l``, 0-based) when the head is zero-ablated (``blocks.{l}.attn.hook_z[:, :, h] = 0``,
  a ``fwd_hooks`` hook in :func:`thermo_lens.measures.gain.residual_gain`), mean over the prompts;
* ``W_V_norm``, ``W_O_norm``, ``ov_norm``: spectral norms (:func:`thermo_lens.measures.spectral.spectral_signature`);
* ``sheaf_trace``: ``(n - sum_i A_ii) ||W_V||_F^2`` of the head on the panel's prompt (the trace of
  its sheaf Laplacian, :func:`thermo_lens.measures.sheaf.sheaf_laplacian`).
"""

from __future__ import annotations

import functools
import html
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd
import torch

from thermo_lens.core.registry import Metric, metrics, register_metric
from thermo_lens.core.result import Result
from thermo_lens.core.tokens import TokenScope
from thermo_lens.views._common import ThermoLensViewError, bos_text, settings_text, to_numpy

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from thermo_lens.core.hosts.protocol import TransformerLensModel
    from thermo_lens.core.inputs import Prompts
    from thermo_lens.core.model import ModelView
    from thermo_lens.core.settings import FwdHooks
    from thermo_lens.core.tokens import BosMode

__all__ = [
    "AttentionPanel",
    "attention_panel",
    "panel_from_results",
    "circuitsvis_html",
    "circuitsvis_js",
    "panel_definitions",
]

for _name, _symbol, _formula, _unit in (
    ("sheaf_trace", "Tr L", "Tr L = (n - sum_i A_ii) * ||W_V||_F^2, the head's sheaf Laplacian trace on the "
     "shown prompt", "squared weight norm x tokens"),
    ("attn_to_self", "mean A_ii", "mean over query tokens of A_ii (diagonal attention mass) on the shown prompt",
     "attention probability"),
):
    register_metric(Metric(_name, symbol=_symbol, formula=_formula, shape="head", result="AttentionPanel",
                           section="sheaf", unit=_unit,
                           frame="metrics", attr=f"metrics.{_name}", panel=True))


def panel_definitions() -> dict[str, str]:
    """Definition of every column of :attr:`AttentionPanel.metrics`: the registered metrics shown in
    panels (``Metric.panel``), the ablation first."""
    shown = [m for m in metrics() if m.panel]
    shown.sort(key=lambda m: m.name != "delta_block_gain")
    return {m.name: m.formula for m in shown}


# ---------------------------------------------------------------------------- offline circuitsvis
@functools.lru_cache(maxsize=1)
def circuitsvis_js() -> str:
    """The circuitsvis browser bundle (IIFE defining ``CircuitsVis``), safe to inline in ``<script>``.

    Read from the installed package. ``</script`` inside the bundle's string literals is written
    ``<\\/script`` (the same string in JavaScript, but it no longer ends the HTML script element;
    circuitsvis' own ``render_local`` deletes it instead) and the ``sourceMappingURL`` comment is
    dropped (no file or network look-up from developer tools).
    """
    try:
        import circuitsvis
    except ImportError as e:  # pragma: no cover - circuitsvis is a dependency
        raise ThermoLensViewError("attention panels need circuitsvis: pip install circuitsvis") from e
    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    if not path.is_file():
        raise ThermoLensViewError(
            f"the installed circuitsvis has no offline bundle at {path}; reinstall circuitsvis "
            "(a wheel from PyPI ships dist/cdn/iife.js)")
    js = path.read_text(encoding="utf-8")
    js = "\n".join(line for line in js.splitlines() if not line.startswith("//# sourceMappingURL="))
    return js.replace("</script", "<\\/script").replace("<!--", "<\\!--")


def _props_json(props: dict[str, Any]) -> str:
    from circuitsvis.utils.convert_props import convert_props

    text = convert_props(props)
    # JSON is valid JavaScript; escape what could end the <script> element from inside a string.
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def circuitsvis_html(element: str = "AttentionPatterns", *, include_js: bool = True,
                     element_id: str | None = None, **props: object) -> str:
    """Offline HTML for a circuitsvis React element (e.g. ``AttentionPatterns``, ``AttentionHeads``).

    ``props`` are the element's properties as ``circuitsvis.attention.attention_patterns`` passes
    them (``tokens=[...]``, ``attention=[head, dest, src]``); tensors and arrays become lists.
    With ``include_js=False`` the bundle is not embedded (the page must already define
    ``CircuitsVis``, e.g. an earlier fragment with ``include_js=True``).
    """
    div = element_id or f"circuits-vis-{uuid.uuid4().hex[:12]}"
    js = circuitsvis_js() if include_js else ""
    call = (f'try {{ CircuitsVis.render("{div}", CircuitsVis.{element}, {_props_json(props)}); }}\n'
            f'catch (e) {{ document.getElementById("{div}").textContent = '
            f'"circuitsvis failed to render: " + e; throw e; }}')
    return (f'<div id="{div}" class="thermo-lens-circuitsvis" style="margin: 10px 0;"></div>\n'
            f'<script>\n{js}\n{call}\n</script>')


# ---------------------------------------------------------------------------- metrics
def _display_tokens(view: ModelView, prompt: str, prepend_bos: BosMode, n: int) -> list[str]:
    from thermo_lens.core.tokens import encode

    ids = encode(view, prompt, prepend_bos)[:n]
    tok = view.tokenizer
    return [tok.decode([i]) for i in ids]


# ---------------------------------------------------------------------------- the panel
@dataclass(frozen=True, eq=False)
class AttentionPanel(Result):
    """A layer's attention patterns (circuitsvis) next to its per-head metrics; offline HTML.

    Attributes:
        html: the self-contained HTML fragment (circuitsvis JS inlined once).
        metrics: one row per head (columns described in :func:`panel_definitions`).
        tokens: the prompt's tokens as displayed.
        pattern: ``Float[Tensor, "head dest src"]`` the layer's attention pattern on the prompt.
        layer, prompt, model, settings: what is shown and how it was measured.

    In a notebook the panel displays itself (``_repr_html_``); :meth:`save` writes a standalone
    HTML page.
    """

    html: str
    metrics: pd.DataFrame
    tokens: tuple[str, ...]
    pattern: torch.Tensor
    layer: int
    prompt: str
    model: str
    settings: dict[str, Any] = field(default_factory=dict)

    def _repr_html_(self) -> str:
        return self.html

    def __html__(self) -> str:
        return self.html

    def save(self, path: str | Path) -> Path:
        """Write a standalone offline HTML page with this panel; returns the path."""
        p = Path(path)
        title = html.escape(f"thermo-lens: {self.model}, layer {self.layer}")
        from thermo_lens.core.safe_io import atomic_write_text

        atomic_write_text(p, f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title></head>"
                             f"<body>{self.html}</body></html>")
        return p

    def __repr__(self) -> str:
        return (f"AttentionPanel({self.model}, layer {self.layer}, {len(self.tokens)} tokens, "
                f"{self.pattern.shape[0]} heads; metrics: {', '.join(c for c in self.metrics.columns if c in panel_definitions())})")


def _cell_style(v: float, lo: float, hi: float, diverging: bool) -> str:
    if not np.isfinite(v) or not np.isfinite(lo) or not np.isfinite(hi) or hi == lo:
        return ""
    if diverging:
        m = max(abs(lo), abs(hi)) or 1.0
        t = v / m
        color = f"rgba(214,39,40,{0.55 * t:.3f})" if t > 0 else f"rgba(31,119,180,{-0.55 * t:.3f})"
    else:
        t = (v - lo) / (hi - lo)
        color = f"rgba(44,160,44,{0.1 + 0.45 * t:.3f})"
    return f' style="background:{color}"'


def _metrics_table(metrics: pd.DataFrame, columns: Sequence[str]) -> str:
    defs = panel_definitions()
    head = "".join(f'<th title="{html.escape(defs.get(c, c))}">{html.escape(c)}</th>' for c in columns)
    ranges = {c: (np.nanmin(metrics[c].to_numpy(float)), np.nanmax(metrics[c].to_numpy(float))) for c in columns
              if c != "head" and len(metrics)}
    rows = []
    for _, r in metrics.iterrows():
        cells = []
        for c in columns:
            v = r[c]
            if c == "head":
                cells.append(f"<td><b>{int(v)}</b></td>")
                continue
            v = float(v)
            lo, hi = ranges[c]
            cells.append(f'<td{_cell_style(v, lo, hi, c.startswith("delta") or c == "head_term")}>{v:.4g}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="thermo-lens-metrics" style="border-collapse:collapse;font-size:12px">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


_PANEL_CSS = ("<style>.thermo-lens-panel table.thermo-lens-metrics td,.thermo-lens-panel table.thermo-lens-metrics th"
              "{border:1px solid #ddd;padding:3px 7px;text-align:right}"
              ".thermo-lens-panel dt{font-weight:bold;margin-top:4px}.thermo-lens-panel dd{margin-left:12px}</style>")


def panel_from_results(tokens: Sequence[str], pattern: torch.Tensor | ArrayLike, metrics: pd.DataFrame, *, layer: int, prompt: str,
                       model: str = "model", settings: dict[str, Any] | None = None,
                       include_js: bool = True) -> AttentionPanel:
    """Assemble an :class:`AttentionPanel` from already computed pieces (pure; no model run).

    Args:
        tokens: ``n`` token strings.
        pattern: ``[head, n, n]`` attention pattern (rows = destination/query, columns = source/key).
        metrics: one row per head with a ``head`` column and any of :func:`panel_definitions`.
        layer, prompt, model: labels.
        settings: measurement settings to print (``prepend_bos``, ``token_scope``, ``dtype``, ``weights``).
        include_js: embed the circuitsvis bundle (set False when the page already has it).
    """
    pat = torch.as_tensor(to_numpy(pattern), dtype=torch.float32)
    tokens = [str(t) for t in tokens]
    if pat.ndim != 3 or pat.shape[1] != pat.shape[2] or pat.shape[1] != len(tokens):
        raise ThermoLensViewError(
            f"panel: pattern must be [head, n, n] with n = {len(tokens)} tokens, got {tuple(pat.shape)}")
    if "head" not in metrics.columns:
        raise ThermoLensViewError("panel: metrics needs a 'head' column")
    settings = dict(settings or {})
    definitions = panel_definitions()
    cols = ["head"] + [c for c in definitions if c in metrics.columns]
    if len(metrics) != pat.shape[0]:
        raise ThermoLensViewError(f"panel: {len(metrics)} metric rows for {pat.shape[0]} heads in the pattern")
    # circuitsvis' AttentionPatterns props (tokens, attention=[head, dest, src]); headLabels names each
    # pattern by the head's real index (the metrics' head column), not its position in the shown subset.
    labels = [f"Head {int(h)}" for h in metrics["head"]]
    vis = circuitsvis_html("AttentionPatterns", include_js=include_js, tokens=tokens, attention=pat,
                           headLabels=labels)
    defs = "".join(f"<dt>{html.escape(c)}</dt><dd>{html.escape(definitions[c])}</dd>" for c in cols if c != "head")
    stext = html.escape(settings_text(token_scope=settings.get("token_scope"), prepend_bos=settings.get("prepend_bos"),
                                      dtype=settings.get("dtype"), weights=settings.get("weights"),
                                      post_ln=settings.get("post_ln"),
                                      extra=[f"hooks: {settings['hooks']}"] if settings.get("hooks") else ()))
    esc = html.escape
    bos = esc(bos_text(settings.get("prepend_bos", "?")))
    frag = f"""<div class="thermo-lens-panel" style="font-family:system-ui,sans-serif;font-size:13px">{_PANEL_CSS}
<div style="display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start">
<div style="flex:1 1 460px;min-width:min(380px,100%);max-width:100%">
<h4 style="margin:4px 0">Attention patterns: {esc(model)}, layer {layer} ({pat.shape[0]} heads)</h4>
<div style="overflow-wrap:anywhere">prompt: <code>{esc(prompt)}</code> &middot; {len(tokens)} tokens ({bos})</div>
{vis}
</div>
<div style="flex:1 1 380px;min-width:0;max-width:100%">
<h4 style="margin:4px 0">Per-head metrics, layer {layer}</h4>
<div style="color:#555;margin-bottom:6px;overflow-wrap:anywhere">{stext}</div>
<div style="overflow-x:auto;max-width:100%">{_metrics_table(metrics[cols], cols)}</div>
<dl style="font-size:11px;color:#333">{defs}</dl>
</div></div></div>"""
    return AttentionPanel(html=frag, metrics=metrics[cols].reset_index(drop=True), tokens=tuple(tokens),
                          pattern=pat, layer=layer, prompt=prompt, model=model, settings=settings)


def _per_head_activation_metrics(view: ModelView, prompts: Prompts, layer: int, token_scope: str,
                                  prepend_bos: BosMode, fwd_hooks: FwdHooks = ()) -> dict[str, np.ndarray]:
    """``{column: [head] values}``: every registered ``[prompt, layer, head]`` metric marked ``panel``,
    block ``layer``, mean over ``prompts``, from one pass over every measurement that produces one."""
    from thermo_lens.core import measure, registry

    wanted = [m for m in metrics() if m.panel and m.dims == ("prompt", "layer", "head")]
    runs = [meas.name for meas in registry.measurements() if meas.needs_pass and meas.applies(view) is None
            and any(m.result == meas.result.__name__ for m in wanted)]
    if not runs:
        return {}
    scoped = any(registry.measurement(n).takes("token_scope") for n in runs)  # (a scope nothing takes is refused)
    res = measure.run(view, prompts, runs, token_scope=token_scope if scoped else None, prepend_bos=prepend_bos,
                      progress=False, fwd_hooks=fwd_hooks)
    held = {type(r) for r in res.results.values()}
    return {m.frame_column: to_numpy(m.values(res)[:, layer].double().mean(0)) for m in wanted
            if any(cls.__name__ == m.result for cls in held)}


def attention_panel(model: TransformerLensModel | ModelView, prompt: str, layer: int, *, head: int | Sequence[int] | None = None,
                    prepend_bos: BosMode = "host", gain_prompts: Prompts | None = None, token_scope: TokenScope = "all_but_first",
                    ablation: bool = True, attribution: bool = True, include_js: bool = True,
                    fwd_hooks: FwdHooks = ()) -> AttentionPanel:
    """Attention patterns of ``layer`` on ``prompt`` (circuitsvis) next to that layer's per-head metrics.

    Args:
        model: a TransformerLens model (``TransformerBridge``).
        prompt: the prompt whose patterns are shown (and the sheaf trace is measured on).
        layer: block index (0-based; negative from the end).
        head: show only this head (or these heads; negative from the end); default all.
        prepend_bos: BOS mode (``True``, ``False``, ``"tokenizer"``), as in ``residual_gain``.
        gain_prompts: prompts for the ablation gain change (default ``[prompt]``).
        token_scope: token scope of the gain (``thermo_lens.core.tokens.TOKEN_SCOPES``).
        ablation: compute ``delta_block_gain`` (``n_heads + 1`` forward passes over ``gain_prompts``).
        attribution: compute the per-head activation metrics registered for panels
            (``Metric.panel``, shape ``[prompt, layer, head]``: the attribution's ``head_term``, ...),
            mean over ``gain_prompts``, from one pass (:func:`thermo_lens.run`); a measurement with no
            exact definition on the model (the attribution of a post-LN model) is left out.
        include_js: embed the circuitsvis bundle (once per page is enough).
        fwd_hooks: your ``(hook_name, fn)`` hooks (an ablation, a patch), run in every pass the panel
            makes (the pattern, the ablation gains, the activation metrics); shown in the panel.

    Returns:
        :class:`AttentionPanel` (``panel.html``; displays itself in a notebook; ``panel.save(path)``).
    """
    from thermo_lens.core.model import as_view
    from thermo_lens.measures.sheaf import LayerSheafLaplacian, sheaf_laplacian
    from thermo_lens.measures.spectral import spectral_signature

    if not isinstance(prompt, str) or not prompt.strip():
        raise ThermoLensViewError(f"attention_panel: prompt must be a non-empty string, got {prompt!r}")
    view = as_view(model)
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not -view.n_layers <= layer < view.n_layers:
        raise ThermoLensViewError(f"attention_panel: layer must be an int in 0..{view.n_layers - 1}, got {layer!r}")
    layer = int(layer) % view.n_layers
    if head is None:
        shown = list(range(view.n_heads))
    else:
        hs = [head] if isinstance(head, (int, np.integer)) else list(head)
        bad = [h for h in hs if isinstance(h, bool) or not -view.n_heads <= int(h) < view.n_heads]
        if bad or not hs:
            raise ThermoLensViewError(f"attention_panel: head must be in 0..{view.n_heads - 1} (negative from the end), got {head!r}")
        shown = [int(h) % view.n_heads for h in hs]
    from thermo_lens.core import attached
    from thermo_lens.core.provenance import attached_records, describe_hook, hooks_text
    from thermo_lens.core.validate import boolean, fwd_hooks as check_hooks

    ablation, attribution = boolean("ablation", ablation), boolean("attribution", attribution)
    hooks = check_hooks(fwd_hooks)
    lap = sheaf_laplacian(view, prompt, layer, None, prepend_bos=prepend_bos, fwd_hooks=hooks)
    assert isinstance(lap, LayerSheafLaplacian)  # head=None: all heads of the layer
    pattern = torch.stack([h.pattern for h in lap.heads]).float()  # [head, n, n]
    n = pattern.shape[-1]
    tokens = _display_tokens(view, prompt, prepend_bos, n)
    sig = spectral_signature(view)
    head_metrics = {m.name: to_numpy(sig.head_metrics[m.name][layer])
                    for m in metrics(result="SpectralSignature", shape="layer head") if m.panel and m.name in sig.head_metrics}
    table = pd.DataFrame({
        "head": np.arange(view.n_heads),
        **head_metrics,
        "sheaf_trace": to_numpy(lap.head_traces()),
        "attn_to_self": to_numpy(torch.diagonal(pattern, dim1=-2, dim2=-1).double().mean(-1)),
    })
    gp = gain_prompts if gain_prompts is not None else [prompt]
    if ablation:
        from thermo_lens.measures.ablation import head_ablation

        abl = head_ablation(view, gp, layer, token_scope=token_scope, prepend_bos=prepend_bos, fwd_hooks=hooks)
        table.insert(1, "delta_block_gain", abl.to_frame()["delta_block_gain"].to_numpy())
    if attribution:
        for name, values in _per_head_activation_metrics(view, gp, layer, token_scope, prepend_bos, hooks).items():
            table.insert(1, name, values)
    table = table.iloc[shown].reset_index(drop=True)
    pattern = pattern[shown]
    meta = view.metadata()
    settings = {"prepend_bos": lap.heads[0].prepend_bos,  # resolved
                "token_scope": token_scope if (ablation or attribution) else None,
                "dtype": meta["dtype"], "weights": meta["weights"], "post_ln": meta["post_ln"],
                "hooks": hooks_text(tuple(describe_hook(n, f) for n, f in hooks)
                                    + attached_records(attached.attached_hooks(view.model)))}
    return panel_from_results(tokens, pattern, table, layer=layer, prompt=prompt, model=view.name,
                              settings=settings, include_js=include_js)
