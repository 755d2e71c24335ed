"""A study result is reused only while the model's weights are the ones it was measured on
(issue 27: a local checkpoint whose weights were replaced at the same path was resumed)."""

import json
import os
import shutil
import struct

import pytest
from study_helpers import fake_profile, run_cli, write_spec

from thermo_lens import zoo
from thermo_lens.experiments import study
from thermo_lens.experiments.study import checkpoint_fingerprint, weights_changed


@pytest.fixture
def calls(monkeypatch):
    out: list = []
    monkeypatch.setattr(study.run, "profile_one", fake_profile(out))
    return out


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(zoo.path("gpt2-tiny-wd"), path)
    return path


def _replace_weights_keeping_size_header_and_mtime(ckpt):
    """Other weights of the same architecture: same size, same safetensors header (names,
    dtypes, shapes, offsets), and the old file's modification time restored."""
    target, src = ckpt / "model.safetensors", zoo.path("gpt2-tiny-nowd") / "model.safetensors"
    old, new = target.read_bytes(), src.read_bytes()
    header = 8 + struct.unpack("<Q", old[:8])[0]
    assert len(old) == len(new) and old[:header] == new[:header] and old != new
    st = target.stat()
    (ckpt / "incoming").write_bytes(new)
    os.replace(ckpt / "incoming", target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_mtime_ns == st.st_mtime_ns and target.stat().st_size == st.st_size


@pytest.mark.slow
def test_replaced_weights_at_the_same_path_are_profiled_again(tmp_path, capsys, calls, ckpt):
    out = tmp_path / "out"
    args = ["profile", ckpt, "--out", out, "--no-report"]
    assert run_cli(args, capsys)[0] == 0 and calls == ["ckpt"]
    calls.clear()
    assert run_cli(args, capsys)[0] == 0 and calls == []  # unchanged: resumed
    _replace_weights_keeping_size_header_and_mtime(ckpt)
    assert "changed since it was measured" in study.read_study(out).problems["ckpt"]  # not reported as current
    rc, stdout, _ = run_cli(args, capsys)
    assert rc == 0 and calls == ["ckpt"]
    assert "model.safetensors differs" in stdout and "recomputed" in stdout
    note = study.read_manifest(out)["models"]["ckpt"]["note"]
    assert f"the weights in {ckpt} changed since it was measured" in note
    calls.clear()
    assert run_cli(args, capsys)[0] == 0 and calls == []  # the new weights' result is resumed


def test_a_copied_or_touched_checkpoint_with_the_same_bytes_is_still_resumed(tmp_path, capsys, calls, ckpt):
    out = tmp_path / "out"
    spec = write_spec(tmp_path / "spec.toml", [{"name": str(ckpt), "id": "m"}])
    assert run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0
    weights = study.read_manifest(out)["models"]["m"]["weights"]
    assert weights["kind"] == "folder" and weights["path"] == str(ckpt.resolve())
    assert set(weights["files"]) == {"config.json", "generation_config.json", "model.safetensors", "recipe.json",
                                     "tokenizer.json", "tokenizer_config.json"}
    (ckpt / "model.safetensors").touch()
    data = (ckpt / "config.json").read_bytes()
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").write_bytes(data)  # a new inode and ctime, the same bytes
    (ckpt / "optimizer.pt").write_bytes(b"training state, not the model")
    (ckpt / "README.md").write_text("a model card")
    calls.clear()
    assert run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0 and calls == []
    again = study.read_manifest(out)["models"]["m"]["weights"]
    assert again["digest"] == weights["digest"]
    assert again["files"]["config.json"]["stat"] != weights["files"]["config.json"]["stat"]  # the new stat is kept
    (ckpt / "tokenizer.json").write_text("{}")  # the tokenizer decides the tokens: part of the model
    assert run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0 and calls == ["m"]


@pytest.mark.slow  # renders a report
def test_the_report_leaves_out_a_result_whose_weights_changed_since(tmp_path, capsys, calls, ckpt):
    out = tmp_path / "out"
    assert run_cli(["profile", ckpt, "gpt2-tiny-nowd", "--out", out, "--no-report"], capsys)[0] == 0
    _replace_weights_keeping_size_header_and_mtime(ckpt)
    rc, stdout, err = run_cli(["report", out], capsys)
    assert rc == 0 and "1 result(s) left out" in err
    assert "ckpt" in stdout and "changed since it was measured" in stdout and "model.safetensors differs" in stdout
    assert set(study.read_study(out).profiles) == {"gpt2-tiny-nowd"}
    summary = (out / "summary.csv").read_text()
    assert "gpt2-tiny-nowd" in summary and "\nckpt," not in summary


def test_weights_replaced_while_being_profiled_are_not_recorded_as_measured(tmp_path, capsys, monkeypatch, ckpt):
    calls: list = []
    monkeypatch.setattr(study.run, "profile_one", fake_profile(
        calls, side_effect=lambda m: _replace_weights_keeping_size_header_and_mtime(ckpt)))
    out = tmp_path / "out"
    rc, _, err = run_cli(["profile", ckpt, "--out", out, "--no-report"], capsys)
    entry = study.read_manifest(out)["models"]["ckpt"]
    assert rc == 1 and entry["status"] == "failed" and calls == ["ckpt"]
    assert "changed since it was measured" in entry["error"] and "while it was being profiled" in entry["error"]
    assert not (out / "ckpt.json").exists() and not (out / "summary.csv").exists()


def test_a_manifest_without_fingerprints_adopts_them_then_checks_them(tmp_path, capsys, calls, ckpt):
    out = tmp_path / "out"
    args = ["profile", ckpt, "--out", out, "--no-report"]
    assert run_cli(args, capsys)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["models"]["ckpt"]["weights"]  # written before fingerprints
    (out / "manifest.json").write_text(json.dumps(manifest))
    calls.clear()
    assert run_cli(args, capsys)[0] == 0 and calls == []
    assert study.read_manifest(out)["models"]["ckpt"]["weights"]["kind"] == "folder"
    _replace_weights_keeping_size_header_and_mtime(ckpt)
    assert run_cli(args, capsys)[0] == 0 and calls == ["ckpt"]


def test_a_hub_model_is_matched_by_its_cached_revision(tmp_path, capsys, calls, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    ref = cache / "models--some-org--tiny" / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    out = tmp_path / "out"
    spec = write_spec(tmp_path / "spec.toml", [{"name": "some-org/tiny", "id": "t"}])
    assert run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0 and calls == ["t"]
    assert study.read_manifest(out)["models"]["t"]["weights"] == {"kind": "hub", "repo": "some-org/tiny",
                                                                  "revision": "a" * 40, "digest": "a" * 40}
    calls.clear()
    assert run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0 and calls == []
    ref.write_text("b" * 40)  # the cached main branch moved on
    rc, stdout, _ = run_cli(["study", spec, "--out", out, "--no-report"], capsys)
    assert rc == 0 and calls == ["t"] and "now at revision bbbbbbbbbbbb" in stdout
    shutil.rmtree(cache)  # not cached any more: nothing to compare, the result stands
    calls.clear()
    assert run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0 and calls == []


# ---------------------------------------------------------------------------- the fingerprint itself
def test_fingerprint_reuses_a_recorded_hash_only_while_the_stat_is_unchanged(ckpt):
    first = checkpoint_fingerprint(None, str(ckpt))
    forged = json.loads(json.dumps(first))
    forged["files"]["model.safetensors"]["sha256"] = "0" * 64
    # same stat: the recorded hash is trusted (no read), which is what makes a resume cheap
    assert checkpoint_fingerprint(None, str(ckpt), forged)["files"]["model.safetensors"]["sha256"] == "0" * 64
    os.utime(ckpt / "model.safetensors")  # any change of the stat: hashed again
    assert checkpoint_fingerprint(None, str(ckpt), forged)["files"]["model.safetensors"]["sha256"] == \
        first["files"]["model.safetensors"]["sha256"]


def test_fingerprint_kinds_and_reasons(ckpt, tmp_path):
    import hashlib

    fp = checkpoint_fingerprint(None, str(ckpt))
    raw = (ckpt / "model.safetensors").read_bytes()
    assert fp["files"]["model.safetensors"] == {**fp["files"]["model.safetensors"], "size": len(raw),
                                                "sha256": hashlib.sha256(raw).hexdigest()}
    assert checkpoint_fingerprint("gpt2-tiny-wd", None)["digest"] == fp["digest"]  # the zoo folder's own files
    (tmp_path / "afile").write_text("x")
    assert checkpoint_fingerprint(None, str(tmp_path / "afile")) is None  # no checkpoint a loader reads
    (ckpt / "extra.safetensors").write_bytes(b"x")
    (ckpt / "recipe.json").unlink()
    why = weights_changed(fp, checkpoint_fingerprint(None, str(ckpt)))
    assert why is not None and "extra.safetensors added" in why and "recipe.json removed" in why
    assert weights_changed(None, fp) is None  # nothing recorded: nothing to question
    assert weights_changed(fp, fp) is None
    # reading a study elsewhere: another folder or none at all is not evidence of a change
    assert weights_changed(fp, None, strict=False) is None
    assert weights_changed(fp, None) is not None
