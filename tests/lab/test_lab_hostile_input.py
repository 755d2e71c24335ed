"""The lab under hostile or mistaken input (issue 27): every spec field checked before anything is
built or written, bounded spec reads, no write through a planted link, a lock, and a spec
fingerprint that keeps one lab folder to one spec. CLI calls run in-process; only the tests marked
slow train a model."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from thermo_lens import cli
from thermo_lens.core import safe_io
from thermo_lens.experiments.lab import run as lab_run
from thermo_lens.experiments.lab.recipe import FIELD_RANGES, LabSpecError, Recipe
from thermo_lens.experiments.lab.spec import check_lab_spec, load_lab_spec, parse_lab_spec, spec_fingerprint

TINY = """\
[lab]
name = "tiny"
seeds = [1]
checkpoints = 2
prompts = ["The cat sat on the mat."]
batch_size = 1

[base]
n_layers = 2
d_model = 8
n_heads = 2
d_mlp = 16
n_ctx = 16
block_size = 8
batch_size = 2
vocab_size = 300
steps = 2
warmup_steps = 1
"""
SUBFOLDERS = ("train", "profiles", "runs", "tokenizers")


def _main(args, capsys):
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err
    assert "\x1b" not in out + err
    return rc, out, err


def _write(path: Path, text: str = TINY) -> Path:
    path.write_text(text)
    return path


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def _data(base=None, **lab):
    import tomllib

    data = tomllib.loads(TINY)
    data["base"].update(base or {})
    data["lab"].update(lab)
    return data


@pytest.fixture
def no_training(monkeypatch):
    """run_lab does everything up to training (checks, lock, folders, lab.json), then stops."""
    calls = []

    def stub(spec, out, *a, **k):
        calls.append(out)
        return lab_run.LabOutcome(out_dir=str(out), trained=(), profiled=(), skipped=(), failed={})

    monkeypatch.setattr(lab_run, "_run_locked", stub)
    return calls


# ---------------------------------------------------------------------------- 1. every field, in range
BAD_BASE = [
    ("n_heads", 0), ("n_layers", 0), ("n_layers", -2), ("n_layers", 1), ("d_model", 0), ("d_mlp", -1), ("d_mlp", 0),
    ("vocab_size", 1), ("vocab_size", -5), ("vocab_size", 10**9), ("block_size", 0), ("activation", "bogus"),
    ("eps", -1e-8), ("eps", float("nan")), ("initializer_range", -0.02), ("initializer_range", float("inf")),
    ("rotary_pct", 5.0), ("min_frequency", -1), ("grad_clip_norm", -1.0), ("grad_clip_norm", 0.0),
    ("embed_proj_dim", -1), ("n_ctx", 0), ("steps", 0), ("steps", 10**12), ("batch_size", 0), ("rotary_base", 0.0),
    ("sgd_lr_scale", -1.0), ("min_lr_ratio", -1.0), ("d_model", 10**8), ("n_layers", 10**5), ("n_layers", 2.5),
]


@pytest.mark.parametrize("field,value", BAD_BASE, ids=[f"{f}={v!r}" for f, v in BAD_BASE])
def test_every_base_field_is_checked_with_its_name_and_range(field, value):
    with pytest.raises(LabSpecError) as ei:
        parse_lab_spec(_data({field: value}))
    msg = str(ei.value)
    assert f"field 'base.{field}'" in msg and "valid:" in msg, msg
    assert FIELD_RANGES[field][2].split(" (")[0] in msg  # the allowed range, in words


@pytest.mark.parametrize("field,value,valid", [
    ("eval_every", 0, "[1, 2]"), ("eval_every", -5, "[1, 2]"), ("checkpoints", 10**12, "[1, 1000]"),
    ("checkpoints", 0, "[1, 1000]"), ("batch_size", 0, "[1, 65536]"),
    ("seeds", [10**17], "[0, 4294967294]"), ("seeds", list(range(1001)), "1 to 1000"),
    ("prepend_bos", "sometimes", '"host"'), ("name", "", "printable"), ("name", "a\x1b[2Jb", "printable"),
])
def test_every_lab_field_is_checked(field, value, valid):
    with pytest.raises(LabSpecError) as ei:
        parse_lab_spec(_data(**{field: value}))
    assert f"field 'lab.{field}'" in str(ei.value) and valid in str(ei.value), str(ei.value)
    assert "\x1b" not in str(ei.value)


@pytest.mark.parametrize("field,value,valid", [
    ("budgets", [6, 10**18], "at most 10,000,000"), ("budgets", [10_000_001], "at most 10,000,000"),
    ("budgets", [1], "larger than base.warmup_steps (1)"), ("budgets", list(range(2, 12)), "up to 8"),
    ("budgets", [3, 3], "distinct"), ("checkpoint_every", 0, "[1, 2]"), ("checkpoint_every", 10**18, "[1, 2]"),
])
def test_budgets_and_checkpoint_every_are_bounded(field, value, valid):
    """A budget past the recipe's 10,000,000-step cap is refused at once (it would never end)."""
    with pytest.raises(LabSpecError) as ei:
        parse_lab_spec(_data(**{field: value}))
    assert f"field 'lab.{field}'" in str(ei.value) and valid in str(ei.value), str(ei.value)


