"""Studies and the CLI under hostile or mistaken input: no write outside the output folder, no
silent loss, no traceback for a user error (issue: hardening). CLI calls run in-process."""

import dataclasses
import errno
import json
import os
import shutil
import time
import tracemalloc

import pytest
import study_helpers

from thermo_lens import cli, zoo
from thermo_lens.core import safe_io
from thermo_lens.experiments import study
from thermo_lens.experiments.study import ModelSpec, StudySpec, StudySpecError, load_spec

PROMPTS = ["The capital of France is", "Water freezes at"]


# Each test runs the CLI on a study folder (about half a second each): the slow tier, with the
# other end-to-end study tests (the fast loop keeps the spec, manifest and fingerprint unit tests).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def template():
    return study_helpers.template()  # one real profile per session, shared by the study tests


@pytest.fixture
def fast(template, monkeypatch):
    """Replace the model load + profile with a real profile relabelled per model (no model load),
    and record which models were 'loaded'."""
    calls = []

    def fake(model, settings):
        calls.append(model.id)
        meta = {**template.meta, "name": model.id, "token_scope": settings["token_scope"],
                "prepend_bos": settings["prepend_bos"], "lab": model.lab, "family": model.family}
        return dataclasses.replace(template, meta=meta).to_json()

    monkeypatch.setattr(study.run, "profile_one", fake)
    # These tests are about folders and files: the report's laws on the paper's tables plus the
    # user's models (seconds of exact permutation tests; tests/report/test_report_default.py) are skipped.
    monkeypatch.setattr("thermo_lens.report._paper_plus_laws", lambda doc, rows: doc.p("(laws skipped in this test)"))
    return calls


@pytest.fixture
def no_hub(monkeypatch):
    """Any attempt to boot a non-zoo model fails the test."""
    from transformer_lens.model_bridge import TransformerBridge

    def boom(*a, **k):
        raise AssertionError(f"a model load was attempted: {a}")

    monkeypatch.setattr(TransformerBridge, "boot_transformers", boom)


def _main(args, capsys):
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def _spec(tmp_path, models, study_extra="", name="spec.toml"):
    text = f'[study]\nname = "t"\nprompts = {json.dumps(PROMPTS)}\n{study_extra}\n'
    for m in models:
        text += "\n[[models]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in m.items())
    p = tmp_path / name
    p.write_text(text)
    return p


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---------------------------------------------------------------------------- 1. paths and ids
@pytest.mark.parametrize("bad_id", ["/abs/path/victim", "../escaped", "a/b", "x\u0000y", "manifest", "Manifest",
                                    ".hidden", "lock", "report", "summary.csv"])
def test_spec_ids_cannot_leave_the_folder_or_collide_with_reserved_names(tmp_path, capsys, fast, bad_id):
    victim = tmp_path / "abs" / "path" / "victim.json"
    victim.parent.mkdir(parents=True)
    victim.write_text("precious")
    if bad_id.startswith("/abs"):
        bad_id = str(tmp_path) + bad_id
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": bad_id}])
    rc, _, err = _main(["study", spec, "--out", tmp_path / "out"], capsys)
    assert rc == 2 and "field 'models[0].id'" in err
    assert "cannot name a result file" in err or "NUL character" in err
    assert victim.read_text() == "precious" and not (tmp_path / "escaped.json").exists()
    assert not (tmp_path / "out").exists() and not fast  # refused before anything ran


def test_checkpoint_folder_named_manifest_gets_a_safe_id(tmp_path, capsys, fast):
    ckpt = tmp_path / "manifest"
    shutil.copytree(zoo.path("gpt2-tiny-wd"), ckpt)
    out = tmp_path / "out"
    rc, _, _ = _main(["profile", ckpt, "--out", out, "--prompts", "paper25", "--no-report"], capsys)
    assert rc == 0
    manifest = study.read_manifest(out)
    assert list(manifest["models"]) == ["manifest-model"] and (out / "manifest-model.json").is_file()
    rc, _, _ = _main(["report", out], capsys)  # the folder stays usable
    assert rc == 0 and (out / "report.html").is_file()


