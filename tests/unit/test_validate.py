"""The one validation layer: strict types (no truthy strings), checks before any model load,
messages that say what to pass; float64 end to end."""

import math

import pytest
import torch

import thermo_lens
from thermo_lens.core import validate as V
from thermo_lens import zoo
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.experiments.study import ModelSpec, StudySpec

PROMPTS = ["The capital of France is", "Water freezes at"]


@pytest.fixture(scope="module")
def tiny():
    return zoo.load("gpt2-tiny-wd")


@pytest.mark.parametrize("call, match", [
    (lambda m: thermo_lens.profile(m, PROMPTS, truncate="no"), r"truncate must be True or False, got str 'no'"),
    (lambda m: thermo_lens.profile(m, PROMPTS, batch_size=True), r"batch_size must be a positive integer"),
    (lambda m: thermo_lens.profile(m, PROMPTS, batch_size=0), r"batch_size must be a positive integer"),
    (lambda m: thermo_lens.profile(m, PROMPTS, prepend_bos="yes"), r'prepend_bos must be "host", True, False or "tokenizer"'),
    (lambda m: thermo_lens.profile(m, PROMPTS, name=5), r"name must be a non-empty string, got int 5"),
    (lambda m: thermo_lens.profile(m, PROMPTS, lab=["x"]), r"lab must be a non-empty string, got list"),
    (lambda m: thermo_lens.profile(m, PROMPTS, fwd_hooks=None), r"fwd_hooks must be a list of \(hook_name, fn\) pairs; for none, pass \[\]"),
    (lambda m: thermo_lens.residual_gain(m, PROMPTS, per_token="x"), r"per_token must be True or False"),
    (lambda m: thermo_lens.residual_gain(m, PROMPTS, fwd_hooks=None), r"fwd_hooks must be a list"),
    (lambda m: thermo_lens.residual_gain(m, PROMPTS, fwd_hooks=[("blocks.0.hook_resid_post",)]), r"fwd_hooks\[0\] must be a \(hook_name, fn\) pair"),
    (lambda m: thermo_lens.residual_gain(m, PROMPTS, fwd_hooks=[("blocks.0.hook_resid_post", 3)]), r"fwd_hooks\[0\] function must be a function"),
    (lambda m: thermo_lens.residual_gain(m, PROMPTS, truncate=1), r"truncate must be True or False, got int 1"),
    (lambda m: thermo_lens.sheaf_traces(m, PROMPTS, batch_size=2.0), r"batch_size must be a positive integer"),
    (lambda m: thermo_lens.spectral_signature(m, layer_norms="x"), r"layer_norms must be True or False"),
    (lambda m: thermo_lens.spectral_signature(m, device="banana"), r'device must be a torch device such as "cpu"'),
])
def test_api_options_are_checked_strictly(tiny, call, match):
    with pytest.raises(ThermoLensInputError, match=match):
        call(tiny)


def test_numpy_bool_is_a_bool():
    np = pytest.importorskip("numpy")
    assert V.boolean("truncate", np.bool_(True)) is True


@pytest.mark.parametrize("kw, match", [
    (dict(lab=["x"]), r"lab must be a non-empty string"),
    (dict(family=5), r"family must be a non-empty string"),
    (dict(num_gpus=-5), r"num_gpus must be a finite number >= 0"),
    (dict(num_gpus=math.nan), r"num_gpus must be a finite number >= 0"),
    (dict(num_gpus=True), r"num_gpus must be a finite number >= 0"),
    (dict(threads=0), r"threads must be a positive integer"),
    (dict(threads=True), r"threads must be a positive integer"),
    (dict(device="banana"), r'device must be a torch device such as "cpu", "cuda" or "cuda:0"'),
    (dict(device="cuda:x"), r'device must be a torch device'),
    (dict(device="meta"), r"only cpu, cuda and mps devices"),
    (dict(dtype="float8"), r"dtype must be one of float32, float16, bfloat16, float64, auto"),
    (dict(device_map=["x"]), r"device_map must be \"auto\" or a \{module: device\} table"),
    (dict(trust_remote_code="yes"), r"trust_remote_code must be True or False"),
])
def test_model_spec_options_are_checked_before_any_load(kw, match):
    with pytest.raises(ThermoLensInputError, match=match):
        ModelSpec(id="m", zoo="gpt2-tiny-wd", **kw)


def test_spec_devices_are_checked_where_the_models_run(tmp_path):
    """A spec may name GPUs only Ray workers have; the local executor checks them before any load."""
    from thermo_lens.experiments.study import run_study

    m = ModelSpec(id="m", zoo="gpt2-tiny-wd", device="cuda:7")
    spec = StudySpec(name="s", models=(m,), prompts=PROMPTS)

    def never(model, settings):
        raise AssertionError("a model was run")

    with pytest.raises(ThermoLensInputError, match="model 'm': device='cuda:7'"):
        run_study(spec, tmp_path / "out", profile_fn=never)
    assert not (tmp_path / "out").exists()