def test_the_budget_cap_is_the_recipe_step_cap():
    from thermo_lens.experiments.lab.recipe import check_field
    from thermo_lens.experiments.lab.spec import MAX_STEPS

    assert check_field("steps", MAX_STEPS) == MAX_STEPS
    with pytest.raises(LabSpecError):
        check_field("steps", MAX_STEPS + 1)
    assert parse_lab_spec(_data(budgets=[2, MAX_STEPS])).budgets == (2, MAX_STEPS)


@pytest.mark.parametrize("field,value", [("budgets", (6, 10**18)), ("checkpoint_every", 10**18), ("seeds", (1, 1)),
                                         ("seeds", (-1,)), ("seeds", ())])
def test_numeric_lab_fields_of_a_spec_built_in_code_are_bounded(tmp_path, field, value):
    import dataclasses

    bad = dataclasses.replace(parse_lab_spec(_data()), **{field: value})
    with pytest.raises(LabSpecError, match=f"field 'lab.{field}'"):
        lab_run.run_lab(bad, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_cli_refuses_a_budget_past_the_cap_at_once(tmp_path, capsys):
    import time

    spec = _write(tmp_path / "s.toml", TINY.replace("[lab]\n", "[lab]\nbudgets = [6, 1000000000000000000]\n"))
    t0 = time.monotonic()
    rc, _, err = _main(["lab", spec, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "field 'lab.budgets'" in err and "10,000,000" in err, err
    assert time.monotonic() - t0 < 30 and not (tmp_path / "o").exists()


def test_rotary_needs_an_even_number_of_rotary_dimensions():
    with pytest.raises(LabSpecError, match=r"field 'base.rotary_pct': 0.25 of the head dimension 4 is 1 rotary"):
        parse_lab_spec(_data({"positions": "rotary", "rotary_pct": 0.25}))  # 1 dimension: refused
    parse_lab_spec(_data({"positions": "rotary", "rotary_pct": 0.5}))          # 2: fine


def test_a_knob_context_out_of_range_names_the_knob():
    data = _data()
    data["knobs"] = {"norm": {"levels": ["pre", "post"], "context": {"embed_proj_dim": -3}}}
    with pytest.raises(LabSpecError, match=r"knob 'norm': context field 'embed_proj_dim': bad value -3; valid: an integer"):
        parse_lab_spec(data)


def test_a_spec_built_in_code_is_checked_before_anything_is_written(tmp_path):
    import dataclasses

    spec = parse_lab_spec(_data())
    bad = dataclasses.replace(spec, base=dataclasses.replace(spec.base, n_heads=0))
    with pytest.raises(LabSpecError, match="field 'base.n_heads'"):
        check_lab_spec(bad)
    with pytest.raises(LabSpecError, match="field 'base.n_heads'"):
        lab_run.run_lab(bad, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_the_shipped_specs_still_validate():
    """A guard for the ranges (passes before them too): the specs shipped with thermo-lens are in range."""
    root = Path(__file__).resolve().parents[2]
    for f in ("recipes/heritage-lab.toml", "recipes/zoo.toml", "recipes/zoo-neox.toml", "tutorials/heritage_micro.toml",
              "tests/data/lab_micro.toml"):
        load_lab_spec(root / f)
    assert Recipe() == parse_lab_spec({"lab": {}, "base": {}}).base


def test_cli_refuses_a_bad_value_before_writing(tmp_path, capsys):
    spec = _write(tmp_path / "s.toml", TINY.replace("n_heads = 2", "n_heads = 0"))
    rc, _, err = _main(["lab", spec, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and "s.toml:11: field 'base.n_heads': bad value 0; valid: an integer in [1, 1,024]" in err, err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- 2. reading the spec file
def test_spec_files_that_are_not_utf8_text_or_not_regular_files(tmp_path, capsys):
    latin = tmp_path / "latin.toml"
    latin.write_bytes(TINY.replace('"tiny"', '"café"').encode("latin-1"))
    utf16 = tmp_path / "utf16.toml"
    utf16.write_bytes(TINY.encode("utf-16"))
    (tmp_path / "dir.toml").mkdir()
    os.mkfifo(tmp_path / "fifo.toml")
    huge = _write(tmp_path / "huge.toml", TINY + "# pad\n" * 200_000)
    deep = _write(tmp_path / "deep.toml", TINY + "[knobs]\nweight_decay = " + "[" * 3000 + "]" * 3000 + "\n")
    cases = [(latin, "is not UTF-8 text"), (utf16, "is not UTF-8 text"), (tmp_path / "dir.toml", "it is a directory"),
             (tmp_path / "fifo.toml", "not a regular file"), ("/dev/zero", "not a regular file"),
             (huge, "larger than 1,048,576 bytes"), (deep, "nested")]
    for path, match in cases:
        rc, _, err = _main(["lab", path, "--out", tmp_path / "o"], capsys)
        assert rc == 2 and match in err, (path, err)
    assert not (tmp_path / "o").exists()


def test_bom_is_fine_and_unknown_keys_are_named(tmp_path):
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + TINY.encode())
    assert load_lab_spec(bom).name == "tiny"
    bom.write_bytes(b"\xef\xbb\xbf" + TINY.replace("[lab]\n", "[lab]\nbogus_key = 1\n").encode())
    with pytest.raises(LabSpecError, match=r"bom.toml:2: field 'lab.bogus_key': unknown"):
        load_lab_spec(bom)


@pytest.mark.parametrize("text", [
    TINY.replace("[lab]\n", '[lab]\n"\\u001b[31mred" = 1\n'),
    TINY.replace('activation', 'x') + 'activation = "\\u001b[2Jwipe"\n',
    TINY.replace('"tiny"', '"\\u001b[31mtiny"'),
])
def test_control_characters_from_the_spec_are_escaped(tmp_path, text):
    spec = _write(tmp_path / "s.toml", text)
    with pytest.raises(LabSpecError) as ei:
        load_lab_spec(spec)
    assert "\x1b" not in str(ei.value) and "\\x1b" in str(ei.value)


# ---------------------------------------------------------------------------- 3-5. the lab folder
def test_empty_file_dangling_or_foreign_out_is_refused(tmp_path, capsys, no_training, monkeypatch):
    spec = _write(tmp_path / "s.toml")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.html").write_text("mine")
    a_study = tmp_path / "study"
    a_study.mkdir()
    (a_study / "manifest.json").write_text("{}")
    cases = [(["lab", spec, "--out", ""], "lab folder name is empty"),
             (["profile", "gpt2-tiny-wd", "--out", ""], "name is empty"),
             (["lab", spec, "--out", tmp_path / "afile"], "is a file"),
             (["lab", spec, "--out", tmp_path / "dangling"], "symbolic link to"),
             (["lab", spec, "--out", mine], "already holds files thermo-lens did not write (report.html)"),
             (["lab", spec, "--out", a_study], "is the folder of a study or profile run, not of a lab")]
    before = _tree(tmp_path)
    for args, match in cases:
        rc, _, err = _main(args, capsys)
        assert rc == 2 and match in err, (args, err)
    assert _tree(tmp_path) == before and (mine / "report.html").read_text() == "mine"
    assert not no_training and not (tmp_path / "gone").exists()


@pytest.mark.parametrize("sub", SUBFOLDERS + ("lab.json",))
def test_a_link_planted_in_the_lab_folder_is_never_followed(tmp_path, sub, no_training):
    spec = load_lab_spec(_write(tmp_path / "s.toml"))
    out = tmp_path / "lab"
    lab_run.run_lab(spec, out)  # a lab folder (stops before training)
    victim = tmp_path / "victim"
    victim.mkdir()
    target = out / sub
    if target.is_dir():
        target.rmdir()
    else:
        target.unlink()
    target.symlink_to(victim / "x.json" if sub == "lab.json" else victim)
    with pytest.raises(safe_io.SafeIOError, match="symbolic link"):
        lab_run.run_lab(spec, out)
    assert _tree(victim) == [] and len(no_training) == 1
    # a fresh folder holding only the link is not a lab folder: refused as the user's
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / sub).symlink_to(victim)
    match = "lab.json: it is a symbolic link" if sub == "lab.json" else f"did not write \\({sub}\\)"
    with pytest.raises((lab_run.LabFolderError, safe_io.SafeIOError), match=match):
        lab_run.run_lab(spec, fresh)
    assert _tree(victim) == []


def test_figures_link_is_never_followed(tmp_path, monkeypatch):
    """write_tables' figures/ folder (the tables need finished runs: a stand-in frame)."""
    import pandas as pd

    spec = load_lab_spec(_write(tmp_path / "s.toml"))
    out = tmp_path / "lab"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (out / "figures").symlink_to(victim)
    runs = pd.DataFrame({"arm": ["base"], "seed": [1], "step": [0], "last_block_gain": [1.0], "penultimate_gain": [1.0],
                         "run": ["base__seed1"], "recipe_hash": [spec.base.hash], "knob": ["base"], "level": ["base"],
                         "family": ["gpt2"], "budget": [spec.base.steps], "spec_sha256": [spec.sha256]})
    monkeypatch.setattr(lab_run, "runs_frame", lambda d: runs)
    monkeypatch.setattr("thermo_lens.experiments.lab.effects.effects_frame", lambda *a, **k: pd.DataFrame())
    with pytest.raises(safe_io.SafeIOError, match="figures: it is a symbolic link"):
        lab_run.write_tables(out, spec)
    assert _tree(victim) == []


def test_make_folder_refuses_links_and_files_at_every_level(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").symlink_to(tmp_path)
    (tmp_path / "f").write_text("x")
    assert safe_io.make_folder(tmp_path, "a", "c", "d") == tmp_path / "a" / "c" / "d"
    with pytest.raises(safe_io.SafeIOError, match="symbolic link"):
        safe_io.make_folder(tmp_path, "a", "b", "c")
    with pytest.raises(safe_io.SafeIOError, match="it is a file"):
        safe_io.make_folder(tmp_path, "f")
    with pytest.raises(safe_io.SafeIOError, match="not a plain folder name"):
        safe_io.make_folder(tmp_path, "..")
    assert not (tmp_path / "c").exists()


def test_a_different_spec_is_refused_before_anything_is_written(tmp_path, capsys, no_training):
    spec = _write(tmp_path / "s.toml")
    out = tmp_path / "lab"
    assert _main(["lab", spec, "--out", out, "--no-report"], capsys)[0] == 0
    record = json.loads((out / "lab.json").read_text())
    assert record["spec_sha256"] == spec_fingerprint(load_lab_spec(spec))
    # the same lab written differently (comments, a default spelt out, moved) is the same spec
    same = _write(tmp_path / "same.toml", "# again\n" + TINY.replace("[lab]\n", '[lab]\ntoken_scope = "all_but_first"\n'))
    assert _main(["lab", same, "--out", out, "--no-report"], capsys)[0] == 0
    before = {p: (out / p).read_bytes() for p in ["lab.json"]}
    tree = _tree(out)
    other = _write(tmp_path / "other.toml", TINY.replace("seeds = [1]", "seeds = [7]"))
    rc, _, err = _main(["lab", other, "--out", out, "--no-report"], capsys)
    assert rc == 2 and "another spec (changed: seeds)" in err and "--update" in err, err
    bad = _write(tmp_path / "bad.toml", TINY + 'activation = "bogus"\n')
    rc, _, err = _main(["lab", bad, "--out", out, "--no-report"], capsys)
    assert rc == 2 and "field 'base.activation'" in err
    assert {p: (out / p).read_bytes() for p in before} == before and _tree(out) == tree
    # --update says the lab is meant to change
    assert _main(["lab", other, "--out", out, "--no-report", "--update"], capsys)[0] == 0
    assert json.loads((out / "lab.json").read_text())["seeds"] == [7]


def test_a_lab_from_before_fingerprints_is_adopted_and_a_foreign_lab_json_refused(tmp_path, no_training):
    spec = load_lab_spec(_write(tmp_path / "s.toml"))
    out = tmp_path / "lab"
    out.mkdir()
    (out / "lab.json").write_text(json.dumps({"name": "tiny", "arms": [], "base": {}, "knobs": []}))
    lab_run.run_lab(spec, out)
    assert json.loads((out / "lab.json").read_text())["spec_sha256"] == spec_fingerprint(spec)
    (out / "lab.json").write_text('{"my": "notes"}')
    with pytest.raises(lab_run.LabFolderError, match="not a thermo-lens lab record"):
        lab_run.run_lab(spec, out)


def test_the_lab_folder_is_locked(tmp_path, capsys, no_training):
    spec = _write(tmp_path / "s.toml")
    out = tmp_path / "lab"
    out.mkdir()
    with safe_io.FolderLock(out):
        rc, _, err = _main(["lab", spec, "--out", out], capsys)
    assert rc == 2 and "is using" in err and not no_training
    assert _tree(out) == []


def test_a_bad_ray_address_writes_nothing(tmp_path, capsys):
    spec = _write(tmp_path / "s.toml")
    rc, _, err = _main(["lab", spec, "--out", tmp_path / "o", "--executor", "ray", "--ray-address", "not an address"],
                       capsys)
    assert rc == 2 and "Ray address" in err and not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- trained (slow)
@pytest.mark.slow
def test_disk_full_while_training_names_the_run_folder(tmp_path, capsys, monkeypatch):
    import torch

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    rc, out, _ = _main(["lab", _write(tmp_path / "s.toml"), "--out", tmp_path / "o", "--no-report"], capsys)
    assert rc == 1
    line = next(ln for ln in out.splitlines() if "failed" in ln)
    assert "no space left on the device" in line and str(tmp_path / "o" / "runs") in line, out


@pytest.mark.slow
def test_a_link_planted_at_a_run_folder_is_never_followed(tmp_path):
    spec = load_lab_spec(_write(tmp_path / "s.toml"))
    out = tmp_path / "lab"
    victim = tmp_path / "victim"
    victim.mkdir()
    run = out / "runs" / f"base__seed1__{spec.base.hash}"
    run.parent.mkdir(parents=True)
    run.symlink_to(victim)
    (out / "lab.json").write_text(json.dumps({"name": "tiny", "arms": [], "base": {}, "knobs": []}))
    outcome = lab_run.run_lab(spec, out, report=False)
    assert "symbolic link" in outcome.failed["base__seed1"] and _tree(victim) == []
