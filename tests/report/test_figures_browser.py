"""Every figure type, and the default report, drawn by headless Chromium at 800, 1,024 and 1,400 px
wide: no two text boxes of a figure overlap, no text runs past its figure, no axis title, legend or
colour bar sits on a plotting area, and the page never scrolls sideways.

The figures are made from the embedded default models profiled on the default prompt set (what a
newcomer's first ``thermo-lens profile`` shows) and written into one page; a probe script reads
the rendered geometry (``getBoundingClientRect`` of every non-empty ``<text>`` of each plotly SVG:
titles, subtitles, axis titles, tick labels, legend entries, annotations, colour bars, cell
values) and lists the pairs whose boxes intersect by more than 2 px both ways, the texts outside
their figure, and the axis titles, legend boxes and colour-bar boxes that intersect a subplot's
plotting area (its drag rectangle); and ``scrollWidth`` against ``clientWidth`` of the page. The
figures are drawn as the report shows them (:func:`thermo_lens.views.page.figure_html`: title,
subtitle and notes as HTML text) at every width, and as plotly draws them alone at 1,400 px. The
same is checked on the whole report. Set ``THERMO_LENS_SCREENSHOTS=DIR`` to also get one PNG per
figure (and per report section and width) in DIR, to look at.

Skipped when no Chromium binary exists and ``CI`` is not set (in CI it must run).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from test_report_browser import _chromium
from test_views import _figure_texts, doubled_labels

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Runs after load: the overlapping text pairs of every plotly figure, as JSON in document.title.
_GEOMETRY = """<script>window.addEventListener('load',function(){setTimeout(function(){
var out={figures:0,texts:0,overlaps:[],clipped:[],on_data:[],
 scroll_width:document.documentElement.scrollWidth,client_width:document.documentElement.clientWidth};
function hit(a,b){var w=Math.min(a.right,b.right)-Math.max(a.left,b.left),h=Math.min(a.bottom,b.bottom)-Math.max(a.top,b.top);
 return w>2&&h>2;}
document.querySelectorAll('.js-plotly-plot').forEach(function(p){
 out.figures++;var boxes=[];var f=p.querySelector('svg.main-svg').getBoundingClientRect();
 p.querySelectorAll('svg text').forEach(function(t){
  if(!t.textContent.trim())return;var r=t.getBoundingClientRect();if(r.width<1||r.height<1)return;
  var c=(t.getAttribute('class')||'')+' '+((t.parentNode&&t.parentNode.getAttribute&&t.parentNode.getAttribute('class'))||'');
  boxes.push([r.left,r.top,r.right,r.bottom,t.textContent.slice(0,40),c.trim()]);
  if(r.left<f.left-2||r.top<f.top-2||r.right>f.right+2||r.bottom>f.bottom+2)
   out.clipped.push(p.id+': "'+t.textContent.slice(0,40)+'" ['+c.trim()+'] outside the figure');});
 out.texts+=boxes.length;
 for(var i=0;i<boxes.length;i++)for(var j=i+1;j<boxes.length;j++){var a=boxes[i],b=boxes[j];
  var w=Math.min(a[2],b[2])-Math.max(a[0],b[0]),h=Math.min(a[3],b[3])-Math.max(a[1],b[1]);
  if(w>2&&h>2)out.overlaps.push(p.id+': "'+a[4]+'" ['+a[5]+'] x "'+b[4]+'" ['+b[5]+']');}
 // axis titles, legends and colour bars must stay off every subplot's plotting area (the drag rectangles)
 var areas=Array.from(p.querySelectorAll('.draglayer .nsewdrag')).map(function(d){return d.getBoundingClientRect();});
 var labels='.g-xtitle text,.g-ytitle text,[class^="g-x"][class$="title"] text,[class^="g-y"][class$="title"] text,'+
  '.legend .bg,.colorbar .cbfill,.colorbar text';
 p.querySelectorAll(labels).forEach(function(t){
  var r=t.getBoundingClientRect();if(r.width<1||r.height<1)return;
  var what=(t.textContent||t.parentNode.getAttribute('class')||'').slice(0,40);
  areas.forEach(function(a){if(hit(r,a))out.on_data.push(p.id+': "'+what+'" on a plotting area');});});
});
%s
document.title='TLGEOM '+JSON.stringify(out);},1500);});</script>"""
# Shows only one report section (its h2 up to the next h2), for a per-section screenshot.
_ONLY_SECTION = """var a=document.getElementById('%s');if(a){var on=false;Array.from(document.body.children).forEach(
function(c){if(c.tagName==='H2')on=(c===a);if(!on&&c.tagName!=='SCRIPT')c.style.display='none';});
window.dispatchEvent(new Event('resize'));}"""


@pytest.fixture(scope="module")
def chromium():
    binary = _chromium()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but no Chromium binary was found (install the Debian package 'chromium')")
        pytest.skip("no Chromium binary (chromium / chromium-browser / google-chrome) on PATH; "
                    "install the Debian package 'chromium' to run the browser tests")
    return binary


def _browse(binary: str, page: str, workdir: Path, *, shot: Path | None = None, height: int = 1600,
            section: str | None = None, width: int = 1400) -> dict:
    """Open ``page`` (with the geometry probe) in headless Chromium; the probe's result."""
    script = _GEOMETRY % (_ONLY_SECTION % section if section else "")
    html_file = workdir / f"page-{section or 'all'}-{width}.html"
    html_file.write_text(page.replace("</body>", script + "</body>", 1), encoding="utf-8")
    with tempfile.TemporaryDirectory() as prof:
        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--disable-background-networking", "--disable-component-update", "--no-first-run",
                "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={prof}",
                "--virtual-time-budget=20000", f"--window-size={width},{height}", "--dump-dom"]
        if shot is not None:
            args.append(f"--screenshot={shot}")
        r = subprocess.run(args + [html_file.as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(r"<title>TLGEOM (.*?)</title>", r.stdout, flags=re.S)
    assert m, f"no geometry from the page (chromium rc={r.returncode}): {r.stderr[-2000:]}"
    import html as _html

    return json.loads(_html.unescape(m.group(1)))


@functools.cache
def _profiles() -> dict:
    """The embedded default models profiled on the default prompt set (once per session)."""
    import thermo_lens
    from thermo_lens import zoo
    from thermo_lens.experiments import study

    out = {}
    for name in zoo.DEFAULT:
        spec = study.model_from_name(name)
        out[name] = thermo_lens.profile(zoo.load(name), "paper25", name=name, lab=spec.lab, family=spec.family,
                                        source=f"zoo:{name}", progress=False)
    return out


def _figures() -> dict:
    """One figure of every type the package draws (the SAE figure needs an SAE: its layout is the
    shared one, checked through the others)."""
    from thermo_lens import views, zoo
    from thermo_lens.core import prompts
    from thermo_lens.report import _rows
    from thermo_lens.measures.robustness import robustness_from_gain
    from thermo_lens.measures.sheaf import sheaf_laplacian

    profs = _profiles()
    rows = _rows(profs)
    first = next(iter(profs.values()))
    ps = prompts.get("paper25")
    rob = {k: robustness_from_gain(p.gain, list(ps.categories), prompt_set=ps.name) for k, p in profs.items()}
    lap = sheaf_laplacian(zoo.load("gpt2-tiny-wd"), "The capital of France is Paris", 1, head=0)
    return {
        "layer_dynamics": views.layer_dynamics(profs),
        "anisotropy_plot": views.anisotropy_plot(profs),
        "robustness_plot": views.robustness_plot(rob),
        "spectral_scatter": views.spectral_scatter({k: p.spectral for k, p in profs.items()}),
        "spectral_heatmaps": views.spectral_heatmaps(first.spectral, name="gpt2-tiny-wd", attribution=first.attribution),
        "sheaf_trace_heatmap": views.sheaf_trace_heatmap(first.sheaf, name="gpt2-tiny-wd"),
        "sheaf_plot": views.sheaf_plot(lap),
        "l_star_plot": views.l_star_plot(profs),
        "attribution_heatmap": views.attribution_heatmap(first),
        "kleiber_plot": views.kleiber_plot(rows),
        "heritage_plot": views.heritage_plot(rows.assign(lab=["a", "a", "b"])),
        "hierarchy_plot": views.hierarchy_plot(rows.assign(family=[zoo.family(n) for n in rows["model"]]), by="family"),
        "reference_overlay_A": views.reference_overlay(rows, metric="A"),
        "reference_overlay_B": views.reference_overlay(rows, metric="B"),
        "metric_plot": views.metric_plot(first.write_norm, "write_norm"),
        "sweep_heatmap": views.sweep_heatmap(_sweep()),
        **_lab_figures(),
    }


def _sweep():
    """A small patching sweep on an embedded model (its legend and caption explain the marker)."""
    import torch

    from thermo_lens import zoo
    from thermo_lens.experiments.sweeps import patch_sweep

    g = torch.Generator().manual_seed(0)
    clean, corr = torch.randint(1, 250, (4, 6), generator=g), torch.randint(1, 250, (4, 6), generator=g)
    return patch_sweep(zoo.load("gpt2-tiny-wd"), clean, corr, "attn.hook_z", measure="total_amplification")


def _lab_figures() -> dict:
    """The heritage lab's two figures, from small made-up tables of its shape."""
    import numpy as np
    import pandas as pd

    from thermo_lens.experiments.lab import views as lab_views

    rng = np.random.default_rng(0)
    runs = pd.DataFrame([{"arm": arm, "seed": seed, "step": step, "token_scope": "all_but_first",
                          "last_block_gain": 1 + 0.1 * np.log1p(step) * (1 if arm == "wd=0.1" else -1) / 8
                          + rng.normal(0, 0.01)}
                         for arm in ("wd=0.1", "wd=0.0") for seed in range(3) for step in (0, 1, 4, 16, 64, 256, 1024)])
    effects = pd.DataFrame([{"metric": m, "knob": "weight_decay", "reference": 0.0, "level": lv, "effect": e,
                             "ci_low": e - 0.02, "ci_high": e + 0.02, "flips_regime": e > 0.05, "pvalue": 0.25,
                             "n_seeds": 3, "reference_mean": 1.0, "level_mean": 1.0 + e}
                            for m in ("last_block_gain", "penultimate_gain") for lv, e in ((0.1, 0.03), (0.3, 0.07))])
    return {"lab_gain_trajectories": lab_views.gain_trajectories(runs, "last_block_gain"),
            "lab_effect_sizes": lab_views.effect_sizes(effects)}


WIDTHS = (800, 1024, 1400)


def _page(figs: dict, *, as_report: bool = False) -> str:
    """The figures in one page: alone (plotly's own title and notes) or as the report shows them."""
    import plotly.offline

    from thermo_lens.report import _CSS
    from thermo_lens.views.page import FIGURE_CSS, figure_html

    if as_report:
        divs = "".join(figure_html(fig, name) for name, fig in figs.items())
        style = f"<style>{_CSS}{FIGURE_CSS}</style>"
    else:
        divs = "".join(f"<div style='margin:10px 0'>"
                       f"{fig.to_html(full_html=False, include_plotlyjs=False, div_id=name)}</div>"
                       for name, fig in figs.items())
        style = "<style>body{margin:0 40px}</style>"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'>{style}<script>{plotly.offline.get_plotlyjs()}"
            f"</script></head><body>{divs}</body></html>")


def _assert_clean(geom: dict, what: str) -> None:
    assert geom["overlaps"] == [], f"{what}: overlapping texts\n" + "\n".join(geom["overlaps"])
    assert geom["clipped"] == [], f"{what}: texts outside their figure\n" + "\n".join(geom["clipped"])
    assert geom["on_data"] == [], f"{what}: labels on the data\n" + "\n".join(geom["on_data"])
    assert geom["scroll_width"] <= geom["client_width"], f"{what}: the page scrolls sideways {geom}"


def test_no_text_overlaps_in_any_figure_type(chromium, tmp_path):
    figs = _figures()
    heights = {name: int(f.layout.height or 0) for name, f in figs.items()}
    assert min(heights.values()) >= 420, heights  # no squashed figure in a 1,400 px page
    fonts = {json.dumps(f.layout.font.to_plotly_json(), sort_keys=True) for f in figs.values()}
    assert len(fonts) == 1, "every figure uses the package style's font"
    doubled = {name: d for name, f in figs.items() if (d := [x for t in _figure_texts(f) for x in doubled_labels(t)])}
    assert doubled == {}, f"labels said twice: {doubled}"
    tall = sum(heights.values()) + 120 * len(figs)
    alone = _browse(chromium, _page(figs), tmp_path, height=tall, width=1400)
    assert alone["figures"] == len(figs) and alone["texts"] > 50 * len(figs) // 4
    _assert_clean(alone, "figures alone at 1400 px")
    for width in WIDTHS:
        geom = _browse(chromium, _page(figs, as_report=True), tmp_path, height=tall, width=width)
        assert geom["figures"] == len(figs)
        _assert_clean(geom, f"figures as in the report at {width} px")
    keep = os.environ.get("THERMO_LENS_SCREENSHOTS")
    if keep:  # one PNG per figure and width, to look at
        Path(keep).mkdir(parents=True, exist_ok=True)
        for name, fig in figs.items():
            for width in WIDTHS:
                _browse(chromium, _page({name: fig}, as_report=True), tmp_path, width=width,
                        shot=Path(keep) / f"figure-{name}-{width}.png", height=heights[name] + 160)


@pytest.mark.parametrize("width", WIDTHS)
def test_no_text_overlaps_in_the_default_report(chromium, tmp_path, width):
    page, ids = _report()
    geom = _browse(chromium, page, tmp_path, height=2000, width=width)
    assert geom["figures"] == len(ids) > 10
    _assert_clean(geom, f"the report at {width} px")
    keep = os.environ.get("THERMO_LENS_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for anchor in ("settings", "summary", "gain", "attribution", "l_star", "laws", "reference", "definitions"):
            _browse(chromium, page, tmp_path, shot=Path(keep) / f"report-{anchor}-{width}.png", height=1800,
                    section=anchor, width=width)


@functools.cache
def _report() -> tuple[str, list[str]]:
    from thermo_lens.report import render_report

    return render_report(_profiles(), panel=False)
