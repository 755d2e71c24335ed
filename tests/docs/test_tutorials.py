"""The tutorials stay runnable: every notebook executes offline on the embedded models.

Each notebook in ``tutorials/`` is executed top to bottom with ``nbclient`` in a fresh kernel whose
working directory is a temporary folder (the tutorials' spec files copied next to it, as when a user
opens the notebook from ``tutorials/``), so nothing is written into the repository. The notebooks
carry their own checks (``assert`` cells comparing thermo-lens with independent computations: dense
``delta^T delta`` vs the factored Laplacian, numpy SVD vs the spectral signature, a hand-written
ablation loop vs the batched one, the paper's published r = -0.8116 / p = 0.0144 ...), so a cell
error is a failed reproduction, not only a crash. Notebooks are committed without outputs.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
EXPECTED = {
    "01_quickstart.ipynb",
    "02_heads_and_circuits.ipynb",
    "03_sheaf_from_first_principles.ipynb",
    "04_reproduce_the_paper_study.ipynb",
    "05_heritage_lab.ipynb",
}


def _read(path: Path):
    return nbformat.read(str(path), as_version=4)


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


def test_the_tutorials_exist():
    assert EXPECTED <= {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    nb = _read(path)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    stored = [i for i, c in enumerate(nb.cells)
              if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not stored, f"{path.name}: cells {stored} carry outputs; clear them before committing"
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= len(code) // 3, "tutorials teach in markdown"


def test_paper_spec_loads_offline_with_lab_and_family():
    from thermo_lens.experiments import study

    spec = study.load_spec(TUTORIALS / "paper_models.toml")
    assert len(spec.models) >= 30
    assert all(m.name and "/" in m.name and m.lab and m.family for m in spec.models)
    # The paper's protocol, so profiles compare like for like with thermo_lens.reference.
    assert (spec.token_scope, spec.prepend_bos, spec.prompts) == ("last", "tokenizer", "paper25")
    ids = {m.id for m in spec.models}
    assert {"pythia-70m", "pythia-12b", "gpt-j-6B", "opt-350m", "falcon-7b"} <= ids
    assert all(m.twin_of in ids for m in spec.models if m.twin_of)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from nbclient.exceptions import CellExecutionError

    # A notebook may need a package only some hosts have (06_saes: SAELens, which needs
    # TransformerLens 2.16.x / 3.x); its metadata says which and why, and the test says so.
    needs = _read(path).metadata.get("thermo_lens", {})
    import importlib.util

    missing = [m for m in needs.get("requires", []) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{path.name} needs {', '.join(missing)} ({needs.get('why', '')})")

    # The kernel inherits this environment: no network, temporary files under tmp_path, and one
    # thread per kernel (the test machine's cores are shared; oversubscription makes CPU runs erratic).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    workdir = tmp_path / "work"
    workdir.mkdir()
    for spec in TUTORIALS.glob("*.toml"):
        shutil.copy(spec, workdir)
    before = _snapshot(TUTORIALS)

    nb = _read(path)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as e:
        pytest.fail(f"{path.name} failed after {time.perf_counter() - start:.1f} s:\n{e}", pytrace=False)
    errors = [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: cells raised {errors}"
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code"), "a cell did not run"
    assert _snapshot(TUTORIALS) == before, "executing a tutorial wrote into the repository"
