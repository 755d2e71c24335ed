"""`import thermo_lens` stays light: pandas, figures, report, studies and laws load on first use."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("plotly", "pandas", "scipy.stats", "circuitsvis", "transformer_lens", "thermo_lens.report", "thermo_lens.experiments.study",
         "thermo_lens.laws", "thermo_lens.views", "thermo_lens.measures.robustness", "thermo_lens.zoo")


@pytest.mark.slow
def test_import_is_light_and_lazy_names_resolve_on_first_use():
    """One subprocess: what `import thermo_lens` loads, then what first use of lazy names loads."""
    probe = (
        "import sys\n"
        "def loaded(): return ' '.join(m for m in %r if m in sys.modules)\n"
        "import thermo_lens as tl\n"
        "print(loaded())\n"
        "assert callable(tl.write_report) and tl.views.metric_plot and callable(tl.input_robustness)\n"
        "assert tl.profile.__name__ == 'profile'\n"
        "print(loaded())\n" % (HEAVY,)
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "", "HF_HUB_OFFLINE": "1"})
    at_import, after_use = (set(line.split()) for line in out.stdout.splitlines())
    assert at_import == set(), f"import thermo_lens loaded {sorted(at_import)}"
    assert {"plotly", "thermo_lens.report", "thermo_lens.views"} <= after_use


def test_public_names_all_resolve():
    import thermo_lens as tl

    for name in tl.__all__:
        assert getattr(tl, name) is not None, name
    assert set(tl.__all__) <= set(dir(tl))