@pytest.mark.slow
def test_profile_same_folder_name_twice_keeps_both(tmp_path, capsys):
    """`thermo-lens profile a/tiny b/tiny` and the same zoo name twice: one result each (real models)."""
    for d in ("a", "b"):
        shutil.copytree(zoo.path("gpt2-tiny-wd"), tmp_path / d / "tiny")
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS))
    out = tmp_path / "out"
    rc, _, _ = _main(["profile", tmp_path / "a" / "tiny", tmp_path / "b" / "tiny", "neox-tiny", "neox-tiny",
                      "--prompts", prompts, "--out", out, "--no-report"], capsys)
    assert rc == 0
    profiles = study.load_profiles(out)
    assert sorted(profiles) == ["neox-tiny", "neox-tiny-2", "tiny", "tiny-2"]
    assert profiles["tiny"].meta["source"] == str(tmp_path / "a" / "tiny")
    assert profiles["tiny-2"].meta["source"] == str(tmp_path / "b" / "tiny")
    assert (out / "summary.csv").read_text().count("\n") == 5


def test_spec_name_may_be_a_zoo_name(tmp_path, capsys):
    """The study docstring promises `name` takes a zoo name: it boots offline, no hub call."""
    spec = _spec(tmp_path, [{"name": "gpt2-tiny-nowd", "threads": 1}])
    rc, _, err = _main(["study", spec, "--out", tmp_path / "out", "--no-report"], capsys)
    assert rc == 0, err
    assert study.load_profiles(tmp_path / "out")["gpt2-tiny-nowd"].meta["source"] == "zoo:gpt2-tiny-nowd"
    assert not (tmp_path / "out" / ".lock").exists()  # a successful run leaves no lock


def test_nonexistent_local_model_is_refused_before_any_load(tmp_path, capsys, no_hub):
    rc, _, err = _main(["profile", "/nonexistent/model", "--out", tmp_path / "out"], capsys)
    assert rc == 2 and "no such local checkpoint folder" in err
    assert not (tmp_path / "out").exists()
    spec = _spec(tmp_path, [{"name": "/nonexistent/model"}])
    rc, _, err = _main(["study", spec, "--out", tmp_path / "out"], capsys)
    assert rc == 2 and "spec.toml:" in err and "field 'models[0].name'" in err and "no such local checkpoint" in err


# ---------------------------------------------------------------------------- 2. atomic, no symlinks
def test_symlinks_in_the_output_folder_are_never_written_through(tmp_path, capsys, fast):
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "m"}])
    assert _main(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0  # a study folder (a foreign one is refused)
    victims = {}
    for name in ("summary.csv", "report.html", "m.json"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("precious")
        (out / name).unlink(missing_ok=True)
        (out / name).symlink_to(victims[name])
    rc, _, err = _main(["study", spec, "--out", out], capsys)
    assert rc == 0, err
    for name, victim in victims.items():
        assert victim.read_text() == "precious"
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0
    assert set(study.load_profiles(out)) == {"m"}


def test_symlinked_lock_or_manifest_is_refused(tmp_path, capsys, fast):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "m"}])
    for name in (".lock", "manifest.json"):
        out = tmp_path / f"out{name}"
        out.mkdir()
        (out / name).symlink_to(victim)
        rc, _, err = _main(["study", spec, "--out", out], capsys)
        assert rc == 2 and "symbolic link" in err
        assert victim.read_text() == "precious" and not fast


def test_killed_run_temp_files_are_cleaned_and_no_lock_is_left(tmp_path, capsys, fast):
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{safe_io.TEMP_PREFIX}m.json.x1y2.tmp").write_text("half a result")
    (out / f"{safe_io.TEMP_PREFIX}report.html.abcd.tmp").write_text("half a report")
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "m"}])
    rc, _, _ = _main(["study", spec, "--out", out], capsys)
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == ["m.json", "manifest.json", "report.html", "summary.csv"]


