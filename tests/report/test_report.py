"""The offline HTML report: one file, plotly.js exactly once, no network references, every
figure's div present, failed models listed, laws only with >= 3 models, the circuitsvis panel."""

import re

import plotly.offline
import pytest

from thermo_lens import report, zoo
from thermo_lens.experiments import study
from thermo_lens.measures.profile import ThermoProfile, profile
from thermo_lens.report import ReportError, render_report, write_report

PROMPTS = {"Factual": ["The capital of France is Paris", "Water boils at one hundred degrees"],
           "Nonsense": ["Table sky run blue jump", "Colorless green ideas sleep furiously"]}

# (id, fixture arch, lab). gpt2's source is its local checkpoint directory (bootable offline, so
# panel="auto" draws its attention panel); the other two name no bootable source.
MODELS = (("gpt2-local", "gpt2", "OpenAI-like"), ("opt-postln", "opt_postln", "Meta"),
          ("llama-gqa", "llama_gqa", "Meta"))

_CACHE: dict = {}


def build_profiles(bridge, checkpoint_dir) -> dict:
    """Three ThermoProfiles (GPT-2-like with a local checkpoint source, post-LN OPT, GQA LLaMA),
    built once per session and shared with test_report_browser.py."""
    if "profiles" not in _CACHE:
        out = {}
        for mid, arch, lab in MODELS:
            source = str(checkpoint_dir(arch)) if arch == "gpt2" else f"fixture:{arch}"
            out[mid] = profile(bridge(arch), PROMPTS, name=mid, lab=lab, source=source, progress=False)
        _CACHE["profiles"] = out
    return _CACHE["profiles"]


@pytest.fixture(scope="module")
def profiles(bridge, checkpoint_dir):
    return build_profiles(bridge, checkpoint_dir)


def _scripts_with_src(page: str) -> list[str]:
    return re.findall(r"<script\b[^>]*\bsrc\s*=[^>]*>", page, flags=re.I)


def assert_offline_single_file(page: str, ids: list[str]) -> None:
    js = plotly.offline.get_plotlyjs()
    assert page.count(js) == 1, "plotly.js must be embedded exactly once"
    assert page.count("plotly.js v") == js.count("plotly.js v")
    assert _scripts_with_src(page) == [], "no <script src=...>: everything is inline"
    assert not re.search(r"<link\b[^>]*href\s*=\s*['\"]?https?:", page, flags=re.I)
    assert not re.search(r"<(iframe|img)\b[^>]*src\s*=\s*['\"]?https?:", page, flags=re.I)
    assert "@import" not in page.split("<script", 1)[0]
    assert "cdn.plot.ly/plotly" not in page and "unpkg.com" not in page
    assert len(ids) == len(set(ids)) and len(ids) > 0
    for fid in ids:
        assert page.count(f'id="{fid}"') == 1, fid
    assert page.count('class="plotly-graph-div"') == len(ids)
    assert f"<meta name='thermo-lens-figures' content='{len(ids)}'>" in page


@pytest.mark.slow  # renders whole reports (seconds each); runs in the full suite
def test_report_of_three_profiles(profiles, tmp_path):
    page, ids = render_report(profiles, panel=False)
    assert_offline_single_file(page, ids)
    expected = {"fig-dynamics", "fig-robustness", "fig-anisotropy",
                "fig-spectral-scatter", "fig-spectral-models", "fig-heads-0", "fig-heads-1", "fig-heads-2",
                "fig-sheaf-0", "fig-sheaf-1", "fig-sheaf-2", "fig-lstar",
                "fig-heritage", "fig-hierarchy",
                "fig-reference-A", "fig-reference-B"}
    assert expected <= set(ids), expected - set(ids)
    # header: settings and definitions; summary table; post-LN warning; no figure failed
    for words in ("Settings", "Per-model summary", "Definitions", "token scope &#x27;all_but_first&#x27;",
                  "ddof=1", "post-LN model(s): opt-postln", "Kleiber", "Heritage",
                  "L* = L * (0.11 + 0.012 L + 4.9 / H)", "paper metric A"):
        assert words in page, words
    # all three are 3 layers deep: no Kleiber figure (every point at L = 3) and no test, and the report
    # says so once, with the gains beside the bound at that depth
    assert not {"fig-kleiber", "fig-kleiber-penultimate_gain"} & set(ids)
    assert "All 3 models have depth L = 3" in page and f"{10 ** (1 / 3):.4f}" in page
    assert "correlation: correlation" not in page and "no correlation: correlation" not in page
    # the laws show their tests and the L* baselines stand beside eq. 6
    assert "Crowding: head density rho vs regime" in page and "majority baseline" in page
    assert "L/2" in page and "per-prompt mean" in page and "Holm" in page
    assert 'class="error"' not in page and "Problems while writing" not in page
    for mid in profiles:
        assert f"<td class=\"l\">{mid}</td>" in page
    assert "Skipped: attention panel disabled" in page
    # readable from 800 px: every figure's title and subtitle are HTML text (they wrap), no figure
    # keeps a plotly title, and every table sits in a box that scrolls on its own
    assert page.count('<div class="fig-title">') == len(ids) and page.count('<div class="fig-sub">') == len(ids)
    assert '"title":{"text":"L*' not in page and "<meta name='viewport'" in page
    assert "<div class='scroll'><table class='tl glossary'>" in page
    assert page.count('<table class="tl">') == page.count('<div class="scroll"><table class="tl">')
    # write_report: one file, default name in the working directory, returns the path
    out = write_report(list(profiles.values()), tmp_path / "r.html", panel=False)
    assert out == tmp_path / "r.html" and out.is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # nothing else written (no .js next to it)


