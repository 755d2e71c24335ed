"""``thermo-lens report`` on folders in odd states: a study still running, a result whose field was
tampered with (its SHA-256 updated to match), a summary.csv hard-linked to a file outside."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import pytest
import study_helpers

from thermo_lens.core import safe_io
from thermo_lens.experiments import study


@pytest.fixture
def fast(monkeypatch):
    template = study_helpers.template()

    def fake(model, settings):
        meta = {**template.meta, "name": model.id, "token_scope": settings["token_scope"],
                "prepend_bos": settings["prepend_bos"], "lab": model.lab, "family": model.family}
        return dataclasses.replace(template, meta=meta).to_json()

    monkeypatch.setattr(study.run, "profile_one", fake)
    monkeypatch.setattr("thermo_lens.report._paper_plus_laws", lambda doc, rows: doc.p("(laws skipped in this test)"))


def _study(tmp_path, capsys, ids=("a", "b")):
    spec = study_helpers.write_spec(tmp_path / "spec.toml", [{"zoo": "gpt2-tiny-wd", "id": i} for i in ids])
    out = tmp_path / "out"
    assert study_helpers.run_cli(["study", spec, "--out", out, "--no-report"], capsys)[0] == 0
    return out


def test_report_on_a_running_study_names_it_and_its_unfinished_models(tmp_path, capsys, fast):
    out = _study(tmp_path, capsys)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["models"]["b"]["status"] = "running"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with safe_io.FolderLock(out):  # what a study run holds while it runs
        rc, _, err = study_helpers.run_cli(["report", out], capsys)
    assert rc == 2, err
    assert "the study 't'" in err and "is still running" in err and "1 of 2 model(s) unfinished (b)" in err, err
    assert f"(pid {os.getpid()})" in err
    assert not (out / "report.html").exists()


@pytest.mark.slow
def test_report_on_a_type_tampered_result_names_the_field(tmp_path, capsys, fast):
    """A result whose field was changed to another type, its SHA-256 updated in the manifest: left
    out with the class and field named, the others reported; no internal error."""
    out = _study(tmp_path, capsys)
    data = json.loads((out / "a.json").read_text())
    data["fields"]["results"]["__dict__"]["gain"]["fields"]["regime"] = 12345
    raw = json.dumps(data).encode()
    (out / "a.json").write_bytes(raw)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["models"]["a"]["sha256"] = hashlib.sha256(raw).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    rc, stdout, err = study_helpers.run_cli(["report", out], capsys)
    assert rc == 0, err
    assert "GainResult's field 'regime' holds a int" in stdout, stdout
    assert "internal error" not in err
    assert (out / "summary.csv").read_text().count("\n") == 2  # header and b


def test_report_on_a_type_tampered_profile_file_is_a_clear_error(tmp_path):
    from thermo_lens.core.errors import ThermoLensSchemaError
    from thermo_lens.report import write_report

    prof = study_helpers.template()
    data = json.loads(prof.to_json())
    results = data["fields"]["results"]["__dict__"]
    results["spectral"]["fields"]["head_metrics"] = "not a frame"
    f = tmp_path / "p.json"
    f.write_text(json.dumps(data))
    with pytest.raises(ThermoLensSchemaError, match="SpectralSignature's field 'head_metrics' holds a str"):
        write_report(f, tmp_path / "r.html")
    data = json.loads(prof.to_json())
    data["fields"]["results"]["__dict__"]["gain"] = "a string"
    f.write_text(json.dumps(data))
    with pytest.raises(ThermoLensSchemaError, match="its 'gain' result is a str, not GainResult"):
        write_report(f, tmp_path / "r.html")
    data = json.loads(prof.to_json())
    data["fields"]["meta"]["__dict__"]["n_layers"] = "two"
    f.write_text(json.dumps(data))
    with pytest.raises(ThermoLensSchemaError, match=r"meta\['n_layers'\] is str"):
        write_report(f, tmp_path / "r.html")


@pytest.mark.slow
def test_a_hard_linked_summary_outside_the_folder_is_never_written_through(tmp_path, capsys, fast):
    out = _study(tmp_path, capsys)
    outside = tmp_path / "precious.csv"
    outside.write_text("precious\n")
    (out / "summary.csv").unlink(missing_ok=True)
    os.link(outside, out / "summary.csv")
    rc, _, err = study_helpers.run_cli(["report", out], capsys)
    assert rc == 0, err
    assert outside.read_text() == "precious\n"
    assert "gpt2" in (out / "summary.csv").read_text() and os.stat(outside).st_nlink == 1


@pytest.mark.parametrize("device_map", ['{ "" = 0 }', '{ "transformer.h" = 1, "lm_head" = "cpu" }', '{ "" = "cuda:0" }',
                                        '"cuda"'])
def test_a_gpu_device_map_on_a_machine_without_one_exits_2_before_any_load(tmp_path, capsys, monkeypatch, device_map):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    loaded = []
    monkeypatch.setattr(study.run, "profile_one", lambda model, settings: loaded.append(model.id))
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[study]\nname = "t"\n\n[[models]]\nzoo = "gpt2-tiny-wd"\ndevice_map = {device_map}\n')
    rc, _, err = study_helpers.run_cli(["study", spec, "--out", tmp_path / "out"], capsys)
    assert rc == 2, err
    assert "model 'gpt2-tiny-wd'" in err and "device_map" in err and "no CUDA device is available here" in err, err
    assert loaded == [] and not (tmp_path / "out").exists()


def test_a_cpu_or_disk_device_map_is_still_accepted():
    from thermo_lens.core import validate as V

    assert V.device_map({"": "cpu", "lm_head": "disk"}) == {"": "cpu", "lm_head": "disk"}
    assert V.device_map({"": 3}, here=False) == {"": 3}  # a spec that runs on Ray workers