def test_disk_full_during_a_run_is_a_clear_error(tmp_path, capsys, fast, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safe_io.os, "fsync", full)
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "m"}])
    rc, _, err = _main(["study", spec, "--out", tmp_path / "out"], capsys)
    monkeypatch.undo()
    assert rc == 2 and "no space left on the device" in err
    assert [p.name for p in (tmp_path / "out").iterdir()] == []  # no temp file, no lock


# ---------------------------------------------------------------------------- 3. spec limits
BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize("text, match", [
    ("study:\n  name: bomb\n  prompts:\n" + "".join("    " + line + "\n" for line in BOMB.splitlines())
     + "models:\n  - zoo: gpt2-tiny-wd\n", "values with YAML aliases expanded"),
    ("study: {name: x}\nmodels:\n  - zoo: gpt2-tiny-wd\n    device_map:\n"
     + "".join("      " + line + "\n" for line in BOMB.splitlines()), "values with YAML aliases expanded"),
    ("study: &s {name: x, self: *s}\nmodels: [{zoo: gpt2-tiny-wd}]\n", "refers to itself"),
    ("study:\n  name: x\n  prompts: &p [x, *p]\nmodels: [{zoo: gpt2-tiny-wd}]\n", "refers to itself"),
    ("a: &a [x]\nb: [" + ", ".join(["*a"] * 1500) + "]\n", "more than 1000 YAML aliases"),
])
@pytest.mark.slow
def test_yaml_alias_bombs_are_refused_fast(tmp_path, text, match, capsys, fast):
    p = tmp_path / "bomb.yaml"
    p.write_text(text)
    assert len(text) < 12000
    tracemalloc.start()
    t0 = time.perf_counter()
    rc, _, err = _main(["study", p, "--out", tmp_path / "out"], capsys)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rc == 2 and match in err and len(err) < 1000, err
    assert seconds < 10 and peak < 50 * 2**20
    assert not (tmp_path / "out").exists() and not fast


def test_yaml_anchors_and_merge_keys_still_work(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text("study: {name: y, prompts: &p [The capital of France is, Water freezes at]}\n"
                 "models:\n"
                 "  - &m {zoo: neox-tiny, lab: zoo, dtype: float32, threads: 1}\n"
                 "  - {<<: *m, zoo: gpt2-tiny-wd}\n")
    spec = load_spec(p)
    assert [(m.zoo, m.lab, m.dtype, m.threads) for m in spec.models] == [
        ("neox-tiny", "zoo", "float32", 1), ("gpt2-tiny-wd", "zoo", "float32", 1)]


@pytest.mark.parametrize("suffix, text", [
    (".yaml", "study: " + "[" * 5000 + "]" * 5000 + "\n"),
    (".yaml", "study:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(200))),
    (".toml", "[study]\nname = " + "[" * 5000 + "]" * 5000 + "\n"),
    (".toml", "[study]\nname = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n"),
])
def test_deep_nesting_is_a_clear_error(tmp_path, suffix, text):
    p = tmp_path / f"deep{suffix}"
    p.write_text(text)
    with pytest.raises(StudySpecError, match="nested|invalid"):
        load_spec(p)


def test_spec_size_limit_and_bom(tmp_path, capsys):
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 << 20) + "\n")
    rc, _, err = _main(["study", big, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "larger than 1,048,576 bytes" in err
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd"}])
    spec.write_bytes(b"\xef\xbb\xbf" + spec.read_bytes())
    assert load_spec(spec).models[0].zoo == "gpt2-tiny-wd"
    yml = tmp_path / "bom.yaml"
    yml.write_bytes(b"\xef\xbb\xbfstudy: {name: y}\nmodels: [{zoo: neox-tiny}]\n")
    assert load_spec(yml).name == "y"


def test_errors_quote_a_bounded_excerpt(tmp_path):
    huge = "z" * 200_000
    for field, value in (("token_scope", huge), ("name", 5), ("prompts", huge)):
        p = tmp_path / "s.toml"
        p.write_text(f"[study]\n{field} = {json.dumps(value)}\n\n[[models]]\nzoo = \"neox-tiny\"\n")
        with pytest.raises(StudySpecError) as e:
            load_spec(p)
        assert len(str(e.value)) < 1000, field


# ---------------------------------------------------------------------------- 4. the manifest is the truth
@pytest.mark.slow
def test_results_of_models_no_longer_in_the_spec_are_stale(tmp_path, capsys, fast):
    out = tmp_path / "out"
    first = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}, {"zoo": "neox-tiny", "id": "b"}])
    assert _main(["study", first, "--out", out], capsys)[0] == 0
    second = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}], name="second.toml")
    rc, stdout, _ = _main(["study", second, "--out", out], capsys)
    assert rc == 0 and "stale" in stdout and " b" in stdout.split("stale")[1]
    assert (out / "b.json").is_file()  # kept on disk
    manifest = study.read_manifest(out)
    assert manifest["models"]["b"]["stale"] is True and manifest["study"]["models"] == ["a"]
    assert set(study.load_profiles(out)) == {"a"}
    summary = (out / "summary.csv").read_text()
    assert summary.count("\n") == 2 and "\nb," not in summary
    assert "b.json" not in (out / "report.html").read_text() and ">b<" not in (out / "report.html").read_text()
    (out / "b.json").unlink()  # deleting a stale file breaks nothing
    assert _main(["study", second, "--out", out], capsys)[0] == 0


