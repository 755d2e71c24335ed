"""The lab under hostile or mistaken input (issue 27): every spec field checked before anything is
built or written, bounded spec reads, no write through a planted link, a lock, and a spec
fingerprint that keeps one lab folder to one spec. CLI calls run in-process; only the tests marked
slow train a model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from thermo_lens import cli
from thermo_lens.lab.recipe import FIELD_RANGES, LabSpecError, Recipe
from thermo_lens.lab.spec import load_lab_spec, parse_lab_spec

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


def test_rotary_needs_an_even_number_of_rotary_dimensions():
    with pytest.raises(LabSpecError, match=r"field 'base.rotary_pct': 0.25 of the head dimension 4 is 1 rotary"):
        parse_lab_spec(_data({"positions": "rotary", "rotary_pct": 0.25}))  # 1 dimension: refused
    parse_lab_spec(_data({"positions": "rotary", "rotary_pct": 0.5}))          # 2: fine


def test_a_knob_context_out_of_range_names_the_knob():
    data = _data()
    data["knobs"] = {"norm": {"levels": ["pre", "post"], "context": {"embed_proj_dim": -3}}}
    with pytest.raises(LabSpecError, match=r"knob 'norm': context field 'embed_proj_dim': bad value -3; valid: an integer"):
        parse_lab_spec(data)


def test_the_shipped_specs_still_validate():
    """A guard for the ranges (passes before them too): the specs shipped with thermo-lens are in range."""
    root = Path(__file__).resolve().parents[1]
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
