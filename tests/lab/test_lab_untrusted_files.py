"""Nothing in a lab run folder is executed or trusted without its record: training states load with
``weights_only=True`` and only when their SHA-256 is the run's record; planted pickles, links and
edited checkpoints are refused or trained anew, never loaded."""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from thermo_lens.experiments.lab import run_record
from thermo_lens.experiments.lab.recipe import Recipe
from thermo_lens.experiments.lab.train import (STATE, load_state_bytes, rng_states, set_rng_states, state_bytes, step_dir_name,
                                   train_run)
from thermo_lens.core.safe_io import SafeIOError

TINY = Recipe(n_layers=1, d_model=16, n_heads=2, d_mlp=32, n_ctx=32, block_size=16, batch_size=2, vocab_size=300,
              steps=4, warmup_steps=1)


class _Payload:
    """Unpickling this writes ``marker``: proof that a pickle ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil(marker: Path) -> bytes:
    return pickle.dumps({"format": 2, "step": 1, "x": _Payload(marker)})


def test_the_payload_really_runs_when_unpickled(tmp_path):
    """The test's pickle is a real payload: an unsafe load writes the marker."""
    marker = tmp_path / "ran"
    pickle.loads(_evil(marker))
    assert marker.exists()


def test_rng_states_round_trip_through_a_weights_only_load():
    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    np.random.standard_normal()  # a cached Gaussian in numpy's state
    saved = rng_states()
    want = (torch.rand(3), np.random.standard_normal(3), random.random())
    loaded = torch.load(__import__("io").BytesIO(state_bytes({"rng": saved})), weights_only=True)
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    set_rng_states(loaded["rng"])
    got = (torch.rand(3), np.random.standard_normal(3), random.random())
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


def test_a_pickle_is_refused_by_the_state_loader(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(SafeIOError, match="not a thermo-lens training state.*not loaded"):
        load_state_bytes(_evil(marker), tmp_path / STATE)
    assert not marker.exists()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust")
    out = train_run(TINY, 1, root / "run", n_checkpoints=3, tokenizer_cache=root / "tok")
    return root, out


def _copy(trained, tmp_path) -> Path:
    root, _ = trained
    shutil.copytree(root / "run", tmp_path / "run", symlinks=True)
    return tmp_path / "run"


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / step_dir_name(step) / "model.safetensors"))


@pytest.mark.slow
def test_every_written_file_is_recorded(trained):
    root, out = trained
    rec = run_record.read_record(root / "run")
    steps = sorted(out["checkpoints"])
    assert steps == [0, 1, 4]
    for s in steps:
        assert run_record.checkpoint_problem(root / "run", step_dir_name(s), rec) is None
        assert f"{step_dir_name(s)}/model.safetensors" in rec["files"]
    sha = __import__("hashlib").sha256((root / "run" / STATE).read_bytes()).hexdigest()
    assert rec["train_state"][0] == sha


@pytest.mark.slow
def test_a_planted_pickle_state_is_refused_and_never_run(trained, tmp_path):
    run = _copy(trained, tmp_path)
    marker = tmp_path / "pwned"
    (run / STATE).write_bytes(_evil(marker))
    with pytest.raises(SafeIOError, match=r"not the training state this run wrote.*not loaded"):
        train_run(TINY, 1, run, n_checkpoints=3, tokenizer_cache=trained[0] / "tok")
    assert not marker.exists()
    # Even when the record is edited to vouch for it, weights_only refuses the payload.
    rec = run_record.read_record(run)
    rec["train_state"] = [__import__("hashlib").sha256(_evil(marker)).hexdigest()]
    run_record.write_record(run, rec)
    with pytest.raises(SafeIOError, match="not a thermo-lens training state"):
        train_run(TINY, 1, run, n_checkpoints=3, tokenizer_cache=trained[0] / "tok")
    assert not marker.exists()


@pytest.mark.slow
def test_a_state_linked_from_elsewhere_is_refused(trained, tmp_path):
    run = _copy(trained, tmp_path)
    marker = tmp_path / "pwned"
    elsewhere = tmp_path / "elsewhere.pt"
    elsewhere.write_bytes(_evil(marker))
    (run / STATE).unlink()
    (run / STATE).symlink_to(elsewhere)
    with pytest.raises(SafeIOError, match="symbolic link"):
        train_run(TINY, 1, run, n_checkpoints=3, tokenizer_cache=trained[0] / "tok")
    assert not marker.exists()


