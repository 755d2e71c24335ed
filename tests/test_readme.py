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
