"""The README's quickstart stays true: its test command is what CI runs, its main job exists."""

import re
from pathlib import Path

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