@pytest.mark.slow
def test_deleted_result_is_recomputed_not_a_dead_end(tmp_path, capsys, fast):
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}, {"zoo": "neox-tiny", "id": "b"}])
    assert _main(["study", spec, "--out", out], capsys)[0] == 0
    (out / "a.json").unlink()
    rc, stdout, err = _main(["report", out], capsys)  # b is still reported; a is named
    assert rc == 0 and "a.json is missing" in stdout and "1 result(s) left out" in err
    fast.clear()
    rc, _, _ = _main(["study", spec, "--out", out], capsys)
    assert rc == 0 and fast == ["a"] and (out / "a.json").is_file()
    assert "recomputed" in study.read_manifest(out)["models"]["a"]["note"]


@pytest.mark.slow
def test_hand_edited_manifest_pointing_at_another_models_file_is_refused(tmp_path, capsys, fast):
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}, {"zoo": "neox-tiny", "id": "b"}])
    assert _main(["study", spec, "--out", out], capsys)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["models"]["a"].update(file="b.json", sha256=manifest["models"]["b"]["sha256"])
    (out / "manifest.json").write_text(json.dumps(manifest))
    contents = study.read_study(out)
    assert set(contents.profiles) == {"b"} and "points it at 'b.json'" in contents.problems["a"]
    # the same with the file copied over: the profile inside names another model
    shutil.copy(out / "b.json", out / "a.json")
    manifest["models"]["a"]["file"] = "a.json"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert "holds the profile of 'b'" in study.read_study(out).problems["a"]
    # a path outside the folder
    manifest["models"]["a"]["file"] = "../../etc/passwd"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert "points it at" in study.read_study(out).problems["a"]
    fast.clear()
    assert _main(["study", spec, "--out", out], capsys)[0] == 0 and fast == ["a"]
    assert study.load_profiles(out)["a"].meta["name"] == "a"


def test_result_from_other_settings_is_not_accepted(tmp_path, capsys, fast):
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    assert _main(["study", spec, "--out", out], capsys)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["study"]["settings"]["token_scope"] = "last"
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert study.read_study(out).problems["a"] == "measured with other settings"


