"""``thermo-lens lab --update``: every spec change the README allows ends with the tables a fresh lab
of the new spec writes; finished runs whose recipe did not change are kept (not retrained), their
rows re-tagged by the new spec; dropped seeds and budgets leave exactly their rows.

Each lab is tiny (two layers, d_model 16, 2-3 steps, two checkpoints per run), but trains and
profiles for real, so these are slow tests.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from thermo_lens.experiments import lab
from thermo_lens.experiments.lab.spec import parse_lab_spec

pytestmark = pytest.mark.slow

BASE = {
    "lab": {"name": "tiny", "seeds": [1, 2], "checkpoints": 2, "budgets": [2, 3], "batch_size": 2,
            "prompts": ["The capital of France is Paris.", "Water freezes at zero degrees."]},
    "base": {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_mlp": 32, "n_ctx": 32, "block_size": 16,
             "batch_size": 2, "vocab_size": 300, "steps": 3, "warmup_steps": 1},
    "knobs": {"weight_decay": [0.1, 0.0]},
}


def _spec(**lab_kw):
    data = copy.deepcopy(BASE)
    if "knobs" in lab_kw:
        data["knobs"] = lab_kw.pop("knobs")
    data["lab"].update(lab_kw)
    return parse_lab_spec(data)


FULL = {}
SEED1 = {"seeds": [1]}
BUDGET3 = {"budgets": [3]}
RENAMED_SEED1 = {"seeds": [1], "name": "tiny, renamed"}
NO_KNOB_SEED1 = {"seeds": [1], "knobs": {}}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Fresh labs of each spec, made on first use: ``fresh(name) -> folder``."""
    root = tmp_path_factory.mktemp("update")
    made: dict[str, Path] = {}
    specs = {"full": FULL, "seed1": SEED1, "budget3": BUDGET3, "renamed_seed1": RENAMED_SEED1,
             "no_knob_seed1": NO_KNOB_SEED1}

    def get(name: str) -> Path:
        if name not in made:
            out = root / name
            outcome = lab.run_lab(_spec(**copy.deepcopy(specs[name])), out, report=False)
            assert outcome.ok, outcome.failed
            made[name] = out
        return made[name]

    return get


def _tables(out: Path) -> tuple[str, str]:
    return (out / "runs.csv").read_text(), (out / "effects.csv").read_text()


def _update(src: Path, dest: Path, **lab_kw):
    shutil.copytree(src, dest, symlinks=True)
    return lab.run_lab(_spec(**lab_kw), dest, report=False, update=True)


@pytest.mark.parametrize("start, change, target", [
    ("seed1", FULL, "full"),                           # adding a seed
    ("budget3", FULL, "full"),                         # adding a budget
    ("full", SEED1, "seed1"),                          # dropping a seed
    ("full", BUDGET3, "budget3"),                      # dropping a budget
    ("seed1", RENAMED_SEED1, "renamed_seed1"),         # renaming the lab
    ("seed1", NO_KNOB_SEED1, "no_knob_seed1"),         # dropping a knob (its arms)
    ("no_knob_seed1", SEED1, "seed1"),                 # adding a knob (new arms)
], ids=["add-seed", "add-budget", "drop-seed", "drop-budget", "rename", "drop-knob", "add-knob"])
def test_update_ends_with_the_tables_of_a_fresh_lab(fresh, tmp_path, start, change, target):
    src = fresh(start)
    kept_runs = json.loads((src / "train" / "manifest.json").read_text())["models"]
    outcome = _update(src, tmp_path / "lab", **copy.deepcopy(change))
    assert outcome.ok, outcome.failed
    want = fresh(target)
    assert _tables(tmp_path / "lab") == _tables(want)
    runs = pd.read_csv(tmp_path / "lab" / "runs.csv")
    spec = _spec(**copy.deepcopy(change))
    assert set(runs["spec_sha256"]) == {spec.sha256}
    assert sorted(set(runs["seed"])) == sorted(spec.seeds)
    assert sorted(set(runs["budget"])) == sorted(spec.budget_steps())
    assert len(runs) == len(spec.arms()) * len(spec.seeds) * len(spec.budget_steps()) * 2
    # Finished runs of unchanged recipes were kept, not trained again.
    assert not set(outcome.trained) & set(kept_runs)
    text = (tmp_path / "lab" / "effects.csv").read_text()
    eff = pd.read_csv(tmp_path / "lab" / "effects.csv") if text.strip() else pd.DataFrame()  # no knob: no effects
    if "n_seeds" in eff.columns:
        assert eff["n_seeds"].max() <= len(spec.seeds)


def test_a_linked_checkpoint_is_not_profiled_and_its_loss_never_enters_the_tables(fresh, tmp_path):
    """A ``runs/<run>/step_N`` replaced by a link to another folder (with its own val_loss) is not
    profiled: the run is trained anew in place, the link removed and its target untouched."""
    src = fresh("seed1")
    out = tmp_path / "lab"
    shutil.copytree(src, out, symlinks=True)
    run_dir = next((out / "runs").glob("base__seed1__*"))
    budget = json.loads((run_dir / "recipe.json").read_text())["recipe"]["steps"]
    step = run_dir / f"step_{budget:06d}"
    decoy = tmp_path / "decoy"
    shutil.copytree(step, decoy)
    (decoy / "metrics.json").write_text(json.dumps({"step": budget, "tokens_seen": 1, "val_loss": 123.0}))
    shutil.rmtree(step)
    step.symlink_to(decoy, target_is_directory=True)
    # the checkpoint's profile is to be measured again (as after a settings change)
    mid = f"base__seed1__b{budget}__step{budget:06d}"
    (out / "profiles" / f"{mid}.json").unlink()
    outcome = lab.run_lab(_spec(**SEED1), out, report=False)
    assert outcome.ok, outcome.failed
    assert mid in outcome.profiled
    assert _tables(out) == _tables(src)
    assert "123" not in (out / "runs.csv").read_text()
    assert not step.is_symlink()
    assert json.loads((decoy / "metrics.json").read_text())["val_loss"] == 123.0