@pytest.mark.slow  # renders whole reports (seconds each); runs in the full suite
def test_fewer_than_three_models_says_why_and_single_profile(profiles, tmp_path, monkeypatch):
    two = dict(list(profiles.items())[:2])
    page, ids = render_report(two, panel=False)
    assert_offline_single_file(page, ids)
    assert "Only 2 model(s)" in page and "need at least 3 models" in page
    assert not {"fig-kleiber", "fig-heritage", "fig-hierarchy"} & set(ids)
    monkeypatch.chdir(tmp_path)
    out = write_report(profiles["llama-gqa"], panel=False)  # one ThermoProfile
    assert out == tmp_path / report.STANDALONE_NAME
    text = out.read_text()
    assert "llama-gqa" in text and "Only 1 model(s)" in text
    # a profile JSON file works too (the profile round-trips)
    f = tmp_path / "llama.json"
    profiles["llama-gqa"].to_json(f)
    assert ThermoProfile.from_json(f).meta["name"] == "llama-gqa"
    out2 = write_report(f, tmp_path / "from_json.html", panel=False)
    assert "llama-gqa" in out2.read_text()


@pytest.mark.slow  # renders whole reports (seconds each); runs in the full suite
def test_study_directory_lists_failures_and_draws_the_panel(profiles, tmp_path):
    texts = {mid: p.to_json() for mid, p in profiles.items()}

    def fake_profile(m, settings):  # the study machinery with precomputed profiles, one failure
        if m.id == "broken":
            raise RuntimeError("could not load broken/model: no such checkpoint")
        return texts[m.id]

    spec = study.StudySpec(name="views-test", models=tuple(
        [study.ModelSpec(id=mid, name=profiles[mid].meta["source"], lab=lab) for mid, _, lab in MODELS]
        + [study.ModelSpec(id="broken", name="broken/model", lab="Nowhere")]))
    outcome = study.run_study(spec, tmp_path, profile_fn=fake_profile, progress=False)
    assert set(outcome.failed) == {"broken"}
    path = write_report(tmp_path)  # what `thermo-lens report DIR` does
    assert path == tmp_path / "report.html"
    page = path.read_text()
    ids = re.findall(r'<div id="([^"]+)" class="plotly-graph-div"', page)
    assert_offline_single_file(page, ids)
    assert "Failed models" in page and "could not load broken/model: no such checkpoint" in page
    assert "thermo-lens report: views-test" in page
    # gpt2-local's source is a local checkpoint: booted offline, one circuitsvis panel, bundle inlined once
    assert page.count('class="thermo-lens-circuitsvis"') == 1 and page.count("var CircuitsVis") == 1
    assert "local checkpoint" in page and "delta_block_gain" in page


def _with_meta(p, **meta):
    results = {f: getattr(p, f) for f in ("gain", "anisotropy", "spectral", "sheaf", "l_star")}
    return ThermoProfile(meta={**p.meta, **meta}, results=results)


@pytest.mark.slow  # renders whole reports (seconds each); runs in the full suite
def test_one_lab_heritage_says_why_and_hierarchy_uses_families(profiles):
    one_lab = {k: _with_meta(p, lab="Same lab", family=None) for k, p in profiles.items()}
    page, ids = render_report(one_lab, panel=False)
    assert "Heritage needs at least 2 labs" in page and "fig-heritage" not in ids
    assert "fig-hierarchy" in ids  # gpt2 / opt / llama families, derived from the model names
    assert 'class="error"' not in page
    same_family = {k: _with_meta(p, lab="Same lab", family="toy") for k, p in profiles.items()}
    page, ids = render_report(same_family, panel=False)
    assert "Hierarchy needs at least 2 groups (family)" in page and "fig-hierarchy" not in ids


def test_auto_panel_boots_embedded_zoo_models(profiles, monkeypatch):
    calls = []
    zoo_prof = _with_meta(profiles["gpt2-local"], source="zoo:gpt2-tiny-wd")
    model = object()
    monkeypatch.setattr(zoo, "load", lambda name, **kw: calls.append(name) or model)
    got, why, prof = report._panel_model({"a": zoo_prof}, "auto")
    assert calls == ["gpt2-tiny-wd"] and got is model and "embedded model gpt2-tiny-wd" in why


@pytest.mark.slow
def test_panel_modes_and_bad_inputs(profiles, tmp_path):
    gqa = {"llama-gqa": profiles["llama-gqa"]}
    page, _ = render_report(gqa, panel="auto")  # source "fixture:llama_gqa" cannot be booted
    assert "Skipped: no model could be booted offline" in page and "fixture:llama_gqa" in page
    with pytest.raises(ReportError, match="no model could be booted"):
        render_report(gqa, panel=True)
    with pytest.raises(ReportError, match="panel must be"):
        render_report(gqa, panel="sometimes")
    with pytest.raises(ReportError, match="neither a study/profile directory"):
        write_report(tmp_path / "missing")
    with pytest.raises(ReportError, match="no manifest.json with models"):
        write_report(tmp_path)
    with pytest.raises(ReportError, match="not a ThermoProfile"):
        write_report({"x": 3}, tmp_path / "x.html")
    with pytest.raises(ReportError, match="got int"):
        write_report(3)