def test_result_whose_recorded_bos_mode_differs_is_not_accepted(tmp_path, capsys, fast):
    # The study asks prepend_bos="host"; the profile records both what it resolved to and the
    # mode asked for. A result file measured with an explicit mode is refused, even when the
    # manifest's SHA-256 was updated to match it.
    import dataclasses
    import hashlib

    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    assert _main(["study", spec, "--out", out], capsys)[0] == 0
    prof = study.load_profiles(out)["a"]
    assert prof.meta["prepend_bos_requested"] == "host"
    raw = dataclasses.replace(prof, meta={**prof.meta, "prepend_bos_requested": True}).to_json().encode()
    (out / "a.json").write_bytes(raw)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["models"]["a"]["sha256"] = hashlib.sha256(raw).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert "measured with prepend_bos=True, the study uses 'host'" in study.read_study(out).problems["a"]


@pytest.mark.slow
def test_one_corrupt_result_does_not_refuse_the_whole_report(tmp_path, capsys, fast):
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}, {"zoo": "neox-tiny", "id": "b"}])
    assert _main(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0
    (out / "a.json").write_bytes(b"\xff\xfe not json")
    rc, stdout, err = _main(["report", out], capsys)
    assert rc == 0 and "a " in stdout and "SHA-256" in stdout and "1 result(s) left out" in err
    assert (out / "summary.csv").read_text().count("\n") == 2


@pytest.mark.parametrize("content, match", [
    (b"{not json", "is corrupt"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"models": []}', "'models' is not an object"),
    (b'{"models": {"a": 5}}', "entry 'a' is not an object"),
    (b'{"models": {}, "study": {"models": "a"}}', "'study.models' is not a list"),
    (b"\xff\xfe\x00", "not UTF-8"),
    (b"[" * 100000, "corrupt"),
])
def test_corrupt_or_wrongly_shaped_manifest_exits_2(tmp_path, capsys, fast, content, match):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_bytes(content)
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    for args in (["study", spec, "--out", out], ["report", out]):
        rc, _, err = _main(args, capsys)
        assert rc == 2 and match in err and "delete it" in err
    assert (out / "manifest.json").read_bytes() == content  # never overwritten


# ---------------------------------------------------------------------------- 5. CLI errors: exit 2, no traceback
def test_cli_bad_options_exit_2_before_any_load(tmp_path, capsys, no_hub):
    with pytest.raises(SystemExit) as e:
        cli.main(["profile", "gpt2-tiny-wd", "--batch-size", "0"])
    assert e.value.code == 2 and "--batch-size" in capsys.readouterr().err
    rc, _, err = _main(["profile", "gpt2-tiny-wd", "--device", "banana", "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "device must be a torch device" in err and not (tmp_path / "o").exists()
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "device": "cuda:7"}])
    rc, _, err = _main(["study", spec, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "device='cuda:7'" in err and "CUDA device" in err
    for model in ({"zoo": "gpt2-tiny-wd", "threads": 0}, {"zoo": "gpt2-tiny-wd", "device": "banana"},
                  {"zoo": "gpt2-tiny-wd", "num_gpus": -5}, {"zoo": "gpt2-tiny-wd", "lab": ["x"]},
                  {"name": 5}, {"name": "not a hub id!"}, {"zoo": "gpt2-tiny-wd", "dtype": "float8"}):
        spec = _spec(tmp_path, [model])
        rc, _, err = _main(["study", spec, "--out", tmp_path / "o"], capsys)
        assert rc == 2 and "spec.toml:" in err, (model, err)
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd"}], study_extra='truncate = "no"')
    rc, _, err = _main(["study", spec, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "study.truncate" in err
    assert not (tmp_path / "o").exists()


def test_cli_file_errors_exit_2(tmp_path, capsys, fast, monkeypatch):
    good = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    (tmp_path / "dir.toml").mkdir()
    latin = tmp_path / "latin.toml"
    latin.write_bytes("[study]\nname = 'café'\n".encode("latin-1"))
    afile = tmp_path / "afile"
    afile.write_text("")
    badp = tmp_path / "prompts.txt"
    badp.write_bytes(b"\xff\xfe\xfa")
    cases = [
        (["study", tmp_path / "dir.toml", "--out", tmp_path / "o"], "is a directory"),
        (["study", latin, "--out", tmp_path / "o"], "not UTF-8"),
        (["profile", "gpt2-tiny-wd", "--prompts", badp, "--out", tmp_path / "o"], "prompt file"),
        (["profile", "gpt2-tiny-wd", "--prompts", tmp_path, "--out", tmp_path / "o"], "is a directory"),
        (["study", good, "--out", afile], "is a file"),
        (["study", good, "--out", afile / "sub"], "not a folder"),
        (["report", afile], "not a folder"),
    ]
    for args, match in cases:
        rc, _, err = _main(args, capsys)
        assert rc == 2 and match in err, (args, err)
    assert not (tmp_path / "o").exists()
    # unreadable spec (simulated: tests may run as root)
    real_open = os.open

    def denied(path, *a, **k):
        if str(path) == str(good):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(safe_io.os, "open", denied)
    rc, _, err = _main(["study", good, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "permission denied" in err
    monkeypatch.undo()
    # read-only output folder (simulated the same way)
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    rc, _, err = _main(["study", good, "--out", tmp_path / "ro"], capsys)
    assert rc == 2 and "not writable" in err


def test_report_output_must_be_in_an_existing_folder(tmp_path, capsys, fast):
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    assert _main(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0
    afile = tmp_path / "afile"
    afile.write_text("keep")
    rc, _, err = _main(["report", out, "--output", afile / "r.html"], capsys)
    assert rc == 2 and "is a file, not a folder" in err and afile.read_text() == "keep"
    rc, _, err = _main(["report", out, "--output", tmp_path / "x" / "y" / "r.html"], capsys)
    assert rc == 2 and "does not exist" in err and not (tmp_path / "x").exists()
    (tmp_path / "reports").mkdir()
    rc, _, _ = _main(["report", out, "--output", tmp_path / "reports"], capsys)
    assert rc == 0 and (tmp_path / "reports" / "report.html").is_file()
    assert not [p for p in (tmp_path / "reports").iterdir() if p.name.startswith(".")]


def test_summary_csv_neutralises_formulas(tmp_path, capsys, fast):
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a", "lab": "=HYPERLINK(\"http://evil\",\"x\")"},
                            {"zoo": "neox-tiny", "id": "b", "lab": "@SUM(1+1)"}])
    assert _main(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0
    import pandas as pd

    frame = pd.read_csv(out / "summary.csv")
    assert frame["lab"].tolist() == ["'=HYPERLINK(\"http://evil\",\"x\")", "'@SUM(1+1)"]
    assert pd.api.types.is_float_dtype(frame["gain"])
    lines = (out / "summary.csv").read_text().splitlines()
    assert not any(cell.startswith(("=", "+", "@")) for line in lines for cell in line.split(","))


def test_summary_csv_neutralises_a_formula_after_a_line_break(tmp_path, capsys, fast):
    """A CR (or LF) inside `lab`/`family` followed by a formula: a reader that splits lines, or a
    spreadsheet that takes the cell apart, would see `=...` at a line start (issue 27)."""
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a", "lab": "x\r=HYPERLINK(\"http://evil\",\"x\")",
                             "family": "f\n@SUM(1+1)"},
                            {"zoo": "neox-tiny", "id": "b", "lab": "\r\n+cmd", "family": "ok\x1b[2J"}])
    assert _main(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0
    text = (out / "summary.csv").read_text()
    for line in text.replace('"', "").splitlines():
        assert not any(cell.startswith(("=", "+", "@")) for cell in line.split(",")), line
    assert "\x1b" not in text and "ok\\x1b[2J" in text
    import pandas as pd

    frame = pd.read_csv(out / "summary.csv")
    assert frame["lab"].tolist() == ["x\r'=HYPERLINK(\"http://evil\",\"x\")", "'\r\n'+cmd"]
    assert frame["family"].tolist() == ["f\n'@SUM(1+1)", "ok\\x1b[2J"]


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(StudySpecError):
        cli.main(["--debug", "study", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o")])


def test_report_cleans_a_killed_reports_temp_and_respects_the_lock(tmp_path, capsys, fast):
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    assert _main(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0
    (out / f"{safe_io.TEMP_PREFIX}report.html.k1ll.tmp").write_text("<html> half")
    with safe_io.FolderLock(out):
        rc, _, err = _main(["report", out], capsys)
        assert rc == 2 and "the study 't' in" in err and "is still running" in err, err
    assert _main(["report", out], capsys)[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "manifest.json", "report.html", "summary.csv"]


@pytest.mark.slow
def test_stale_failed_model_is_not_reported(tmp_path, capsys, template, monkeypatch):
    def flaky(model, settings):
        if model.id == "bad":
            raise RuntimeError("it broke")
        meta = {**template.meta, "name": model.id, "token_scope": settings["token_scope"],
                "prepend_bos": settings["prepend_bos"]}
        return dataclasses.replace(template, meta=meta).to_json()

    monkeypatch.setattr(study.run, "profile_one", flaky)
    out = tmp_path / "out"
    first = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}, {"zoo": "neox-tiny", "id": "bad"}])
    assert _main(["study", first, "--out", out], capsys)[0] == 1
    assert "it broke" in (out / "report.html").read_text()
    second = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}], name="second.toml")
    assert _main(["study", second, "--out", out], capsys)[0] == 0
    assert "it broke" not in (out / "report.html").read_text()


def test_ids_differing_only_in_case_collide(tmp_path):
    p = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "Model"}, {"zoo": "neox-tiny", "id": "model"}])
    with pytest.raises(StudySpecError, match="duplicate model id 'model'"):
        load_spec(p)
    with pytest.raises(ValueError, match="duplicate model id"):
        StudySpec(name="s", models=(ModelSpec(id="A", zoo="neox-tiny"), ModelSpec(id="a", zoo="neox-tiny")))


