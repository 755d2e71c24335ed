"""One self-contained, offline HTML report for one model or a whole study directory.

``write_report(dir_or_profiles, output=None) -> Path`` writes a single HTML file with plotly.js
embedded **once** (every figure is drawn by that one copy), the circuitsvis bundle inlined in the
optional attention panel, and no reference to any network resource: it opens from a laptop on a
plane. Contents (each number with its definition):

1. header: settings (prompt set, BOS mode, token scope, dtypes, weights), models, failed models
   with their errors (from the study manifest);
2. per-model summary table (``ThermoProfile.to_row()``);
3. layer dynamics (block gain per layer, 95% CI bands; post-LN flagged) and input robustness by
   prompt category when the prompt set is categorised;
4. anisotropy profile;
5. spectral signature: ``||W_V||`` vs ``||W_O||`` scatter (colour per model, symbol per lab), per-head heatmaps per model;
6. sheaf traces per head and L* (empirical vs predicted);
7. cross-model laws (Kleiber, heritage, hierarchy; :mod:`thermo_lens.laws`) when there are >= 3
   models, else the reason they are not shown;
8. the overlay on the paper's published models (:mod:`thermo_lens.reference`), with the paper's
   definition stated;
9. a circuitsvis attention panel when a model can be booted locally (embedded zoo model or a local
   checkpoint directory); skipped otherwise, with the reason;
10. definitions: every definition used, generated from the modules that compute the numbers.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures"; :mod:`thermo_lens.definitions`.
"""

from __future__ import annotations

import datetime as _dt
import functools
import html
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, TypeAlias, Union

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from thermo_lens.core import registry
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.views.sections import Document

if TYPE_CHECKING:
    from thermo_lens.laws.base import LawResult
    from thermo_lens.measures.profile import ThermoProfile

    #: What a report is made from: a study or profile folder, a profile JSON file, a ThermoProfile, or
    #: a list or ``{name: profile}`` dict of them.
    ReportInput: TypeAlias = Union[str, os.PathLike[str], ThermoProfile, Sequence[ThermoProfile],
                                   Mapping[str, ThermoProfile]]

__all__ = ["write_report", "render_report", "ReportError"]

DEFAULT_NAME = "report.html"
STANDALONE_NAME = "thermo-lens-report.html"
#: Per-model figures (head heatmaps, sheaf traces) are drawn for at most this many models.
MAX_PER_MODEL_FIGURES = 12
#: "auto" panels boot a local checkpoint directory only when its weight files are this small.
MAX_AUTO_PANEL_BYTES = 500 * 2**20


class ReportError(ThermoLensInputError):
    """The report cannot be written from this input; the message says what to pass."""


class Page(Document, Protocol):
    """The report page an extra section writes into: the section renderers' document, plus
    :meth:`section` (a titled section, listed in the table of contents)."""

    def section(self, anchor: str, title: str) -> None: ...


esc = html.escape


# ---------------------------------------------------------------------------- inputs
def _load_inputs(dir_or_profiles: ReportInput) -> tuple[dict[str, Any], dict[str, Any], Path | None]:
    """``({id: profile}, manifest, directory or None)``."""
    if isinstance(dir_or_profiles, (str, os.PathLike)):
        path = Path(dir_or_profiles)
        if path.is_file() and path.suffix == ".json":
            from thermo_lens.measures.profile import ThermoProfile

            prof = ThermoProfile.from_json(path)
            return {path.stem: prof}, {"models": {}}, path.parent
        if not path.is_dir():
            raise ReportError(f"{path} is neither a study/profile directory nor a profile JSON file")
        from thermo_lens.experiments import study

        manifest = study.read_manifest(path)
        if not manifest.get("models"):
            raise ReportError(
                f"{path}: no {study.MANIFEST} with models here; run `thermo-lens profile --out {path}` or "
                f"`thermo-lens study SPEC --out {path}` first, or pass ThermoProfiles")
        current = manifest.get("study", {}).get("models")  # stale models of an earlier spec: left out
        if current is not None:
            manifest = {**manifest, "models": {k: v for k, v in manifest["models"].items() if k in current}}
        return study.load_profiles(path), manifest, path
    if isinstance(dir_or_profiles, Mapping):
        profiles: dict[str, Any] = {str(k): v for k, v in dir_or_profiles.items()}
    elif isinstance(dir_or_profiles, (list, tuple)):
        profiles = {}
        for i, p in enumerate(dir_or_profiles):
            key = str((getattr(p, "meta", None) or {}).get("name") or f"model-{i + 1}")
            while key in profiles:
                key += "'"
            profiles[key] = p
    elif hasattr(dir_or_profiles, "meta") and hasattr(dir_or_profiles, "gain"):
        profiles = {str(dir_or_profiles.meta.get("name") or "model"): dir_or_profiles}
    else:
        raise ReportError(
            f"write_report takes a study directory, a profile JSON file, a ThermoProfile or a list/dict of "
            f"them; got {type(dir_or_profiles).__name__}")
    for k, p in profiles.items():
        if not (hasattr(p, "meta") and hasattr(p, "gain")):
            from thermo_lens.core.validate import excerpt

            raise ReportError(f"{excerpt(k, 60)} is a {type(p).__name__}, not a ThermoProfile "
                              "(thermo_lens.profile(model, prompts))")
    if not profiles:
        raise ReportError("no profiles given")
    return profiles, {"models": {}}, None


def _meta(p: object) -> dict[str, Any]:
    m = getattr(p, "meta", None)
    return dict(m) if isinstance(m, Mapping) else {}


