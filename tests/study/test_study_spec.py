"""Study spec parsing: valid TOML/YAML, and malformed specs named by file, line and field."""

import textwrap

import pytest

from thermo_lens.experiments.study import ModelSpec, StudySpec, StudySpecError, load_spec

GOOD = """\
[study]
name = "heritage"
prompts = "paper25"
prepend_bos = "tokenizer"
token_scope = "last"
batch_size = 4

[[models]]
name = "EleutherAI/pythia-160m"
lab = "EleutherAI"
family = "Pythia"
dtype = "float16"
num_gpus = 1

[[models]]
zoo = "gpt2-tiny-wd"
lab = "zoo"
twin_of = "gpt2-tiny-nowd"
"""


def _write(tmp_path, text, name="spec.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_good_toml(tmp_path):
    spec = load_spec(_write(tmp_path, GOOD))
    assert spec.name == "heritage" and spec.prepend_bos == "tokenizer" and spec.batch_size == 4
    assert [m.id for m in spec.models] == ["EleutherAI_pythia-160m", "gpt2-tiny-wd"]
    assert spec.models[0] == ModelSpec(id="EleutherAI_pythia-160m", name="EleutherAI/pythia-160m",
                                       lab="EleutherAI", family="Pythia", dtype="float16", num_gpus=1)
    assert spec.models[1].source == "zoo:gpt2-tiny-wd" and spec.models[1].twin_of == "gpt2-tiny-nowd"


def test_good_yaml(tmp_path):
    spec = load_spec(_write(tmp_path, """\
        study:
          name: y
          prompts: [The capital of France is, Water freezes at]
        models:
          - zoo: neox-tiny
            lab: zoo
          - name: gpt2
            base: gpt2-base
        """, "spec.yaml"))
    assert spec.prompts == ["The capital of France is", "Water freezes at"]
    assert spec.models[1].twin_of == "gpt2-base"


@pytest.mark.parametrize(
    "text, match",
    [
        (GOOD.replace('dtype = "float16"', 'dtype = "float8"'), r"spec\.toml:12: field 'models\[0\]\.dtype'"),
        (GOOD.replace('family = "Pythia"', 'famly = "Pythia"'), r"spec\.toml:11: field 'models\[0\]\.famly': unknown field"),
        (GOOD.replace('zoo = "gpt2-tiny-wd"', 'zoo = "nope"'), r"spec\.toml:16: field 'models\[1\]\.zoo': unknown embedded model 'nope'"),
        (GOOD.replace('batch_size = 4', 'batch_size = 0'), r"spec\.toml:6: field 'study\.batch_size': bad value 0"),
        (GOOD.replace('token_scope = "last"', 'token_scope = "first"'), r"spec\.toml:5: field 'study\.token_scope'"),
        (GOOD.replace('prompts = "paper25"', 'prompts = "nonexistent"'), r"spec\.toml:3: field 'study\.prompts'"),
        (GOOD.replace('name = "EleutherAI/pythia-160m"\n', ''), r"spec\.toml:8: field 'models\[0\]': give exactly one of 'name'"),
        (GOOD + '\n[[models]]\nzoo = "gpt2-tiny-wd"\n', r"field 'models\[2\]\.id': duplicate model id"),
        ("[study]\nname = \n", r"spec\.toml: invalid TOML: .*line 2"),
        ("[study]\nname = 'x'\n", r"field 'models': at least one"),
    ],
)
def test_malformed_specs_name_file_line_field(tmp_path, text, match):
    with pytest.raises(StudySpecError, match=match):
        load_spec(_write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(StudySpecError, match="no such study spec file"):
        load_spec(tmp_path / "nope.toml")


def test_from_models_recognises_zoo_names():
    spec = StudySpec.from_models(["gpt2-tiny-wd", "some/hub-model", "gpt2-tiny-wd"])
    assert [m.id for m in spec.models] == ["gpt2-tiny-wd", "some_hub-model", "gpt2-tiny-wd-2"]
    assert spec.models[0].zoo == "gpt2-tiny-wd" and spec.models[1].name == "some/hub-model"


# ---------------------------------------------------------------------------- issue 27
@pytest.mark.parametrize("text, match", [
    ("study:\n  name: a\n  prompts: paper25\n  name: b\nmodels:\n  - zoo: neox-tiny\n",
     r"spec\.yaml:line 4: invalid YAML: key 'name' is given twice \(first on line 2\)"),
    ("study: {name: a}\nmodels:\n  - zoo: neox-tiny\n    lab: x\n    zoo: gpt2-tiny-wd\n",
     r"spec\.yaml:line 5: invalid YAML: key 'zoo' is given twice \(first on line 3\)"),
    ("study: {name: a, name: b}\nmodels: [{zoo: neox-tiny}]\n", r"line 1: invalid YAML: key 'name' is given twice"),
    ("study: {name: a}\nmodels: [{zoo: neox-tiny}]\nmodels: [{zoo: gpt2-tiny-wd}]\n",
     r"line 3: invalid YAML: key 'models' is given twice \(first on line 2\)"),
])
def test_a_yaml_key_given_twice_is_an_error_naming_key_and_line(tmp_path, text, match):
    with pytest.raises(StudySpecError, match=match):
        load_spec(_write(tmp_path, text, "spec.yaml"))


def test_a_toml_key_given_twice_names_the_key(tmp_path):
    with pytest.raises(StudySpecError, match=r"invalid TOML: key 'name' is given twice: .*line 3"):
        load_spec(_write(tmp_path, "[study]\nname = 'a'\nname = 'b'\n\n[[models]]\nzoo = 'neox-tiny'\n"))


def test_a_merged_key_may_still_be_overridden(tmp_path):
    spec = load_spec(_write(tmp_path, "study: {name: y}\nmodels:\n  - &m {zoo: neox-tiny, lab: zoo}\n"
                                      "  - {<<: *m, zoo: gpt2-tiny-wd, id: other}\n", "spec.yaml"))
    assert [(m.zoo, m.lab) for m in spec.models] == [("neox-tiny", "zoo"), ("gpt2-tiny-wd", "zoo")]


@pytest.mark.parametrize("name", ["SPEC.YAML", "spec.Yml", "Spec.TOML"])
def test_the_extension_is_read_in_any_case(tmp_path, name):
    text = ("study: {name: up}\nmodels: [{zoo: neox-tiny}]\n" if "y" in name.lower().rsplit(".", 1)[1]
            else "[study]\nname = 'up'\n\n[[models]]\nzoo = 'neox-tiny'\n")
    assert load_spec(_write(tmp_path, text, name)).name == "up"