@pytest.mark.slow
def test_a_state_of_the_earlier_format_restarts_the_run_from_scratch(trained, tmp_path):
    """The pickled format before records: not loaded; the run restarts and ends with the same weights."""
    run = _copy(trained, tmp_path)
    (run / run_record.RECORD).unlink()
    old = torch.load(run / STATE, weights_only=True)
    torch.save({k: old[k] for k in ("recipe", "seed", "step", "history", "model", "optimizer", "generator")},
               run / STATE)
    logs: list[str] = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = train_run(TINY, 1, run, n_checkpoints=3, tokenizer_cache=trained[0] / "tok", log=logs.append)
    assert any("restarts from scratch" in str(x.message) for x in w)
    assert not any(line.startswith("resuming") for line in logs)
    fresh = trained[1]
    assert out["checkpoints"][4]["val_loss"] == fresh["checkpoints"][4]["val_loss"]
    a, b = _weights(run, 4), _weights(trained[0] / "run", 4)
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert run_record.checkpoint_problem(run, step_dir_name(4), run_record.read_record(run)) is None


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["link", "edited", "extra_file"])
def test_a_replaced_checkpoint_is_trained_anew_not_read(trained, tmp_path, damage):
    """A linked, edited or padded checkpoint folder fails the record; resuming past it would read
    it, so the run is trained anew, the link removed (its target untouched)."""
    run = _copy(trained, tmp_path)
    name = step_dir_name(1)
    decoy = tmp_path / "decoy"
    shutil.copytree(run / name, decoy)
    (decoy / "metrics.json").write_text(json.dumps({"step": 1, "tokens_seen": 32, "val_loss": 123.0}))
    if damage == "link":
        shutil.rmtree(run / name)
        (run / name).symlink_to(decoy, target_is_directory=True)
    elif damage == "edited":
        shutil.copy(decoy / "metrics.json", run / name / "metrics.json")
    else:
        (run / name / "pytorch_model.bin").write_bytes(b"planted")
    assert run_record.checkpoint_problem(run, name, run_record.read_record(run)) is not None
    logs: list[str] = []
    out = train_run(TINY, 1, run, n_checkpoints=3, tokenizer_cache=trained[0] / "tok", log=logs.append)
    assert any("training from scratch" in line for line in logs)
    assert out["checkpoints"][1]["val_loss"] != 123.0
    assert out["checkpoints"] == trained[1]["checkpoints"]
    assert not (run / name).is_symlink()
    assert run_record.checkpoint_problem(run, name, run_record.read_record(run)) is None
    assert json.loads((decoy / "metrics.json").read_text())["val_loss"] == 123.0  # the target is untouched


def test_reading_a_checkpoint_file_checks_link_and_hash(tmp_path):
    run = tmp_path / "run"
    (run / "step_000001").mkdir(parents=True)
    (run / "step_000001" / "metrics.json").write_text('{"val_loss": 1.0}')
    rec = {"files": run_record.folder_hashes(run / "step_000001", "step_000001"), "train_state": []}
    assert json.loads(run_record.read_checkpoint_file(run, "step_000001/metrics.json", rec, 1000)) == {"val_loss": 1.0}
    (run / "step_000001" / "metrics.json").write_text('{"val_loss": 9.0}')
    with pytest.raises(SafeIOError, match="not the file this run wrote"):
        run_record.read_checkpoint_file(run, "step_000001/metrics.json", rec, 1000)
    with pytest.raises(SafeIOError, match="not the file this run wrote"):
        run_record.read_checkpoint_file(run, "step_000001/metrics.json", None, 1000)
    shutil.move(run / "step_000001", tmp_path / "real")
    (run / "step_000001").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(SafeIOError, match="symbolic link"):
        run_record.read_checkpoint_file(run, "step_000001/metrics.json", rec, 1000)
    assert "symbolic link" in run_record.checkpoint_problem(run, "step_000001", rec)


@pytest.mark.slow
def test_a_cached_tokenizer_is_used_only_as_written(trained, tmp_path):
    """A cached tokenizer whose files were edited (or linked) is made anew, never read."""
    from thermo_lens.experiments.lab.train import get_tokenizer

    root, _ = trained
    cache = tmp_path / "tok"
    shutil.copytree(root / "tok", cache, symlinks=True)
    key = next(p.name for p in cache.iterdir() if not p.name.startswith("."))
    want = get_tokenizer(TINY, cache)("The cat sat on the mat.")["input_ids"]
    vocab = cache / key / "tokenizer.json"
    data = json.loads(vocab.read_text())
    data["model"]["vocab"] = {t: (i + 7) % len(data["model"]["vocab"]) for t, i in data["model"]["vocab"].items()}
    vocab.write_text(json.dumps(data))
    assert get_tokenizer(TINY, cache)("The cat sat on the mat.")["input_ids"] == want
    elsewhere = tmp_path / "elsewhere.json"
    shutil.copy(cache / key / "tokenizer.json", elsewhere)
    (cache / key / "tokenizer.json").unlink()
    (cache / key / "tokenizer.json").symlink_to(elsewhere)
    assert get_tokenizer(TINY, cache)("The cat sat on the mat.")["input_ids"] == want
    assert not (cache / key / "tokenizer.json").is_symlink() and elsewhere.exists()


def test_the_report_reads_the_lab_tables_only_as_written(tmp_path):
    import hashlib

    from thermo_lens.experiments.lab.report_section import read_tables
    from thermo_lens.experiments.lab.run_record import TABLES_RECORD

    lab_dir = tmp_path / "lab"
    lab_dir.mkdir()
    tables = {"runs.csv": b"arm,seed,val_loss\nbase,1,4.5\n", "effects.csv": b"knob,effect\nwd,0.1\n"}
    for name, raw in tables.items():
        (lab_dir / name).write_bytes(raw)
    (lab_dir / TABLES_RECORD).write_text(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in tables.items()}))
    runs, eff = read_tables(lab_dir)
    assert runs["val_loss"].tolist() == [4.5] and eff["effect"].tolist() == [0.1]
    secret = tmp_path / "secret.csv"
    secret.write_bytes(b"password\nhunter2\n")
    (lab_dir / "runs.csv").unlink()
    (lab_dir / "runs.csv").symlink_to(secret)
    why = read_tables(lab_dir)
    assert isinstance(why, str) and "symbolic link" in why and "hunter2" not in why
    (lab_dir / "runs.csv").unlink()
    (lab_dir / "runs.csv").write_bytes(b"arm,seed,val_loss\nbase,1,0.001\n")
    why = read_tables(lab_dir)
    assert isinstance(why, str) and "runs.csv" in why and "do not match what the lab wrote" in why
    (lab_dir / TABLES_RECORD).unlink()
    assert "Rerun the lab" in read_tables(lab_dir)