def test_hand_edited_manifest_cannot_drive_the_terminal(tmp_path, capsys, fast):
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    assert _main(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["study"]["models"].append("\x1b]0;pwned\x07../../x")
    manifest["models"]["\x1b[2Jold"] = {"status": "done"}
    (out / "manifest.json").write_text(json.dumps(manifest))
    rc, stdout, err = _main(["report", out], capsys)
    assert rc == 0 and "\x1b" not in stdout + err and "?]0;pwned" in stdout


def test_a_profile_function_returning_no_json_is_a_recorded_failure(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "None").write_text("{}")  # from_json(None) used to read a file named "None"
    spec = StudySpec(name="s", models=(ModelSpec(id="a", zoo="gpt2-tiny-wd"),), prompts=PROMPTS)
    outcome = study.run_study(spec, tmp_path / "out", profile_fn=lambda m, s: None)
    assert "returned NoneType, not profile JSON text" in outcome.failed["a"]


@pytest.mark.slow
def test_a_manifest_written_before_hardening_is_still_accepted(tmp_path, capsys, fast):
    """Folders of earlier versions (no current-model list, no model records, a leftover .lock)
    resume without recomputing and report as before."""
    out = tmp_path / "out"
    spec = _spec(tmp_path, [{"zoo": "gpt2-tiny-wd", "id": "a"}, {"zoo": "neox-tiny", "id": "b"}])
    assert _main(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["thermo_lens_manifest"], manifest["study"]["models"]
    for entry in manifest["models"].values():
        del entry["model"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / ".lock").write_text("12345")  # earlier versions left it behind
    assert set(study.read_study(out).profiles) == {"a", "b"}
    fast.clear()
    assert _main(["study", spec, "--out", out], capsys)[0] == 0 and fast == []
    assert not (out / ".lock").exists()
