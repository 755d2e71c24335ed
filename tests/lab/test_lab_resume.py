"""A lab killed with SIGKILL mid-run resumes: finished results are kept, training continues exactly."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from thermo_lens.experiments import lab

MICRO = Path(__file__).parents[1] / "data" / "lab_micro.toml"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _env():
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env


def _wait(pred, proc, timeout=240.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_sigkill_mid_lab_then_rerun_keeps_finished_results(tmp_path):
    out = tmp_path / "lab"
    proc = subprocess.Popen([sys.executable, "-m", "thermo_lens.cli", "lab", str(MICRO), "--out", str(out), "--no-report"],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    manifest = out / "train" / "manifest.json"

    def some_done():
        try:
            models = json.loads(manifest.read_text())["models"]
        except (OSError, ValueError):
            return False
        return any(m.get("status") == "done" for m in models.values())

    try:
        assert _wait(some_done, proc), "the lab never finished a run"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the lab finished before it could be killed"

    before = json.loads(manifest.read_text())["models"]
    done = {k: v for k, v in before.items() if v["status"] == "done"}
    unfinished = [k for k, v in before.items() if v["status"] != "done"]
    assert done and unfinished
    kept = {k: (_sha(out / "train" / v["file"]), (out / "train" / v["file"]).stat().st_mtime_ns) for k, v in done.items()}

    outcome = lab.run_lab(MICRO, out, report=False)
    assert outcome.ok, outcome.failed
    assert set(done) <= set(outcome.skipped)             # finished runs were not redone ...
    assert set(unfinished) == set(outcome.trained)        # ... and the rest were
    for k, (sha, mtime) in kept.items():
        f = out / "train" / done[k]["file"]
        assert _sha(f) == sha and f.stat().st_mtime_ns == mtime
    after = json.loads(manifest.read_text())["models"]
    assert all(v["status"] == "done" for v in after.values())
    assert (out / "runs.csv").is_file() and (out / "effects.csv").is_file()


_TRAIN = """
import sys
from thermo_lens.experiments.lab.recipe import Recipe
from thermo_lens.experiments.lab.train import train_run
r = Recipe(n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=32, block_size=16, batch_size=4, vocab_size=320,
           steps=400, warmup_steps=5)
train_run(r, 3, sys.argv[1], n_checkpoints=6, tokenizer_cache=sys.argv[2])
"""


def test_sigkill_mid_training_resumes_to_the_same_weights(tmp_path):
    """Training killed between checkpoints continues from train_state.pt and ends bit-identical to
    an uninterrupted run."""
    from safetensors.torch import load_file

    from thermo_lens.experiments.lab.recipe import Recipe
    from thermo_lens.experiments.lab.train import train_run

    run, cache = tmp_path / "killed", tmp_path / "tok"
    proc = subprocess.Popen([sys.executable, "-c", _TRAIN, str(run), str(cache)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def mid_run():
        return (run / "step_000020" / "metrics.json").is_file()  # checkpoints: 0, 1, 4, 20, 89, 400

    try:
        assert _wait(mid_run, proc), "training never reached its third checkpoint"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "training finished before it could be killed"
    assert not (run / "step_000400").exists()

    r = Recipe(n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=32, block_size=16, batch_size=4, vocab_size=320,
               steps=400, warmup_steps=5)
    resumed = train_run(r, 3, run, n_checkpoints=6, tokenizer_cache=cache)
    fresh = train_run(r, 3, tmp_path / "fresh", n_checkpoints=6, tokenizer_cache=cache)
    a = load_file(str(run / "step_000400" / "model.safetensors"))
    b = load_file(str(tmp_path / "fresh" / "step_000400" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), k
    assert resumed["checkpoints"][400]["val_loss"] == fresh["checkpoints"][400]["val_loss"]
