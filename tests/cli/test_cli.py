"""The thermo-lens CLI: help, exit codes, errors without tracebacks, the default main job."""

import json
import shutil
import subprocess
import sys

import pytest

from thermo_lens import zoo
from thermo_lens.cli import main

CLI = [sys.executable, "-m", "thermo_lens.cli"]


def run(args, cwd=None, timeout=300):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=cwd, timeout=timeout)


@pytest.mark.parametrize("sub", [[], ["profile"], ["study"], ["report"], ["zoo"]])
def test_help_everywhere(sub, capsys):
    with pytest.raises(SystemExit) as e:
        main(sub + ["--help"])
    assert e.value.code == 0
    assert "usage: thermo-lens" in capsys.readouterr().out


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_zoo_lists_embedded_models(capsys):
    assert main(["zoo"]) == 0
    out = capsys.readouterr().out
    for name in zoo.names():
        assert name in out
    assert "weight_decay" in out  # the matched pair says which knob differs


def test_errors_have_no_traceback(tmp_path, capsys):
    """In-process (the handlers are what decides): usage errors return 2 with one line on stderr."""
    assert main(["profile", "--prompts", "no-such-set", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "thermo-lens: error: --prompts" in err and "Traceback" not in err
    bad = tmp_path / "bad.toml"
    bad.write_text("[study]\nname = 'x'\n\n[[models]]\nzoo = 'nope'\n")
    assert main(["study", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:5: field 'models[0].zoo'" in err and "Traceback" not in err
    assert main(["report", str(tmp_path)]) == 2
    assert "no manifest.json here" in capsys.readouterr().err


@pytest.mark.slow
def test_errors_have_no_traceback_from_the_console_entry_point(tmp_path):
    """The same through a real process: nothing escapes main() as a traceback."""
    r = run(["profile", "--prompts", "no-such-set", "--out", str(tmp_path / "o")])
    assert r.returncode == 2 and "thermo-lens: error: --prompts" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_failed_model_gives_exit_code_1(tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("The capital of France is\nWater freezes at\n")
    (tmp_path / "not-a-model").mkdir()  # exists, but holds no checkpoint: fails at load time
    rc = main(["profile", str(tmp_path / "not-a-model"), "gpt2-tiny-wd", "--prompts", str(prompts),
               "--out", str(tmp_path / "o"), "--no-report"])
    assert rc == 1, capsys.readouterr().err
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["models"]["gpt2-tiny-wd"]["status"] == "done"
    assert manifest["models"]["not-a-model"]["status"] == "failed"


@pytest.mark.slow
def test_default_main_job_runs_with_no_arguments(tmp_path):
    """The README's first command: `thermo-lens profile` with no arguments, offline."""
    exe = shutil.which("thermo-lens")
    cmd = [exe, "profile"] if exe else CLI + ["profile"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600,
                       env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "thermo-lens-report"
    manifest = json.loads((out / "manifest.json").read_text())
    assert {k for k, v in manifest["models"].items() if v["status"] == "done"} == set(zoo.DEFAULT)
    assert (out / "summary.csv").read_text().count("\n") == len(zoo.DEFAULT) + 1
    assert (out / "report.html").is_file()


def test_output_never_echoes_control_characters(tmp_path, capsys, monkeypatch):
    """Paths, spec keys and model names from the user are shown escaped (issue 27)."""
    from study_helpers import fake_profile, write_spec

    from thermo_lens.experiments import study

    monkeypatch.setattr(study.run, "profile_one", fake_profile([]))
    evil = "\x1b]0;pwned\x07\x1b[2J\u202e"
    spec = write_spec(tmp_path / f"spec{evil}.toml", [{"zoo": "gpt2-tiny-wd", "id": "a", "lab": f"lab{evil}"}])
    yaml_spec = tmp_path / "k.yaml"
    yaml_spec.write_text('study: {name: x, "\\e[31mkey": 1}\nmodels: [{zoo: neox-tiny}]\n')
    cases = [
        (["study", str(tmp_path / f"missing{evil}.toml"), "--out", str(tmp_path / "o1")], 2),
        (["study", str(spec), "--out", str(tmp_path / f"out{evil}"), "--no-report"], 0),
        (["study", str(yaml_spec), "--out", str(tmp_path / "o2")], 2),
        (["profile", f"org/{evil}", "--out", str(tmp_path / "o3")], 2),
        (["profile", str(tmp_path / f"ckpt{evil}"), "--out", str(tmp_path / "o4")], 2),
        (["study", str(spec), "--out", str(tmp_path / f"out{evil}" / "a.json" / "x")], 2),
    ]
    for args, code in cases:
        rc = main(args)
        out, err = capsys.readouterr()
        assert rc == code, (args, err)
        assert not any(c in out + err for c in "\x1b\x07\u202e"), (args, out + err)
    assert "out\\x1b]0;pwned\\x07" in out + err  # shown, escaped
