"""The documentation site's generated parts come from their sources, and the site holds every page.

``docs/hooks.py`` fills each ``<!-- generated: NAME -->`` line at build time: the definitions page
from ``thermo_lens.definitions.render()`` and the performance tables from the stored benchmark
results (``benchmarks/results/*.json``). These tests read the stored files themselves and check the
generated Markdown against them, so a table cannot drift from its JSON or lose its machine and date.
``mkdocs build --strict`` (CI's main leg) checks every link and API reference.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


hooks = _hooks()


def _markers() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for page in DOCS.rglob("*.md"):
        for name in hooks.MARKER.findall(page.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(page.relative_to(ROOT).as_posix())
    return found


def test_every_marker_has_a_generator_and_every_generator_is_used():
    found = _markers()
    assert set(found) == set(hooks.GENERATORS), (sorted(found), sorted(hooks.GENERATORS))


def test_expand_replaces_markers_and_refuses_unknown_ones():
    page = "# t\n\n<!-- generated: perf:cpu-sweeps -->\n\ntext\n"
    out = hooks.expand(page)
    assert "<!-- generated" not in out and out.startswith("# t\n") and out.endswith("\ntext\n")
    with pytest.raises(KeyError, match="unknown generated part"):
        hooks.expand("<!-- generated: perf:nope -->")


def test_the_definitions_page_is_the_shipped_one_with_the_registry_table():
    from thermo_lens import definitions
    from thermo_lens.core import registry

    page = (DOCS / "concepts" / "definitions.md").read_text(encoding="utf-8")
    assert page.strip() == "<!-- generated: definitions -->"  # nothing written by hand beside it
    out = hooks.expand(page)
    assert out.rstrip("\n") == definitions.render().rstrip("\n")
    for m in registry.metrics():
        assert f"| `{m.name}` |" in out


def _cpu() -> tuple[Path, dict]:
    files = sorted(RESULTS.glob("cpu-*.json"))
    assert files, "no stored CPU results"
    return files[-1], json.loads(files[-1].read_text(encoding="utf-8"))


def test_cpu_tables_carry_every_stored_row_its_machine_and_date():
    path, data = _cpu()
    assert "2-core" in data["machine"]
    for name, key, first in (("perf:cpu-profile", "profile_vs_bare", "model"), ("perf:cpu-last-block", "profile_vs_last_block", "model"),
                             ("perf:cpu-spectral", "spectral", "geometry"), ("perf:cpu-sweeps", "sweeps", "sweep")):
        table = hooks.GENERATORS[name]()
        assert data["machine"] in table and path.name in table and data[key]["script"] in table
        rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| " + first)]
        assert len(rows) == len(data[key]["rows"]), name
        for line, row in zip(rows, data[key]["rows"]):
            assert line.startswith(f"| {row[first]} |") and line.endswith(f"| {row['date']} |"), (name, line)


def test_cpu_numbers_are_the_stored_ones():
    _, data = _cpu()
    profile = hooks.perf_cpu_profile()
    for row in data["profile_vs_bare"]["rows"]:
        w = row["warm"]
        assert f"{row['bare_s']:.2f} s" in profile
        assert f"{w['median']:.2f}x [{w['min']:.2f}..{w['max']:.2f}] (min/min {w['min_over_min']:.2f}x)" in profile
    streaming = hooks.perf_cpu_streaming()
    for row in data["streaming"]["rows"]:
        p = row["peak_MiB"]
        assert f"| {row['prompts']:,} | {p['median']:.1f} MiB [{p['min']:.1f}-{p['max']:.1f}] |" in streaming
    spectral = hooks.perf_cpu_spectral()
    for row in data["spectral"]["rows"]:
        assert f"{row['signature_s']:.2f} s, **{row['ratio']:.1f}x**" in spectral


def test_gpu_tables_are_the_newest_run_with_its_device_and_date():
    files = sorted(RESULTS.glob("gpu-*.json"))
    assert files
    data = json.loads(files[-1].read_text(encoding="utf-8"))
    name, run = next(iter(data.items()))
    date = re.search(r"\d{4}-\d{2}-\d{2}", files[-1].name).group(0)
    spectral, profile = hooks.perf_gpu_spectral(), hooks.perf_gpu_profile()
    for table in (spectral, profile):
        assert run["device"] in table and date in table and f"run `{name}`" in table and files[-1].name in table
    for spectrum, r in run["spectral_7b"].items():
        assert f"{spectrum} weights | **{r['ours_s']:.2f} s** | {r['per_head_s']:.2f} s |" in spectral
    for g in run["profile"].values():
        for method, m in g["methods"].items():
            assert f"| {method} | {m['s']:.2f} s | {m['vs_same']:.2f}x |" in profile


def test_performance_prose_is_not_a_development_log():
    text = (DOCS / "performance.md").read_text(encoding="utf-8").lower()
    for phrase in ("this round", "rounds ago", "rounds before", "two rounds", "the issue's", "device time was spent"):
        assert phrase not in text, phrase


def test_every_tutorial_is_on_the_site():
    notebooks = {p.name for p in (ROOT / "tutorials").glob("*.ipynb")}
    linked = {p.name for p in (DOCS / "tutorials").glob("*.ipynb")}
    assert notebooks == linked, "link each notebook into docs/tutorials/ (a relative symlink) and add it to mkdocs.yml's nav"
    for p in (DOCS / "tutorials").glob("*.ipynb"):
        assert p.is_symlink() and p.resolve() == (ROOT / "tutorials" / p.name).resolve()
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for name in notebooks:
        assert f"tutorials/{name}" in nav, name


def test_the_docs_extra_installs_the_site_tools():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    line = next(ln for ln in pyproject.splitlines() if ln.startswith("docs = ["))
    for tool in ("mkdocs-material>=", "mkdocstrings-python>=", "mkdocs-jupyter>="):
        assert tool in line, tool
    assert "mkdocs build --strict" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_front_page_figure_is_what_its_script_draws_from_the_embedded_models():
    spec = importlib.util.spec_from_file_location("block_gain", DOCS / "figures" / "block_gain.py")
    assert spec and spec.loader
    fig = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fig)
    data = fig.measure()
    assert set(data) == set(fig.MODELS)
    for mean, low, high in data.values():
        assert (low <= mean).all() and (mean <= high).all() and len(mean) == 4
    committed = (DOCS / "assets" / "block-gain.svg").read_text(encoding="utf-8")
    assert fig.svg(data) == committed, "redraw it: python docs/figures/block_gain.py"
    assert len(committed) < 8_000  # a small figure
