"""The first ten minutes at the command line (issue 25): typos of embedded names, an offline or
unreachable hub, a missing prompt file and repeated ``profile`` runs into one folder."""

import csv
import socket
import time

import pytest
from study_helpers import fake_profile, run_cli

from thermo_lens import zoo
from thermo_lens.experiments import study
from thermo_lens.experiments.study import sources


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_typo_of_an_embedded_name_suggests_it_and_lists_them(tmp_path, capsys, monkeypatch):
    calls: list = []
    monkeypatch.setattr(study.run, "profile_one", fake_profile(calls))
    start = time.perf_counter()
    rc, _, err = run_cli(["profile", "gpt2-tiny-wdd", "--out", tmp_path / "o"], capsys)
    assert time.perf_counter() - start < 3
    assert rc == 2 and calls == []
    assert "did you mean gpt2-tiny-wd?" in err
    assert all(n in err for n in zoo.names())
    assert not (tmp_path / "o").exists()  # nothing was started


def test_only_bare_names_are_taken_for_misspelt_embedded_ones(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sources, "_cached", lambda repo_id: True)
    sources.check_model_name("someorg/gpt2-tiny-wdd")  # a hub id, cached: fine, no suggestion
    with pytest.raises(Exception, match="no such local checkpoint folder"):
        sources.check_model_name("./gpt2-tiny-wdd")
    with pytest.raises(Exception, match="did you mean neox-tiny"):
        sources.check_model_name("NeoX-tiny")


def test_zoo_path_suggests_too():
    with pytest.raises(KeyError, match="did you mean 'neox-tiny'"):
        zoo.path("neox-tiny2")


def test_name_that_cannot_be_a_hub_id_fails_at_once_with_the_embedded_list(tmp_path, capsys):
    rc, _, err = run_cli(["profile", "no such model!", "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "hub id" in err and "Embedded models: " + ", ".join(zoo.names()) in err


def test_hub_id_offline_and_not_cached_says_how_to_work_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(sources, "_cached", lambda repo_id: False)
    start = time.perf_counter()
    rc, _, err = run_cli(["profile", "someorg/some-model", "--out", tmp_path / "o"], capsys)
    assert time.perf_counter() - start < 3
    assert rc == 2 and "HF_HUB_OFFLINE is set" in err and "To work offline" in err and "gpt2-tiny-wd" in err


def test_unreachable_hub_fails_within_seconds(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    for v in sources._PROXY_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(sources, "_cached", lambda repo_id: False)
    monkeypatch.setattr(sources, "_endpoint", lambda: f"http://127.0.0.1:{_closed_port()}")
    start = time.perf_counter()
    rc, _, err = run_cli(["profile", "someorg/some-model", "--out", tmp_path / "o"], capsys)
    assert time.perf_counter() - start < 5
    assert rc == 2 and "cannot be reached" in err and "127.0.0.1" in err and "To work offline" in err


def test_cached_hub_id_passes_the_check(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sources, "_cached", lambda repo_id: repo_id == "org/m")
    sources.check_model_name("org/m")  # no error
    with pytest.raises(Exception, match="not in the local Hugging Face cache"):
        sources.check_model_name("org/other")


def test_missing_prompt_file_says_it_does_not_exist(tmp_path, capsys):
    rc, _, err = run_cli(["profile", "gpt2-tiny-wd", "--prompts", tmp_path / "myprompts.txt",
                          "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "myprompts.txt: no such file" in err and "paper25" in err
    rc, _, err = run_cli(["profile", "gpt2-tiny-wd", "--prompts", "myprompts", "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "unknown prompt set" in err and "no file named 'myprompts' exists" in err


@pytest.mark.slow  # one real profile for the fake results (shared with other study tests)
def test_separate_profile_runs_do_not_call_each_other_stale(tmp_path, capsys, monkeypatch):
    calls: list = []
    monkeypatch.setattr(study.run, "profile_one", fake_profile(calls))
    prompts = tmp_path / "p.txt"
    prompts.write_text("The capital of France is\nWater freezes at\n")
    out = tmp_path / "o"
    rc, _, _ = run_cli(["profile", "gpt2-tiny-wd", "--prompts", prompts, "--out", out, "--no-report"], capsys)
    assert rc == 0
    rc, text, err = run_cli(["profile", "neox-tiny", "--prompts", prompts, "--out", out, "--no-report"], capsys)
    assert rc == 0 and calls == ["gpt2-tiny-wd", "neox-tiny"]
    assert "stale" not in text + err
    assert "from earlier profile runs" in text and "gpt2-tiny-wd" in text
    with open(out / "summary.csv", newline="") as f:
        assert [r["model"] for r in csv.DictReader(f)] == ["neox-tiny"]  # only this run's models compared
    # `thermo-lens report` on that folder says the same
    rc, text, err = run_cli(["report", out], capsys)
    assert rc == 0 and "stale" not in text + err and "from earlier profile runs" in text
