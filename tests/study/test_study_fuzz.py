"""Fuzzing study specs through the CLI (in-process): random keys, types and nesting, in YAML and
TOML. Whatever the file holds: no traceback, exit code 0 or 2, nothing written outside --out."""

import dataclasses
import json
import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
import study_helpers  # noqa: E402
from tiers import examples  # noqa: E402

from thermo_lens import cli, zoo  # noqa: E402
from thermo_lens.experiments import study  # noqa: E402

PROMPTS = ["The capital of France is", "Water freezes at"]
STUDY_KEYS = ["name", "prompts", "prepend_bos", "token_scope", "batch_size", "truncate"]
MODEL_KEYS = ["name", "zoo", "id", "lab", "family", "twin_of", "base", "dtype", "device", "device_map",
              "num_gpus", "threads", "trust_remote_code"]
NASTY = ["", ".", "..", "../x", "/etc/passwd", "manifest", ".lock", "a/b", "x\u0000y", "=1+1", "-1", "cuda:7",
         "banana", "float64", "auto", "gpt2-tiny-wd", "tokenizer", "paper25", "last", "\u202e", "~", "C:\\x",
         "x" * 300]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(NASTY), st.text(max_size=20),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(NASTY + STUDY_KEYS), st.text(max_size=8)),
                                                 inner, max_size=4)), max_leaves=12)
model_entry = st.dictionaries(st.one_of(st.sampled_from(MODEL_KEYS), st.text(max_size=8)),
                              st.one_of(values, st.sampled_from(zoo.names())), max_size=6)
study_table = st.dictionaries(st.one_of(st.sampled_from(STUDY_KEYS), st.text(max_size=8)), values, max_size=6)
# Near-valid documents (each field usually good, sometimes anything) reach the run itself.
GOOD_STUDY = {"name": ["s", "my study"], "prompts": [PROMPTS, {"Factual": PROMPTS[:1], "Math": PROMPTS[1:]}],
              "prepend_bos": [True, False, "tokenizer"], "token_scope": ["last", "all_but_first", "all"],
              "batch_size": [1, 8], "truncate": [True, False]}
GOOD_MODEL = {"id": ["a", "b", "A", "m.1", "manifest", "../up", "x/y"], "lab": ["lab", "=cmd"],
              "family": ["f"], "twin_of": ["a"], "dtype": ["float32", "float64", "auto"], "device": ["cpu"],
              "num_gpus": [0, 1, 0.5], "threads": [1, 2], "trust_remote_code": [False]}


def _near(good):
    return st.fixed_dictionaries({}, optional={k: st.one_of(st.sampled_from(v), st.sampled_from(v), values)
                                               for k, v in good.items()})


near_model = st.tuples(st.sampled_from(["zoo", "name"]), st.sampled_from(zoo.names() + ["nope"]),
                       _near(GOOD_MODEL)).map(lambda t: {t[0]: t[1], **t[2]})
documents = st.one_of(
    st.fixed_dictionaries({"study": _near(GOOD_STUDY), "models": st.lists(near_model, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"study": study_table, "models": st.lists(model_entry, max_size=3)}),
    st.dictionaries(st.text(max_size=8), values, max_size=3),
    values,
)


@pytest.fixture(scope="module")
def fake_profile():
    template = study_helpers.template()  # one real profile per session, shared by the study tests

    def fake(model, settings):
        meta = {**template.meta, "name": model.id, "token_scope": settings["token_scope"],
                "prepend_bos": settings["prepend_bos"]}
        return dataclasses.replace(template, meta=meta).to_json()

    return fake


def _toml(doc):
    """A TOML rendering that is sometimes wrong on purpose (a fuzzer for the TOML path too)."""
    lines = []

    def val(v):
        return json.dumps(v, default=str)

    if isinstance(doc, dict):
        for k, v in doc.items():
            if isinstance(v, dict):
                lines.append(f"[{k}]")
                lines += [f"{json.dumps(str(kk))} = {val(vv)}" for kk, vv in v.items()]
            elif isinstance(v, list) and all(isinstance(x, dict) for x in v):
                for item in v:
                    lines.append(f"[[{k}]]")
                    lines += [f"{json.dumps(str(kk))} = {val(vv)}" for kk, vv in item.items()]
            else:
                lines.append(f"{json.dumps(str(k))} = {val(v)}")
    else:
        lines.append(val(doc))
    return "\n".join(lines) + "\n"


def _snapshot(root: Path, skip: Path) -> dict:
    out = {}
    for p in root.rglob("*"):
        if skip in p.parents or p == skip:
            continue
        out[str(p)] = p.stat().st_mtime_ns if p.is_file() else None
    return out


@pytest.mark.slow
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
@given(doc=documents, as_yaml=st.booleans())
def test_fuzz_spec_files(doc, as_yaml, fake_profile, monkeypatch, capsys):
    import yaml

    monkeypatch.setattr(study.run, "profile_one", fake_profile)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "victim.json").write_text("precious")
        spec = root / ("spec.yaml" if as_yaml else "spec.toml")
        try:
            text = yaml.safe_dump(doc, allow_unicode=True) if as_yaml else _toml(doc)
        except yaml.YAMLError:
            text = str(doc)
        spec.write_text(text, encoding="utf-8", errors="surrogatepass")
        out = root / "out"
        before = _snapshot(root, out)
        cwd = os.getcwd()
        os.chdir(root)  # so a relative escape would land here, where it is checked
        try:
            rc = cli.main(["study", str(spec), "--out", str(out), "--no-report"])
        finally:
            os.chdir(cwd)
        captured = capsys.readouterr()
        assert rc in (0, 2), captured.err
        assert "Traceback" not in captured.out + captured.err
        if rc == 2:
            assert captured.err.startswith("thermo-lens: error: ") and len(captured.err) < 3000
        assert _snapshot(root, out) == before  # nothing written outside --out
        assert (root / "victim.json").read_text() == "precious"
        if out.exists():
            names = {p.name for p in out.iterdir()}
            assert ".lock" not in names and not any(n.startswith(".thermo-lens-tmp") for n in names)
            assert all(p.parent == out for p in out.rglob("*"))


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(NASTY + ["done", "failed", "a.json", "a"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["models", "study", "status", "file", "sha256", "settings",
                                                             "settings_key", "model", "a", "b", "error"]),
                                            inner, max_size=4)),
    max_leaves=15)


