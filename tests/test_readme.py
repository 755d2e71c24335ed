"""The README's quickstart stays true: its test command is what CI runs, its main job exists."""

import re
from pathlib import Path
from thermo_lens.profile import ThermoProfile

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks(text):
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_ci_runs_the_readme_test_command():
    blocks = _bash_blocks((ROOT / "README.md").read_text())
    test_cmd = next(b.strip() for b in blocks if "pytest" in b)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines()


def test_readme_main_job_is_the_cli_default():
    blocks = _bash_blocks((ROOT / "README.md").read_text())
    main_cmd = blocks[0].strip()
    assert main_cmd.endswith("thermo-lens profile")  # no arguments: the embedded default models
    assert "torch==2.13.0" in main_cmd  # the CPU build first
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'thermo-lens = "thermo_lens.cli:main"' in pyproject


def test_readme_notebook_snippet_runs(monkeypatch):
    """The README's Python example runs as written (the hub model swapped for an embedded one)."""
    from transformer_lens.model_bridge import TransformerBridge

    import thermo_lens as tl

    block = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)[0]
    model = tl.zoo.load("neox-tiny")
    monkeypatch.setattr(TransformerBridge, "boot_transformers", lambda *a, **k: model)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert isinstance(scope["prof"], ThermoProfile)
    assert scope["traces"].trace.shape == (25, 4, 4)


def test_readme_sae_and_tl2_routes_keep_a_cpu_torch_and_say_how_to_get_cuda():
    """Issue 25: without the pin first, the `sae` / `tl2` extras pull a CUDA torch (6.4 GB venvs)."""
    text = (ROOT / "README.md").read_text()
    lines = [ln.strip() for b in _bash_blocks(text) for ln in b.splitlines()]
    for extra in ("sae", "tl2"):
        line = next(ln for ln in lines if f'".[{extra}]"' in ln)
        assert line.startswith("pip install torch==2.13.0 && "), line
        assert "[project.optional-dependencies]" in (ROOT / "pyproject.toml").read_text()
        assert re.search(rf"^{extra} = \[", (ROOT / "pyproject.toml").read_text(), flags=re.M), extra
    assert "download.pytorch.org/whl/cu" in text and "CUDA" in text
    assert 'zoo.load("gpt2-tiny-wd", host="hooked")' in text and 'host="hooked_sae"' in text
