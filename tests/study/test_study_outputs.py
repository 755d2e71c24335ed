"""Where a study writes, and what its summary and report say (issue 27): a folder of the user's own
files, an empty or dangling --out, and a spec whose models all fail."""

import json
import os

import pytest
from study_helpers import fake_profile, run_cli, tree, write_spec

from thermo_lens.experiments import study
from thermo_lens.experiments.study import ModelSpec, StudyFolderError, StudySpec, run_study


@pytest.fixture
def calls(monkeypatch):
    out: list = []
    monkeypatch.setattr(study.run, "profile_one", fake_profile(out))
    return out


def _user_folder(path):
    path.mkdir()
    files = {"summary.csv": "my,own\n1,2\n", "report.html": "<p>my report</p>", "notes.txt": "mine"}
    for name, text in files.items():
        (path / name).write_text(text)
    return {name: ((path / name).read_text(), (path / name).stat().st_mtime_ns) for name in files}


@pytest.mark.parametrize("command", ["study", "profile"])
def test_a_folder_of_the_users_own_files_is_refused(tmp_path, capsys, calls, command):
    out = tmp_path / "mine"
    before = _user_folder(out)
    spec = write_spec(tmp_path / "spec.toml", [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    args = ["study", spec] if command == "study" else ["profile", "gpt2-tiny-wd"]
    rc, _, err = run_cli([*args, "--out", out], capsys)
    assert rc == 2 and "already holds files thermo-lens did not write" in err
    assert "notes.txt" in err and "summary.csv" in err and "choose a new or empty folder" in err
    assert {n: ((out / n).read_text(), (out / n).stat().st_mtime_ns) for n in before} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(before) and not calls
    with pytest.raises(StudyFolderError, match="already holds files"):
        run_study(StudySpec(name="s", models=(ModelSpec(id="a", zoo="gpt2-tiny-wd"),)), out)


def test_another_tools_manifest_is_not_taken_for_a_study(tmp_path, capsys, calls):
    out = tmp_path / "webapp"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"name": "My app", "icons": [], "start_url": "."}))
    (out / "summary.csv").write_text("mine")
    spec = write_spec(tmp_path / "spec.toml", [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    rc, _, err = run_cli(["study", spec, "--out", out], capsys)
    assert rc == 2 and "not a thermo-lens study manifest" in err and (out / "summary.csv").read_text() == "mine"


def test_a_folder_with_only_what_thermo_lens_or_the_desktop_leaves_is_used(tmp_path, capsys, calls):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").write_text("12345")  # an earlier version left it behind
    (out / ".thermo-lens-tmp.a.json.x1.tmp").write_text("half")
    (out / ".DS_Store").write_bytes(b"\0")
    spec = write_spec(tmp_path / "spec.toml", [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    assert run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0 and calls == ["a"]
    assert tree(out) == [".DS_Store", "a.json", "manifest.json", "summary.csv"]


@pytest.mark.parametrize("command", ["study", "profile", "report"])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_out_is_refused(tmp_path, capsys, calls, monkeypatch, command, value):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(tmp_path / "spec.toml", [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    args = {"study": ["study", spec, "--out", value], "profile": ["profile", "gpt2-tiny-wd", "--out", value],
            "report": ["report", value]}[command]
    rc, _, err = run_cli(args, capsys)
    assert rc == 2 and "name is empty" in err
    assert tree(tmp_path) == ["spec.toml"] and not calls
    with pytest.raises(StudyFolderError, match="name is empty"):
        run_study(StudySpec(name="s", models=(ModelSpec(id="a", zoo="gpt2-tiny-wd"),)), value)


def test_report_output_must_not_be_empty(tmp_path, capsys, calls, monkeypatch):
    out = tmp_path / "out"
    spec = write_spec(tmp_path / "spec.toml", [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    assert run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(["report", out, "--output", ""], capsys)
    assert rc == 2 and "name is empty" in err and not (tmp_path / "report.html").exists()


def test_a_dangling_symlink_as_out_is_refused_with_a_clear_message(tmp_path, capsys, calls):
    link = tmp_path / "results"
    link.symlink_to(tmp_path / "gone" / "away")
    spec = write_spec(tmp_path / "spec.toml", [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    for args in (["study", spec, "--out", link], ["profile", "gpt2-tiny-wd", "--out", link]):
        rc, _, err = run_cli(args, capsys)
        assert rc == 2 and "is a symbolic link to" in err and "which does not exist" in err, err
    assert not (tmp_path / "gone").exists() and link.is_symlink() and not calls
    (tmp_path / "gone" / "away").mkdir(parents=True)  # a link to an existing folder is the user's choice
    assert run_cli(["study", spec, "--out", link, "--no-report"], capsys)[0] == 0
    assert (tmp_path / "gone" / "away" / "a.json").is_file()


def test_a_spec_whose_models_all_fail_leaves_no_older_model_in_summary_or_report(tmp_path, capsys, monkeypatch):
    calls: list = []

    def broken(model):
        if model.id == "bad":
            raise RuntimeError("it broke")

    monkeypatch.setattr(study.run, "profile_one", fake_profile(calls, side_effect=broken))
    out = tmp_path / "out"
    first = write_spec(tmp_path / "first.toml", [{"zoo": "gpt2-tiny-wd", "id": "old"}])
    assert run_cli(["study", first, "--out", out, "--no-report"], capsys)[0] == 0
    (out / "report.html").write_text("<p>the report of model old</p>")  # as `thermo-lens report` leaves it
    assert "old" in (out / "summary.csv").read_text()
    second = write_spec(tmp_path / "second.toml", [{"zoo": "neox-tiny", "id": "bad"}])
    rc, stdout, err = run_cli(["study", second, "--out", out], capsys)
    assert rc == 1 and "it broke" in stdout
    assert "stale (from an earlier spec; kept on disk, left out of the summary and report): old" in stdout
    assert "no model of this spec has a result" in err and "summary.csv and report.html" in err
    assert not (out / "summary.csv").exists() and not (out / "report.html").exists()
    assert (out / "old.json").is_file()  # the stale result itself stays
    rc, stdout, err = run_cli(["report", out], capsys)  # and the report command agrees
    assert rc == 2 and "no finished model profiles" in err and not (out / "report.html").exists()


def test_a_planted_summary_link_is_removed_not_followed_when_nothing_finished(tmp_path, capsys, monkeypatch):
    def broken(model):
        raise RuntimeError("it broke")

    monkeypatch.setattr(study.run, "profile_one", fake_profile([], side_effect=broken))
    out = tmp_path / "out"
    spec = write_spec(tmp_path / "spec.toml", [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    assert run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 1
    victim = tmp_path / "victim.csv"
    victim.write_text("precious")
    (out / "summary.csv").symlink_to(victim)
    assert run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 1
    assert victim.read_text() == "precious" and not os.path.lexists(out / "summary.csv")
