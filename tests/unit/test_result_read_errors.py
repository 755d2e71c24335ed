"""Damaged stored results get a specific error when read, naming the class and the field, never a
crash later in ``repr``/``to_frame``/the report; a result read as another class says which it holds."""

from __future__ import annotations

import json

import pytest
import torch

import thermo_lens as tl
from thermo_lens.core.errors import ThermoLensInputTypeError, ThermoLensSchemaError
from thermo_lens.measures.gain import GainResult
from thermo_lens.core.result import encode


@pytest.fixture(scope="module")
def gain_json():
    from thermo_lens import zoo

    return tl.residual_gain(zoo.load("gpt2-tiny-wd"), ["The cat sat on the mat.", "Water freezes at zero."]).to_json()


def _tamper(text, path, value):
    data = json.loads(text)
    node = data["fields"]
    for k in path[:-1]:
        node = node[k]
        node = node.get("fields", node.get("__dict__", node)) if isinstance(node, dict) else node
    node[path[-1]] = value
    return json.dumps(data)


def test_a_real_result_still_round_trips(gain_json):
    back = GainResult.from_json(gain_json)
    repr(back), back.to_frame()
    assert back.to_json() == gain_json


@pytest.mark.parametrize("path, value, match", [
    (["block_gain"], "abc", r"field 'block_gain' holds a str .*not a tensor"),
    (["block_gain"], encode(torch.zeros(2, 3, dtype=torch.int64)), "field 'block_gain' holds a int64 tensor"),
    (["block_gain"], encode(torch.zeros(6)), r"field 'block_gain' holds a float32 tensor of shape \[6\]"),
    (["norms"], encode(torch.zeros(2, 9)), r"norms has shape \[2, 9\]"),
    (["norms"], encode(torch.zeros(5, 3)), r"cannot be rebuilt from its stored fields \(TypeCheckError"),
    (["regime"], 7, "field 'regime' holds a int"),
    (["token_scope"], ["all"], "field 'token_scope' holds a list"),
    (["summaries"], [1, 2], "field 'summaries' holds a list"),
    (["summaries", "last_block_gain"], 3.0, "field 'summaries' holds a dict"),
    (["level"], "0.95", "field 'level' holds a str"),
    (["level"], 7.0, r"level 7.0 is not in \(0, 1\)"),
    (["regime_by"], "no_such_summary", "regime_by 'no_such_summary' is not one of its summaries"),
    (["provenance"], {"__dict__": {}}, "field 'provenance' holds a dict"),
    (["per_token_gain"], "x", "field 'per_token_gain' holds a str"),
])
def test_a_damaged_field_is_named_at_load(gain_json, path, value, match):
    with pytest.raises(ThermoLensSchemaError, match=match):
        GainResult.from_json(_tamper(gain_json, path, value))


def test_a_result_read_as_another_class_says_which_it_holds(gain_json, tmp_path):
    from thermo_lens.measures.profile import ThermoProfile
    from thermo_lens.measures.spectral import SpectralSignature

    f = tmp_path / "gain.json"
    f.write_text(gain_json)
    for cls in (SpectralSignature, ThermoProfile):
        with pytest.raises(ThermoLensInputTypeError, match=f"gain.json holds a GainResult, not a {cls.__name__}; "
                                                           "read it with GainResult.from_json"):
            cls.from_json(f)
    # every stored class is reachable by its name, as the message says
    assert tl.GainResult is GainResult and tl.SpectralSignature is SpectralSignature
    assert isinstance(tl.SpectralSignature, type)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchResult'"):
        _ = tl.NoSuchResult
