"""Running studies: atomic per-model results, resume, corrupt files, failures, SIGKILL, locking, Ray."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from thermo_lens.experiments import study
from thermo_lens.core.safe_io import FolderLock
from thermo_lens.measures.profile import ThermoProfile
from thermo_lens.experiments.study import ModelSpec, StudyLockedError, StudySpec, run_study

PROMPTS = ["The capital of France is", "Birds of a feather flock", "Water freezes at"]


def _spec(*models, prompts=PROMPTS, **kw):
    return StudySpec(name="t", models=tuple(models), prompts=list(prompts), **kw)


ZOO_A = ModelSpec(id="a", zoo="gpt2-tiny-wd", lab="zoo", threads=1)
ZOO_B = ModelSpec(id="b", zoo="neox-tiny", lab="zoo", threads=1)


@pytest.mark.slow
def test_run_resume_and_manifest(tmp_path):
    out = tmp_path / "s"
    first = run_study(_spec(ZOO_A, ZOO_B), out)
    assert first.ok and set(first.done) == {"a", "b"} and not first.skipped
    manifest = study.read_manifest(out)
    for mid in "ab":
        entry = manifest["models"][mid]
        assert entry["status"] == "done" and (out / entry["file"]).is_file()
        assert len(entry["sha256"]) == 64
        assert (out / entry["file"]).stat().st_mode & 0o044  # readable by others, like any file
    profiles = study.load_profiles(out)
    assert isinstance(profiles["a"], ThermoProfile) and profiles["a"].meta["lab"] == "zoo"
    mtime = (out / "a.json").stat().st_mtime_ns
    again = run_study(_spec(ZOO_A, ZOO_B), out)
    assert set(again.skipped) == {"a", "b"} and not again.done
    assert (out / "a.json").stat().st_mtime_ns == mtime
    # changed settings are not silently reused
    other = run_study(_spec(ZOO_A, prompts=PROMPTS[:2]), out)
    assert other.done == ("a",)


@pytest.mark.slow
def test_corrupt_result_is_detected_and_recomputed(tmp_path):
    out = tmp_path / "s"
    run_study(_spec(ZOO_A), out)
    good = (out / "a.json").read_bytes()
    (out / "a.json").write_bytes(good[: len(good) // 2])  # truncated file
    with pytest.raises(RuntimeError, match="does not match the manifest"):
        study.load_profiles(out, strict=True)
    with pytest.warns(UserWarning, match="does not match the manifest"):
        assert study.load_profiles(out) == {}  # left out, with a warning; never silently used
    rerun = run_study(_spec(ZOO_A), out)
    assert rerun.done == ("a",) and not rerun.skipped
    assert "recomputed" in study.read_manifest(out)["models"]["a"]["note"]
    assert ThermoProfile.from_json((out / "a.json").read_text()).meta["name"] == "a"


@pytest.mark.slow
def test_failing_model_is_recorded_and_study_goes_on(tmp_path):
    out = tmp_path / "s"
    (tmp_path / "not-a-checkpoint").mkdir()  # a folder that exists but holds no model
    bad = ModelSpec(id="missing", name=str(tmp_path / "not-a-checkpoint"))
    outcome = run_study(_spec(bad, ZOO_A), out)
    assert outcome.done == ("a",) and set(outcome.failed) == {"missing"}
    entry = study.read_manifest(out)["models"]["missing"]
    assert entry["status"] == "failed" and entry["error"]
    assert set(study.load_profiles(out)) == {"a"}

    def nan_profile(model, settings):
        raise FloatingPointError("model produced NaN at blocks.1.hook_resid_post (layer 1)")

    out2 = tmp_path / "s2"
    o2 = run_study(_spec(ZOO_A), out2, profile_fn=nan_profile)
    assert "layer 1" in o2.failed["a"]


def test_concurrent_run_is_refused(tmp_path, capsys):
    from thermo_lens.cli import main

    out = tmp_path / "s"
    out.mkdir()
    with FolderLock(out, what="thermo-lens study run", error=StudyLockedError):
        with pytest.raises(StudyLockedError, match="another thermo-lens study run"):
            run_study(_spec(ZOO_A), out)
        # The CLI in-process (the lock is a file lock: a second open of it conflicts as another
        # process's would; test_sigkill_mid_run_then_resume runs real processes).
        assert main(["study", str(_write_spec(tmp_path)), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "another thermo-lens study run" in err and "Traceback" not in err


def _write_spec(tmp_path, prompts="paper25"):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[study]\nname = "kill"\nprompts = "{prompts}"\n\n'
                    '[[models]]\nzoo = "gpt2-tiny-wd"\nthreads = 1\n\n'
                    '[[models]]\nzoo = "neox-tiny"\nthreads = 1\n\n'
                    '[[models]]\nzoo = "gpt2-tiny-nowd"\nthreads = 1\n')
    return spec


@pytest.mark.slow
def test_sigkill_mid_run_then_resume(tmp_path):
    spec, out = _write_spec(tmp_path), tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-m", "thermo_lens.cli", "study", str(spec), "--out", str(out), "--no-report"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    killed_with = None
    while time.time() < deadline and proc.poll() is None:
        manifest = out / "manifest.json"
        if manifest.exists():
            try:
                entries = json.loads(manifest.read_text())["models"]
            except (json.JSONDecodeError, KeyError):
                entries = {}
            if entries.get("gpt2-tiny-wd", {}).get("status") == "done":
                proc.send_signal(signal.SIGKILL)
                killed_with = {k: v["status"] for k, v in entries.items()}
                break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert killed_with is not None, "the study finished before it could be killed"
    assert killed_with["gpt2-tiny-nowd"] != "done"  # it really was killed mid-run
    done_sha = study.read_manifest(out)["models"]["gpt2-tiny-wd"]["sha256"]
    outcome = run_study(study.load_spec(spec), out)
    assert "gpt2-tiny-wd" in outcome.skipped and outcome.ok
    assert set(study.load_profiles(out)) == {"gpt2-tiny-wd", "neox-tiny", "gpt2-tiny-nowd"}
    assert study.read_manifest(out)["models"]["gpt2-tiny-wd"]["sha256"] == done_sha


@pytest.mark.slow
def test_ray_executor_matches_local(tmp_path):
    ray = pytest.importorskip("ray")
    spec = _spec(ZOO_A, ZOO_B)
    local = run_study(spec, tmp_path / "local")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_study(spec, tmp_path / "ray", executor="ray")
    finally:
        ray.shutdown()
    assert local.ok and remote.ok and set(remote.done) == {"a", "b"}
    a, b = study.load_profiles(tmp_path / "local"), study.load_profiles(tmp_path / "ray")
    for mid in "ab":
        assert torch.equal(a[mid].gain.block_gain, b[mid].gain.block_gain)
        assert torch.equal(a[mid].sheaf.trace, b[mid].sheaf.trace)
        assert torch.equal(a[mid].spectral.ov_norm, b[mid].spectral.ov_norm)
    assert study.read_manifest(tmp_path / "ray")["study"]["executor"] == "ray"