def test_cuda_index_beyond_the_devices_here():
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    msg = "no CUDA device is available" if n == 0 else f"has {n} CUDA device"
    with pytest.raises(ThermoLensInputError, match=msg):
        V.device(f"cuda:{n + 6}")
    assert V.device("cpu") == "cpu" and V.device(torch.device("cpu")) == "cpu"


@pytest.mark.parametrize("kw, match", [
    (dict(name=5), r"name must be a non-empty string, got int 5"),
    (dict(name="/nonexistent/model"), r"no such local checkpoint folder"),
    (dict(name="../nope"), r"no such local checkpoint folder"),
    (dict(name="../../x/y"), r"no such local checkpoint folder"),
    (dict(name="gpt2", zoo="gpt2-tiny-wd"), r"exactly one of name"),
    (dict(zoo="nope"), r"unknown embedded model"),
])
def test_model_names(kw, match):
    with pytest.raises(ThermoLensInputError, match=match):
        ModelSpec(id="m", **kw)


def test_zoo_name_given_as_name_means_the_zoo_model():
    m = ModelSpec(id="m", name="gpt2-tiny-nowd")
    assert m.zoo == "gpt2-tiny-nowd" and m.name is None and m.source == "zoo:gpt2-tiny-nowd"


@pytest.mark.parametrize("kw, match", [
    (dict(truncate="no"), r"truncate must be True or False"),
    (dict(batch_size=True), r"batch_size must be a positive integer"),
    (dict(prompts={"Factual": 5}), r"prompts: category 'Factual'"),
    (dict(prompts="Factual"), r"prompts: 'Factual' is not a built-in prompt set"),
    (dict(token_scope="first"), r"token_scope must be one of last, all_but_first, all, frobenius"),
    (dict(name=5), r"study name must be a non-empty string"),
])
def test_study_spec_settings(kw, match):
    with pytest.raises(ThermoLensInputError, match=match):
        StudySpec(**{"name": "s", "models": (ModelSpec(id="m", zoo="gpt2-tiny-wd"),), **kw})


def test_study_prompts_by_category_measure_the_prompts_not_the_keys():
    spec = StudySpec(name="s", models=(ModelSpec(id="m", zoo="gpt2-tiny-wd"),),
                     prompts={"Factual": ["The capital of France is"], "Math": ["Two plus two is"]})
    from thermo_lens.core.prompts import as_prompt_set

    ps = as_prompt_set(spec.prompts)
    assert list(ps.prompts) == ["The capital of France is", "Two plus two is"]
    assert list(ps.categories) == ["Factual", "Math"]


@pytest.mark.parametrize("bad", ["manifest", "MANIFEST", "manifest.json", ".hidden", "lock", "report",
                                 "summary", "../escaped", "/abs/path/victim", "a/b", "x\x00y", "-x", "=1+1", "+x", "", "a" * 201])
def test_ids_must_be_safe_file_names(bad):
    with pytest.raises(ThermoLensInputError):
        V.file_id(bad)
    s = V.slug(bad)
    assert V.file_id(s) == s and "/" not in s and not s.startswith(".")


@pytest.mark.parametrize("bad", [0, 1, 0.0, 1.0, 1.5, -0.1, math.nan, True, False, "0.9", None, [0.9]])
def test_a_confidence_level_is_a_real_number_strictly_between_0_and_1(bad):
    with pytest.raises(ThermoLensInputError, match=r"level must be a confidence level in \(0, 1\), got "):
        V.confidence_level("level", bad)


def test_a_confidence_level_may_be_a_numpy_float():
    np = pytest.importorskip("numpy")
    got = V.confidence_level("level", np.float32(0.9))
    assert type(got) is float and got == float(np.float32(0.9))
    assert V.confidence_level("level", 0.95) == 0.95


def test_excerpt_is_bounded():
    assert len(V.excerpt("x" * 10**6)) < 120
    with pytest.raises(ThermoLensInputError) as e:
        V.token_scope("y" * 10**6)
    assert len(str(e.value)) < 300


@pytest.mark.slow
def test_float64_profile_end_to_end(tiny):
    """A float64 model profiles, agrees with float32 to float32 precision, and round-trips."""
    m64 = zoo.load("gpt2-tiny-wd", dtype=torch.float64)
    p64 = thermo_lens.profile(m64, PROMPTS, progress=False)
    p32 = thermo_lens.profile(tiny, PROMPTS, progress=False)
    assert p64.meta["dtype"] == "float64"
    torch.testing.assert_close(p64.gain.block_gain, p32.gain.block_gain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(p64.sheaf.trace.double(), p32.sheaf.trace.double(), rtol=1e-4, atol=1e-4)
    back = type(p64).from_json(p64.to_json())
    assert torch.equal(back.gain.block_gain, p64.gain.block_gain)
    assert V.dtype("float64") == "float64" and V.dtype(torch.float64) == "float64"


def test_ids_with_knob_settings_are_fine():
    """Ids such as a heritage lab's arm x seed (``lr=0.001+wd=0.1__seed0``) name files as they are."""
    for good in ("weight_decay=0.1+lr=0.001__seed0__step000100", "base__seed0", "pythia-1.4b", "_x"):
        assert V.file_id(good) == good and V.slug(good) == good