def _rows(profiles: dict[str, Any]) -> pd.DataFrame:
    try:
        from thermo_lens.measures.profile import profiles_frame

        df = profiles_frame(list(profiles.values()))
    except Exception:  # noqa: BLE001 - fall back to the rows themselves
        df = pd.DataFrame([dict(p.to_row()) for p in profiles.values()])
    if "model" not in df.columns:
        df.insert(0, "model", list(profiles))
    df["model"] = [str(m) if isinstance(m, str) and m else k for m, k in zip(df["model"], profiles)]
    return df.reset_index(drop=True)


# ---------------------------------------------------------------------------- html pieces
class _Doc:
    """Collects sections and figures; plotly.js goes in once, in the head."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.toc: list[tuple[str, str]] = []
        self.figure_ids: list[str] = []
        self.errors: list[str] = []

    def section(self, anchor: str, title: str) -> None:
        self.toc.append((anchor, title))
        self.parts.append(f'<h2 id="{anchor}">{esc(title)}</h2>')

    def html(self, text: str) -> None:
        self.parts.append(text)

    def p(self, text: str, cls: str = "") -> None:
        self.parts.append(f'<p class="{cls}">{esc(text)}</p>' if cls else f"<p>{esc(text)}</p>")

    def table(self, df: pd.DataFrame, *, left: Sequence[str] = ()) -> None:
        self.parts.append(_table(df, left=left))

    def figure(self, fid: str, build: Callable[[], go.Figure], caption: str = "") -> None:
        """Add a figure; a failure becomes a visible error box (the report is still written)."""
        try:
            fig = build()
        except Exception as e:  # noqa: BLE001 - one broken figure must not lose the report
            self.errors.append(f"{fid}: {type(e).__name__}: {e}")
            self.parts.append(f'<div class="error">Figure {esc(fid)} could not be drawn: '
                              f"{esc(type(e).__name__)}: {esc(str(e))}</div>")
            return
        from thermo_lens.views.page import figure_html

        fid = re.sub(r"[^A-Za-z0-9_-]", "-", fid)
        self.figure_ids.append(fid)
        # title, subtitle and notes as HTML text above / below the plot: they wrap with the window
        self.parts.append(figure_html(fig, fid, caption=caption))


_CSS = """
html{overflow-y:scroll} /* the scroll bar from the start: plotly sizes each figure before it would appear */
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0 auto;max-width:1320px;padding:16px 28px;color:#222}
h1{margin-bottom:4px} h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:36px}
h3{margin-top:22px} .sub{color:#555;margin-top:0}
table.tl{border-collapse:collapse;font-size:12.5px;margin:8px 0}
table.tl th,table.tl td{border:1px solid #ddd;padding:3px 8px;text-align:right;vertical-align:top}
table.tl th{background:#f4f6f8} table.tl td.l,table.tl th.l{text-align:left}
.caption{color:#555;font-size:12.5px;margin-top:2px} p,li,dd,.warn,.note{overflow-wrap:anywhere}
.warn{background:#fff6e0;border-left:4px solid #e8a400;padding:6px 10px}
.error{background:#fde8e8;border-left:4px solid #d62728;padding:6px 10px;font-family:monospace;white-space:pre-wrap}
.note{color:#555} nav ul{columns:2;font-size:13px} pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px}
dt{font-weight:bold;margin-top:6px} dd{margin-left:18px} .scroll{overflow-x:auto;max-width:100%}
table.glossary td{text-align:left}
details#definitions-page{margin:14px 0} details#definitions-page summary{cursor:pointer;font-weight:bold}
.defpage{max-width:980px} .defpage code{background:#f6f8fa;padding:0 2px}
.defpage table,.defpage pre{display:block;max-width:100%;overflow-x:auto}
@media (max-width:900px){body{padding:12px 14px} nav ul{columns:1}}
"""


def _table(df: pd.DataFrame, *, left: Sequence[str] = (), digits: int = 4, max_rows: int = 500) -> str:
    cols = list(df.columns)
    head = "".join(f'<th class="{"l" if c in left else ""}">{esc(str(c))}</th>' for c in cols)
    body = []
    for _, r in df.head(max_rows).iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, (float, np.floating)):
                s = "" if pd.isna(v) else f"{v:.{digits}g}"
            elif v is None or (not isinstance(v, (str, bool, list, tuple, dict)) and pd.isna(v)):
                s = ""
            else:
                s = str(v)
            cells.append(f'<td class="{"l" if c in left else ""}">{esc(s)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f'<p class="note">{len(df) - max_rows} more rows not shown</p>' if len(df) > max_rows else ""
    return (f'<div class="scroll"><table class="tl"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
            f"</table></div>{more}")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("thermo-lens")
    except Exception:  # noqa: BLE001
        return "dev"


# ---------------------------------------------------------------------------- sections
def _summary_cols() -> list[str]:
    """Columns of the per-model summary table: identity, the deciding gain with its CI and regime,
    every registered metric marked ``summary`` (:mod:`thermo_lens.core.registry`), then the settings."""
    metric_cols = [m.row for m in registry.metrics() if m.summary_table and m.row]
    return (["model", "lab", "family", "n_layers", "n_heads", "d_head", "rho", "gain", "gain_ci_low",
             "gain_ci_high", "regime"] + metric_cols
            + ["post_ln", "weights", "dtype", "prepend_bos", "token_scope"])


def _settings_table(profiles: dict[str, Any]) -> tuple[str, list[str]]:
    keys = ["prompt_set", "n_prompts", "prepend_bos", "token_scope", "dtype", "weights", "norm_placement",
            "source", "hooks"]
    rows, warn = [], []
    for k, p in profiles.items():
        m = _meta(p)
        rows.append({"model": k, **{c: m.get(c) for c in keys}})
        rows[-1]["hooks"] = rows[-1]["hooks"] or "none (clean run)"  # profiles stored before hooks were recorded
    df = pd.DataFrame(rows)
    df["prompt_set"] = [prompt_set_label(v) for v in df["prompt_set"]]
    for c in ("prompt_set", "prepend_bos", "token_scope", "weights"):
        vals = {str(v) for v in df[c]}
        if c == "prepend_bos" and len(vals) > 1 and _bos_from_host(profiles):
            continue  # one definition, "host", resolved per model: a note (see _bos_note), not an alarm
        if len(vals) > 1:
            warn.append(f"models were measured with different {c} ({', '.join(sorted(vals))}): "
                        "cross-model comparisons mix definitions")
    if any(str(v) == "processed" for v in df["weights"]):
        warn.append("some models have processed weights (LayerNorm folded / centered): residual norms and "
                    "W_V norms differ from the raw weights the paper measured")
    if any(str(v) != "none (clean run)" for v in df["hooks"]):
        warn.append("some models were measured under user hooks (ablation, patching, SAE): see the hooks column; "
                    "those numbers describe the intervened model, not the clean one")
    return _table(df, left=["model", "prompt_set", "prepend_bos", "token_scope", "dtype", "weights",
                            "norm_placement", "source", "hooks"]), warn


def prompt_set_label(name: object) -> str:
    """A prompt set's name as Settings and the tables show it: ``paper25 (grand_unified_twin_gpt2_gptj_25)``
    for a built-in set with a short alias (whichever of the two was recorded), else the name."""
    from thermo_lens.core import prompts

    if not isinstance(name, str):
        return "" if name is None else str(name)
    if name in prompts.ALIASES:
        return f"{name} ({prompts.ALIASES[name]})"
    alias = next((a for a, c in prompts.ALIASES.items() if c == name), None)
    return f"{alias} ({name})" if alias else name


def _bos_from_host(profiles: dict[str, Any]) -> bool:
    """Whether every model asked for ``prepend_bos="host"`` (the default): then differing
    resolved values are each host's own tokenization, one definition."""
    asked = {str(_meta(p).get("prepend_bos_requested")) for p in profiles.values()}
    return asked == {"host"}


def _bos_note(profiles: dict[str, Any]) -> str | None:
    """Per-model BOS as ``"host"`` resolved it, when it differs between models (a note, not a warning)."""
    if not _bos_from_host(profiles):
        return None
    by: dict[str, list[str]] = {}
    for k, p in profiles.items():
        by.setdefault(str(_meta(p).get("prepend_bos")), []).append(k)
    if len(by) < 2:
        return None
    from thermo_lens.views._common import bos_text

    parts = "; ".join(f"{bos_text(v)} for {', '.join(ks)}" for v, ks in by.items())
    scopes = {str(_meta(p).get("token_scope")) for p in profiles.values()}
    first = (" With token scope all_but_first the first position is left out either way (the BOS token "
             "where there is one, else the first word), so the gains average the same words but one."
             if scopes == {"all_but_first"} else "")
    return (f"BOS: every model was tokenized as its own host does (prepend_bos='host', the default): {parts} "
            f"(each model's default_prepend_bos; Pythia-style models are trained without a BOS).{first} "
            "For one setting across models pass --prepend-bos true or false (prepend_bos=True / False).")


def _failed(manifest: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for mid, e in (manifest.get("models") or {}).items():
        e = e if isinstance(e, dict) else {}  # a hand-edited manifest: whatever an entry holds
        if e.get("status") != "done":
            err = str(e.get("error") or "").strip()  # (as the study reader reads it: any JSON value)
            rows.append({"model": mid, "status": e.get("status"), "source": e.get("source"),
                         "error": err.splitlines()[0][:300] if err else ""})
    return pd.DataFrame(rows, columns=["model", "status", "source", "error"])


def _laws_section(doc: _Doc, rows: pd.DataFrame) -> None:

    doc.section("laws", "Cross-model laws (computed, with p-values)")
    n = len(rows)
    doc.p(_laws_intro(rows), "note")
    if n < 3:
        doc.html(f'<p class="warn">Only {n} model(s): the laws (Kleiber correlation, heritage Fisher tests, '
                 "hierarchy) need at least 3 models, so they are not computed on your models alone. Run a study "
                 "with more models (`thermo-lens study SPEC --out DIR`).</p>")
    else:
        doc.html(f"<h3>On your {n} models alone</h3>")
        _own_laws(doc, rows)
    _paper_plus_laws(doc, rows)


def _laws_intro(rows: pd.DataFrame) -> str:
    """What the laws section computes, on which table, in plain words."""
    from thermo_lens.paper import reference

    n = len(rows)
    with_lab = int(rows["lab"].notna().sum()) if "lab" in rows.columns else 0
    by = str(rows["gain_by"].iloc[0]) if "gain_by" in rows.columns and n else "gain"
    scopes = ", ".join(sorted({str(v) for v in rows.get("token_scope", pd.Series(dtype=object)).dropna()})) or "?"
    bos = ", ".join(sorted({str(v) for v in rows.get("prepend_bos", pd.Series(dtype=object)).dropna()})) or "?"
    return (f"The laws are computed twice. First on your {n} model(s) alone"
            + (" (below: each law says why when these models give it nothing to test, e.g. one depth or one lab)"
               if n >= 3 else "")
            + f". Then on the paper's published table plus your models: Kleiber on the paper's "
            f"{len(reference.pythia_family())} Pythia models plus your {n}; heritage and the lab hierarchy on its "
            f"{len(reference.lab_survey())}-model lab survey plus your {with_lab} model(s) with a lab (crowding on "
            "the same tables: thermo_lens.paper.findings.law_results). Your gain is "
            f"{by} measured with token scope {scopes} and BOS {bos}; the paper's gains are its metric A (the "
            "penultimate block, last token, fp16, BOS as the HF tokenizer adds it), so your points are like for like "
            "only if you profiled with token_scope='last' and prepend_bos='tokenizer'.")


def _paper_plus_laws(doc: _Doc, rows: pd.DataFrame) -> None:
    """Kleiber, heritage and the lab hierarchy on the paper's tables with the user's rows added
    (what :func:`thermo_lens.paper.findings.law_results` computes for them; its crowding scopes,
    a few seconds of permutation tests, are left to that function)."""
    from thermo_lens import laws
    from thermo_lens.paper import reference

    doc.html("<h3>Your models added to the paper's published tables</h3>")
    need = ["model", "n_layers", "n_heads", "d_head", "rho", "gain", "n_prompts"]
    if not set(need + ["gain_sd"]) <= set(rows.columns):
        doc.p("Not computed: the profiles lack a gain with its spread.", "warn")
        return
    extra = rows[need + (["lab"] if "lab" in rows.columns else [])].assign(std=rows["gain_sd"], std_ddof=1)
    extra = extra[pd.to_numeric(extra["gain"], errors="coerce").notna()].reset_index(drop=True)
    with_lab = extra[extra["lab"].notna()] if "lab" in extra.columns else extra.iloc[:0]
    survey = pd.concat([reference.lab_survey(), with_lab], ignore_index=True)
    runs: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("Kleiber (the paper's Pythia sweep + yours)",
         lambda: laws.kleiber(pd.concat([reference.pythia_family(), extra], ignore_index=True))),
        ("Heritage (the paper's lab survey + yours with a lab)", lambda: laws.heritage(survey)),
        ("Hierarchy by lab (the paper's lab survey + yours with a lab)", lambda: laws.hierarchy(survey, by="lab")),
    )
    for title, run in runs:
        try:
            doc.html(f"<h4>{esc(title)}</h4><pre>{esc(run().summary())}</pre>")
        except (ValueError, KeyError) as e:
            doc.html(f'<h4>{esc(title)}</h4><p class="warn">Not computed: {esc(str(e))}</p>')
    doc.p("The crowding rule on the paper's scopes plus yours (within Pythia, across the survey, all models): "
          "thermo_lens.paper.findings.law_results(extra=summary_table)['crowding'] (permutation tests, seconds).",
          "note")


def _own_laws(doc: _Doc, rows: pd.DataFrame) -> None:
    from thermo_lens import laws
    from thermo_lens import views

    gain_def = ""
    by_col = "gain_by" if "gain_by" in rows.columns else ("gain_summary" if "gain_summary" in rows.columns else None)
    if by_col:
        gain_def = f" (column gain = {', '.join(map(str, dict.fromkeys(rows[by_col])))}, with its 95% CI)"
    doc.p(f"One row per model{gain_def}; regimes from each model's 95% CI, never from the lab name "
          "(thermo_lens.definitions §5).", "note")
    doc.html("<h4>Kleiber: gain vs depth with the bound 10^(1/L)</h4>")
    depths = sorted({int(v) for v in pd.to_numeric(rows["n_layers"], errors="coerce").dropna()})
    if len(depths) == 1:
        _one_depth_kleiber(doc, rows, depths[0])
    else:
        _kleiber(doc, rows)
    doc.html("<h4>Heritage: lab vs regime</h4>")
    labs = rows["lab"].dropna().astype(str).unique() if "lab" in rows.columns else []
    if len(labs) < 2:
        doc.html('<p class="note">Heritage needs at least 2 labs with a recorded lab; '
                 f"this report has {len(labs)} ({', '.join(map(str, labs)) or 'none'}). Give each model a "
                 "lab in the study spec.</p>")
    else:
        sub = rows[rows["lab"].notna()].reset_index(drop=True)
        doc.figure("fig-heritage", lambda: views.heritage_plot(sub, gain="gain"))
        try:
            h = laws.heritage(sub, gain="gain")
            doc.html(f"<pre>{esc(h.summary())}</pre>" + _tests_table(h))
        except ValueError as e:
            doc.html(f'<p class="warn">Heritage statistics not computed: {esc(str(e))}</p>')
    doc.html("<h4>Crowding: head density rho vs regime</h4>")
    try:
        c = laws.crowding(rows, gain="gain")
        doc.p(f"Rule rho > rho_crit => dampener: {c.verdict()}. Read within one family and across "
              "families the verdict can differ; where rho and depth correlate the rule may be reading depth.")
        doc.html(f"<pre>{esc(c.summary())}</pre>" + _tests_table(c))
    except ValueError as e:
        doc.html(f'<p class="warn">Crowding not computed: {esc(str(e))}</p>')
    doc.html("<h4>Hierarchy: groups ranked by mean gain</h4>")
    if len(labs) >= 2:
        by, table = "lab", rows[rows["lab"].notna()].reset_index(drop=True)
    else:  # group by family instead: the recorded one, else derived from the model name
        by, table = "family", rows.copy()
        fam = table["family"] if "family" in table.columns else pd.Series([None] * len(table))
        table["family"] = [f if isinstance(f, str) and f else laws.family_of(m)
                           for f, m in zip(fam, table["model"])]
    groups = table[by].astype(str).unique()
    if len(groups) < 2:
        doc.html(f'<p class="note">Hierarchy needs at least 2 groups ({by}); all models are in {esc(str(groups[0]))}.</p>')
    else:
        doc.figure("fig-hierarchy", lambda: views.hierarchy_plot(table, gain="gain", by=by))


def _kleiber(doc: _Doc, rows: pd.DataFrame) -> None:
    """Kleiber figures (the deciding gain, and G_L / G_{L-1} where they differ) and statistics."""
    from thermo_lens import laws
    from thermo_lens import views

    doc.figure("fig-kleiber", lambda: views.kleiber_plot(rows, gain="gain"))
    for col in ("penultimate_gain", "last_block_gain"):
        if col in rows.columns and not np.allclose(pd.to_numeric(rows[col], errors="coerce").to_numpy(float),
                                                   pd.to_numeric(rows["gain"], errors="coerce").to_numpy(float),
                                                   equal_nan=True):
            doc.figure(f"fig-kleiber-{col}", functools.partial(views.kleiber_plot, rows, gain=col),
                       f"the same with {col} (the paper's Fig. 1 used the penultimate block)")
    try:
        k = laws.kleiber(rows, gain="gain", rho="rho" if "rho" in rows.columns else None)
        doc.html(f"<pre>{esc(k.summary())}</pre>" + _tests_table(k))
    except ValueError as e:
        doc.html(f'<p class="note">Kleiber statistics not computed on these models: {esc(str(e))}</p>')


def _one_depth_kleiber(doc: _Doc, rows: pd.DataFrame, depth: int) -> None:
    """Models of one depth: no Kleiber figure (every point would sit at one x) and no test; their gains
    beside the bound at that depth, and where to see them among models of other depths."""
    bound = 10.0 ** (1.0 / depth)
    doc.p(f"All {len(rows)} models have depth L = {depth}, so gain against depth has nothing to show on them "
          f"alone (every point would sit at L = {depth}) and no correlation to test. Their gains beside the bound "
          f"G_max = 10^(1/L) = {bound:.4f} at that depth are below; see them among the paper's models of other "
          "depths under 'Your models among the paper's published models', and the Kleiber test on the paper's "
          "Pythia sweep plus yours further down.", "note")
    cols = [c for c in ("model", "n_layers", "gain", "gain_ci_low", "gain_ci_high", "penultimate_gain",
                        "last_block_gain") if c in rows.columns]
    table = rows[cols].assign(bound=bound)
    table["above_bound"] = pd.to_numeric(table["gain"], errors="coerce") > bound
    doc.table(table, left=["model"])


def _metric_glossary_html() -> str:
    """Every registered metric: name, symbol, shape, unit, formula and reference."""
    rows = "".join(
        f"<tr><td><code>{esc(m.name)}</code></td><td>{esc(m.symbol)}</td><td>[{esc(', '.join(m.dims))}]</td>"
        f"<td>{esc(m.unit)}</td><td>{esc(m.formula)}</td><td>{esc(m.reference)}</td></tr>"
        for m in registry.metrics())
    return ("<h3>Metrics</h3><div class='scroll'><table class='tl glossary'><thead><tr><th>name</th><th>symbol</th>"
            f"<th>shape</th><th>unit</th><th>definition</th><th>reference</th></tr></thead><tbody>{rows}</tbody>"
            "</table></div>")


def _tests_table(result: LawResult) -> str:
    """A law result's tests: effect with CI, small-n p, Holm, leave-one-out (one row per test)."""
    df = result.tests_frame()
    if df.empty:
        return ""
    cols = ["name", "role", "n", "effect", "effect_value", "ci_low", "ci_high", "pvalue", "pvalue_method",
            "pvalue_holm", "loo_model", "loo_statistic", "loo_worst_model", "loo_worst_pvalue", "note"]
    return _table(df[cols], left=("name", "role", "effect", "pvalue_method", "loo_model", "loo_worst_model", "note"))


def _definitions_html() -> str:
    from thermo_lens import definitions
    from thermo_lens.measures import depth, sheaf
    from thermo_lens.paper.metrics import PAPER_METRICS
    from thermo_lens.core.tokens import TOKEN_SCOPES
    from thermo_lens.views._common import POST_LN_NOTE
    from thermo_lens.views.laws import PAPER_DEFINITION_NOTE

    items: list[tuple[str, str]] = [
        ("Residual states", "x_0 = blocks.0.hook_resid_pre (block-0 input), x_l = blocks.{l-1}.hook_resid_post "
                            "(block l output), l = 1..L; the final norm is never part of any x_l. Norms are L2 "
                            "over d_model per token, always in float32."),
        ("Block gain", "block layer (0-based, blocks.{layer}): ||resid_post_layer|| / ||resid_pre_layer||, reduced "
                       "over tokens by the token scope; the paper's G_l = ||x_l|| / ||x_{l-1}|| is layer = l - 1 "
                       "(G_L, paper metric B, is the last block, layer L - 1)."),
        ("Gain attribution", "per block, ||x_out||^2 - ||x_in||^2 = sum_h <z_h W_O^h, x_out + x_in> + "
                             "<mlp_out - b_out, x_out + x_in> + <b_O + b_out, x_out + x_in>, exactly (pre-LN "
                             "blocks); a head's term is its share of the squared-norm change."),
        ("Hooks", "user hooks of a run (ablation, patching, SAE) are recorded with each result: hook point, "
                  "function, and the source of inserted activations."),
    ]
    items += [(f"token scope '{k}'", v) for k, v in TOKEN_SCOPES.items()]
    items += [
        ("Across prompts", "mean; SD with ddof=1 (the paper's files store ddof=0); SE = SD / sqrt(n); 95% "
                           "Student-t CI. Regime: expander if the CI of the deciding summary lies above 1, "
                           "dampener if below, neutral if it contains 1; never from a lab name."),
        ("BOS modes", "True: the tokenizer's BOS id prepended (TransformerLens default); False: no BOS; "
                      "'tokenizer': the special tokens the HF tokenizer adds (the paper's protocol)."),
        ("Post-LN", POST_LN_NOTE),
    ]
    items += [("rho", "dimensional crowding n_heads / d_head, with the configured d_head")]
    items += [
        ("Sheaf", "node stalks R^d_model per token, edge stalks R^d_head per token pair, restriction maps "
                  "rho_ij = sqrt(c_ij) W_V (c = A directed, (A + A^T)/2 symmetrized); L = delta^T delta = "
                  "M (x) W_V W_V^T with M_ii = sum_{j != i} c_ij, M_ij = -sqrt(c_ij c_ji)."),
    ]
    items += [(f"sheaf trace '{k}'", v) for k, v in sheaf.TRACE_DEFINITIONS.items()]
    items += [(f"L* '{k}'", v) for k, v in depth.L_STAR_VARIANTS.items()]
    items += [("L* layer indexing", depth.LAYER_INDEXING)]
    items += [(f"L* error '{k}'", v) for k, v in depth.ERROR_METRICS.items()]
    items += [("Kleiber bound", "G_max = 10^(1/L) (the paper's eq. 3: G_max^L = 10); correlations of gain vs L "
                                "and vs rho with Pearson and Spearman p-values.")]
    items += [(f"paper metric {k}", f"{m.reference_measurement} = thermo-lens {m.summary} with token_scope="
                                    f"{m.token_scope!r}, prepend_bos={m.prepend_bos!r}. Paper: {m.paper_definition}. "
                                    f"{m.note}") for k, m in PAPER_METRICS.items()]
    items += [("Reference overlay", PAPER_DEFINITION_NOTE.format(
        measurement="(per metric)", definition="see the paper metrics above", scope="last token",
        dtypes="fp16 (some files bf16/fp32)"))]
    from thermo_lens.views.markdown import to_html

    intro = ("<p class='note'>The full definitions page is embedded below (it ships with thermo-lens as "
             "<code>definitions.md</code>; <code>python -m thermo_lens.definitions</code> prints it; docstrings cite "
             "its sections as <code>thermo_lens.definitions §N</code>).</p>")
    options = "<h3>Settings and conventions</h3><dl>" + "".join(
        f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items) + "</dl>"
    page = ("<details id='definitions-page'><summary>The definitions page (thermo_lens.definitions)</summary>"
            f"<div class='defpage'>{to_html(definitions.text())}</div></details>")
    return intro + _metric_glossary_html() + options + page


def _panel_model(profiles: dict[str, Any], panel: object) -> tuple[Any, str, Any] | tuple[None, str, None]:
    """``(model, reason, profile)`` for the attention panel, or ``(None, why not, None)``."""
    if panel is False or panel is None:
        return None, "attention panel disabled (panel=False)", None
    if not isinstance(panel, (bool, str)):  # a loaded model was passed
        first = next(iter(profiles.values()))
        return panel, "model passed by the caller", first
    if panel not in (True, "auto"):
        raise ReportError(f"panel must be 'auto', True, False or a loaded model, got {panel!r}")
    tried = []
    for k, p in profiles.items():
        src = str(_meta(p).get("source") or "")
        try:
            if src.startswith("zoo:"):
                from thermo_lens import zoo

                return zoo.load(src[4:]), f"embedded model {src[4:]}", p
            d = Path(src)
            if src and d.is_dir() and (d / "config.json").is_file():
                size = sum(f.stat().st_size for f in d.iterdir() if f.suffix in (".safetensors", ".bin"))
                if panel == "auto" and size > MAX_AUTO_PANEL_BYTES:
                    tried.append(f"{k}: local checkpoint is {size / 2**20:.0f} MB (> {MAX_AUTO_PANEL_BYTES // 2**20} MB "
                                 "for panel='auto')")
                    continue
                from transformer_lens.model_bridge import TransformerBridge

                return TransformerBridge.boot_transformers(str(d)), f"local checkpoint {d}", p
            tried.append(f"{k}: source {src or '(none)'} is not an embedded model or a local checkpoint")
        except Exception as e:  # noqa: BLE001 - the panel is optional
            tried.append(f"{k}: could not boot {src}: {type(e).__name__}: {e}")
    why = "no model could be booted offline for the attention panel (" + "; ".join(tried[:5]) + ")"
    if panel is True:
        raise ReportError(why)
    return None, why, None


# ---------------------------------------------------------------------------- the report
def _title(title: str | None, study_info: dict[str, Any], ids: list[str]) -> str:
    if title:
        return title
    if study_info.get("name"):
        return f"thermo-lens report: {study_info.get('name')}"
    return f"thermo-lens report: {', '.join(ids[:4])}{' ...' if len(ids) > 4 else ''}"


def _header(doc: _Doc, name: str, n_profiles: int, n_failed: int, directory: Path | None) -> None:
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    doc.html(f"<h1>{esc(name)}</h1><p class='sub'>{n_profiles} model(s) profiled"
             f"{f', {n_failed} failed' if n_failed else ''}; generated {now} by thermo-lens {esc(_version())}"
             f"{f' from {esc(str(directory))}' if directory else ''}. Measurements follow the thermo-lens definitions page; "
             "D'Elia (2026), \"Thermodynamic Constraints in Transformer Architectures\". Every figure's hover "
             "text names the definition behind each number; see <a href='#definitions'>Definitions</a>.</p>")
    doc.html("<!--TOC-->")


def _settings_section(doc: _Doc, study_info: dict[str, Any], profiles: dict[str, Any], failed: pd.DataFrame) -> None:
    doc.section("settings", "Settings")
    if study_info.get("settings"):
        shown = {k: (prompt_set_label(v) if k == "prompts" and isinstance(v, str) else v)
                 for k, v in study_info["settings"].items()}
        doc.html("<p>Study settings: <code>" + esc(", ".join(f"{k}={v!r}" for k, v in shown.items()))
                 + "</code></p>")
    if profiles:
        table, warns = _settings_table(profiles)
        for w in warns:
            doc.html(f'<p class="warn">⚠ {esc(w)}</p>')
        bos = _bos_note(profiles)
        if bos:
            doc.p(bos, "note")
        doc.html(table)
    if len(failed):
        doc.html("<h3>Failed models</h3>")
        doc.html(_table(failed, left=["model", "status", "source", "error"]))
    if not profiles:
        doc.html('<p class="warn">No finished profiles: nothing to plot.</p>')


def _summary_section(doc: _Doc, profiles: dict[str, Any], rows: pd.DataFrame) -> None:
    from thermo_lens import views

    doc.section("summary", "Per-model summary")
    cols = [c for c in _summary_cols() if c in rows.columns]
    doc.html(_table(rows[cols], left=["model", "lab", "family", "regime", "weights", "dtype", "prepend_bos",
                                      "token_scope"]))
    doc.html('<p class="note">' + esc(
        "gain = the summary that decided the regime (see its CI); last_block_gain = G_L (paper metric B); "
        "penultimate_gain = G_{L-1} (paper metric A); per-head spectral metrics = means over layers and heads; "
        "mean_trace = mean over layers of the layer sheaf trace. Every column is defined under ")
        + '<a href="#definitions">Definitions</a>.</p>')
    post = [k for k, p in profiles.items() if _meta(p).get("post_ln")]
    if post:
        doc.html(f'<p class="warn">⚠ post-LN model(s): {esc(", ".join(post))}. {esc(views.POST_LN_NOTE)}</p>')


def _measurement_sections(doc: _Doc, profiles: dict[str, Any]) -> None:
    """One section per registered measurement the profiles hold (or skipped, with the reason), in
    the registry's order; the figures come from the section registered in
    :mod:`thermo_lens.views.sections` for it, or its metrics drawn from their shapes."""
    from thermo_lens.views import sections

    for m in registry.measurements():
        results = {k: r for k, p in profiles.items() if (r := getattr(p, m.name, None)) is not None}
        skipped = {k: why for k, p in profiles.items() if (why := (_meta(p).get("skipped") or {}).get(m.name))}
        if not results and not skipped:
            continue
        doc.section(m.name, m.title)
        doc.p(f"{m.summary[:1].upper()}{m.summary[1:]}. Metrics: "
              + ", ".join(x.name for x in m.metric_list()) + " (defined under Definitions).", "note")
        for k, why in skipped.items():
            doc.p(f"{k}: not measured: {why}", "warn")
        if results:
            sections.section_for(m.name)(doc, results, profiles)


def _reference_section(doc: _Doc, rows: pd.DataFrame) -> None:
    from thermo_lens import views

    doc.section("reference", "Your models among the paper's published models")
    doc.p("The paper's numbers come from its result files (thermo_lens.reference) and use ITS definitions: "
          "metric A = the penultimate block's gain G_{L-1}, last token, fp16, BOS as the HF tokenizer adds it; "
          "metric B = the true last block G_L, hook-based, last token, fp16/bf16. Your points compare like "
          "with like only if your profiles used token_scope='last' and prepend_bos='tokenizer' (the figure "
          "title and hover say whether they did; hollow stars: not like for like). thermo-lens takes norms "
          "in float32.", "note")
    for metric in ("A", "B"):
        doc.figure(f"fig-reference-{metric}", functools.partial(views.reference_overlay, rows, metric=metric))


def _panel_section(doc: _Doc, profiles: dict[str, Any], panel: object, panel_layer: int | None) -> None:
    doc.section("panel", "Attention patterns and per-head metrics (circuitsvis)")
    if not profiles:
        doc.p("Skipped: no profiles.", "note")
        return
    model, why, prof = _panel_model(profiles, panel)  # a ReportError propagates
    if model is None:
        doc.p(f"Skipped: {why}.", "note")
        return
    try:
        from thermo_lens import views
        from thermo_lens.core.model import as_view

        meta = _meta(prof)
        g = getattr(prof, "gain", None)
        prompt = (g.prompts[0] if g is not None and g.prompts else "The capital of France is Paris")
        bos = meta.get("prepend_bos", True)
        bos = {"True": True, "False": False}.get(str(bos), bos)
        view = as_view(model)
        layer = panel_layer if panel_layer is not None else view.n_layers // 2
        pnl = views.attention_panel(model, prompt, layer, prepend_bos=bos,
                                    token_scope=meta.get("token_scope") or "all_but_first")
        doc.p(f"{why}; layer {layer}; prompt 0 of the profile's prompt set.", "note")
        doc.html(pnl.html)
    except Exception as e:  # noqa: BLE001 - optional section
        doc.errors.append(f"panel: {type(e).__name__}: {e}")
        doc.html(f'<div class="error">The attention panel could not be drawn: {esc(type(e).__name__)}: '
                 f"{esc(str(e))}</div>")


def _definitions_section(doc: _Doc) -> None:
    doc.section("definitions", "Definitions")
    doc.html(_definitions_html())
    if doc.errors:
        doc.html("<h3>Problems while writing this report</h3><pre>" + esc("\n".join(doc.errors)) + "</pre>")


def _page(doc: _Doc, name: str) -> str:
    """The whole HTML page: table of contents, sections, and plotly.js embedded once."""
    import plotly.offline

    from thermo_lens.views.page import FIGURE_CSS

    toc = "<nav><ul>" + "".join(f'<li><a href="#{a}">{esc(t)}</a></li>' for a, t in doc.toc) + "</ul></nav>"
    body = "\n".join(doc.parts).replace("<!--TOC-->", toc, 1)
    plotly_js = plotly.offline.get_plotlyjs()
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>\n"
        f"<meta name='generator' content='thermo-lens {esc(_version())}'>\n"
        f"<meta name='thermo-lens-figures' content='{len(doc.figure_ids)}'>\n"
        f"<title>{esc(name)}</title>\n<style>{_CSS}{FIGURE_CSS}</style>\n"
        "<script type='text/javascript'>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>\n"
        f"<script type='text/javascript' id='plotly-js'>{plotly_js}</script>\n"
        f"</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def render_report(dir_or_profiles: ReportInput, *, title: str | None = None, panel: object = "auto",
                  panel_layer: int | None = None, sections: Sequence[Callable[[Page], None]] = ()) -> tuple[str, list[str]]:
    """The report's HTML text and the ids of its plotly figures (see :func:`write_report`)."""
    profiles, manifest, directory = _load_inputs(dir_or_profiles)
    study_info = manifest.get("study") or {}
    doc = _Doc()
    rows = _rows(profiles) if profiles else pd.DataFrame()
    failed = _failed(manifest)
    name = _title(title, study_info, list(profiles))
    _header(doc, name, len(profiles), len(failed), directory)
    _settings_section(doc, study_info, profiles, failed)
    if profiles:
        _summary_section(doc, profiles, rows)
        _measurement_sections(doc, profiles)
        _laws_section(doc, rows)
        for extra in sections:  # e.g. the heritage lab's (thermo_lens.experiments.lab.report_section)
            extra(doc)
        _reference_section(doc, rows)
    _panel_section(doc, profiles, panel, panel_layer)
    _definitions_section(doc)
    return _page(doc, name), list(doc.figure_ids)


def write_report(dir_or_profiles: ReportInput, output: str | os.PathLike | None = None, *, title: str | None = None,
                 panel: object = "auto", panel_layer: int | None = None,
                 sections: Sequence[Callable[[Page], None]] = ()) -> Path:
    """Write ONE self-contained offline HTML report; returns its path.

    Args:
        dir_or_profiles: a study / profile directory (``study.load_profiles`` + the manifest: failed
            models are listed with their errors), a profile JSON file, a ``ThermoProfile``, or a list /
            dict of them.
        output: the HTML file to write. Default ``DIR/report.html`` for a directory, else
            ``./thermo-lens-report.html``.
        title: report title (default from the study name or the models).
        panel: the circuitsvis attention panel: ``"auto"`` (the default: boot an embedded zoo model or a small local
            checkpoint named by a profile's ``meta["source"]``; skip with the reason otherwise),
            ``True`` (must draw it: error if no model can be booted), ``False`` (skip) or a loaded
            TransformerLens model.
        panel_layer: layer shown in the panel (default ``n_layers // 2``).
        sections: extra sections (default ``()``), written after the cross-model laws: functions ``fn(doc)`` that
            call ``doc.section(anchor, title)``, ``doc.p``, ``doc.html``, ``doc.table`` and
            ``doc.figure`` (the heritage lab adds its own this way).

    plotly.js is embedded once in the page head (``plotly.offline.get_plotlyjs()``) and every figure
    is written with ``include_plotlyjs=False``; the circuitsvis bundle is inlined in the panel. No
    ``<script src=...>`` or stylesheet link points anywhere: the file works offline.
    """
    if output is None:
        if isinstance(dir_or_profiles, (str, os.PathLike)) and Path(dir_or_profiles).is_dir():
            output = Path(dir_or_profiles) / DEFAULT_NAME
        else:
            output = Path.cwd() / STANDALONE_NAME
    out = Path(output)
    if out.is_dir():
        out = out / DEFAULT_NAME
    if not out.parent.is_dir():  # checked before the (slow) rendering too
        raise ReportError(f"cannot write {out}: folder {out.parent} does not exist or is not a folder")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN means over empty CIs are expected
        page, _ = render_report(dir_or_profiles, title=title, panel=panel, panel_layer=panel_layer, sections=sections)
    if not out.parent.is_dir():  # never create folders (up to the root) for a mistyped path
        raise ReportError(f"cannot write {out}: folder {out.parent} does not exist or is not a folder")
    from thermo_lens.core.safe_io import atomic_write_text

    atomic_write_text(out, page)  # temp file in the same folder + rename; never follows a symlink
    return out