@pytest.fixture(scope="module")
def finished_study(fake_profile, tmp_path_factory):
    """A real study folder (two results) whose manifest the fuzzer then rewrites."""
    from thermo_lens.experiments.study import ModelSpec, StudySpec, run_study

    out = tmp_path_factory.mktemp("finished") / "out"
    spec = StudySpec(name="s", models=(ModelSpec(id="a", zoo="gpt2-tiny-wd"), ModelSpec(id="b", zoo="neox-tiny")),
                     prompts=PROMPTS)
    assert run_study(spec, out, profile_fn=fake_profile).ok
    return out


@pytest.mark.slow
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
@given(doc=json_values, keep_real=st.booleans())
def test_fuzz_manifests(doc, keep_real, finished_study, capsys):
    """A hand-edited manifest, whatever it holds: `report` exits 0 or 2, no traceback, and only
    writes report.html / summary.csv inside the folder."""
    import shutil

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out"
        shutil.copytree(finished_study, out)
        manifest = json.loads((out / "manifest.json").read_text())
        if keep_real and isinstance(doc, dict):  # graft the fuzz onto a real manifest
            manifest["models"]["a"].update({k: v for k, v in doc.items()})
            doc = manifest
        (out / "manifest.json").write_text(json.dumps(doc))
        before = {p.name for p in Path(d).iterdir()}
        rc = cli.main(["report", str(out)])
        captured = capsys.readouterr()
        assert rc in (0, 2), captured.err
        assert "Traceback" not in captured.out + captured.err
        assert {p.name for p in Path(d).iterdir()} == before
        assert {p.name for p in out.iterdir()} <= {"a.json", "b.json", "manifest.json", "report.html", "summary.csv"}


cli_values = st.one_of(st.sampled_from(NASTY + ["0", "1", "-3", "8", "true", "no", "float64", "float16", "cpu",
                                                "paper25", "gpt2-tiny-wd", "neox-tiny"]), st.text(max_size=10))
cli_options = st.lists(st.tuples(st.sampled_from(["--batch-size", "--prepend-bos", "--token-scope", "--dtype",
                                                  "--device", "--prompts", None]), cli_values), max_size=4)


@pytest.mark.slow
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
@given(models=st.lists(cli_values, max_size=3), options=cli_options, truncate=st.booleans())
def test_fuzz_profile_command_line(models, options, truncate, fake_profile, monkeypatch, capsys):
    monkeypatch.setattr(study.run, "profile_one", fake_profile)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        args = ["profile", *[m for m in models if not m.startswith("-")]]
        for opt, value in options:
            args += [opt, value] if opt else [value]
        if truncate:
            args.append("--truncate")
        args += ["--out", str(root / "out"), "--no-report"]
        cwd = os.getcwd()
        os.chdir(root)
        try:
            try:
                rc = cli.main(args)
            except SystemExit as e:  # argparse: usage errors exit 2
                rc = e.code
        finally:
            os.chdir(cwd)
        captured = capsys.readouterr()
        assert rc in (0, 2), (args, captured.err)
        assert "Traceback" not in captured.out + captured.err
        assert {p.name for p in root.iterdir()} <= {"out"}


@pytest.mark.slow
@pytest.mark.parametrize("entry", [{"status": None, "error": True}, {"status": "failed", "error": 3.5}, {"status": None}])
def test_report_reads_a_hand_edited_error_of_any_json_type(entry, finished_study, capsys):
    """Found by test_fuzz_manifests: a model entry whose "error" is not a string (true, a number)
    made `report` fail with an internal error ('bool' has no 'strip'); it is read as text."""
    import shutil

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out"
        shutil.copytree(finished_study, out)
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["models"]["a"].update(entry)
        (out / "manifest.json").write_text(json.dumps(manifest))
        rc = cli.main(["report", str(out)])
        assert rc in (0, 2), capsys.readouterr().err
