"""Result JSON round-trip is exact (tensors bit-identical, NaN kept, nested results)."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from thermo_lens.core.result import Result, encode
from thermo_lens.core.errors import ThermoLensSchemaError


@dataclass(frozen=True)
class _Inner(Result):
    x: torch.Tensor
    label: str


@dataclass(frozen=True)
class _Outer(Result):
    inner: _Inner
    values: dict
    pair: tuple
    arr: np.ndarray
    f: float


def test_round_trip_is_exact(tmp_path):
    t = torch.randn(3, 4)
    t[0, 0] = float("nan")
    obj = _Outer(
        inner=_Inner(x=t, label="a"),
        values={"bf16": torch.randn(5).to(torch.bfloat16), "n": 3, "none": None, "l": [1.5, "x"]},
        pair=(1, "two", float("inf")),
        arr=np.arange(6, dtype=np.float64).reshape(2, 3) / 7,
        f=0.1,
    )
    back = _Outer.from_json(obj.to_json())
    assert torch.equal(back.inner.x.nan_to_num(7.0), t.nan_to_num(7.0)) and torch.isnan(back.inner.x[0, 0])
    assert back.values["bf16"].dtype == torch.bfloat16 and torch.equal(back.values["bf16"], obj.values["bf16"])
    assert back.pair == obj.pair and back.f == 0.1 and np.array_equal(back.arr, obj.arr)
    obj.to_json(tmp_path / "r.json")
    assert _Outer.from_json(tmp_path / "r.json").inner.label == "a"


# ------------------------------------------------------------------------------ schema evolution
DATA = Path(__file__).parents[1] / "data"


def test_a_profile_stored_by_thermo_lens_0_1_still_loads():
    """tests/data/profile_schema1.json was written by the first release's format (every per-head
    spectral metric its own field, no per-result versions); it must load, with its numbers."""
    from thermo_lens.measures.profile import ThermoProfile

    raw = json.loads((DATA / "profile_schema1.json").read_text())
    assert raw["thermo_lens_schema"] == 1 and "version" not in raw["fields"]["spectral"]
    prof = ThermoProfile.from_json(DATA / "profile_schema1.json")
    assert prof.name == "gpt2-tiny-wd" and prof.gain.regime == "dampener"
    assert prof.gain.last_block_gain.mean == pytest.approx(0.90985, abs=1e-4)
    assert set(prof.spectral.head_metrics) == {"W_V_norm", "W_O_norm", "ratio", "ov_norm", "W_V_frobenius",
                                               "W_O_frobenius", "W_V_stable_rank", "W_O_stable_rank"}
    assert prof.spectral.ov_norm.shape == (4, 4) and float(prof.spectral.ov_norm.mean()) == pytest.approx(1.103, abs=1e-3)
    assert prof.spectral.W_V_norm_kv.shape == (4, 4)
    assert prof.sheaf.mean_trace == pytest.approx(183.52, abs=0.01)
    row = prof.to_row()
    assert row["ov_norm"] == pytest.approx(1.103, abs=1e-3) and row["qk_norm"] is None  # not stored in 0.1
    again = ThermoProfile.from_json(prof.to_json())  # re-saved in today's schema, read back exactly
    assert torch.equal(again.spectral.ov_norm, prof.spectral.ov_norm)
    assert json.loads(prof.to_json())["fields"]["results"]["__dict__"]["spectral"]["version"] == 2


@dataclass(frozen=True)
class _Evolving(Result):
    x: Any  # the tests store every kind of value here
    added_later: str = "default"


def _stored(**fields):
    return json.dumps({"thermo_lens_schema": 1, "__result__": "_Evolving", "version": 1,
                       "fields": {k: encode(v) for k, v in fields.items()}})


def test_fields_added_later_get_their_defaults_and_unknown_fields_are_dropped_with_a_warning():
    assert _Evolving.from_json(_stored(x=3)) == _Evolving(3, "default")
    with pytest.warns(UserWarning, match=r"_Evolving.*\['gone'\].*dropped"):
        assert _Evolving.from_json(_stored(x=3, gone=[1, 2])) == _Evolving(3, "default")
    with pytest.raises(ThermoLensSchemaError, match=r"lacks the required field\(s\) \['x'\]"):
        _Evolving.from_json(_stored(added_later="y"))


def test_a_newer_schema_is_refused_with_a_clear_message():
    text = json.loads(_stored(x=1))
    text["version"] = 99
    with pytest.raises(ThermoLensSchemaError, match="schema version 99.*newer thermo-lens.*Upgrade"):
        _Evolving.from_json(json.dumps(text))


# ------------------------------------------------------------------------------ hostile input (issue 27)
from thermo_lens.core.errors import ThermoLensInputError, ThermoLensInputTypeError  # noqa: E402


def _with_x(value):
    """A stored _Evolving whose field x holds ``value`` (raw JSON data)."""
    return json.dumps({"thermo_lens_schema": 1, "__result__": "_Evolving", "version": 1, "fields": {"x": value}})


@pytest.mark.parametrize("name", ["load", "save", "nn", "Tensor", "__builtins__", "float8_e4m3fn", "object", 5])
def test_a_stored_dtype_is_never_looked_up_on_torch(name):
    with pytest.raises(ThermoLensSchemaError, match="dtype .* is not"):
        _Evolving.from_json(_with_x({"__dtype__": name}))


@pytest.mark.parametrize("stored, match", [
    ({"__tensor__": "AAAA", "dtype": "object", "shape": [1]}, "tensor dtype 'object'"),
    ({"__tensor__": "AAAAAA==", "dtype": "load", "shape": [1]}, "tensor dtype 'load'"),
    ({"__ndarray__": "AAAAAAAAAAA=", "dtype": "object", "shape": [1]}, "array dtype 'object'"),
    ({"__ndarray__": "AAAAAAAAAAA=", "dtype": "V8", "shape": [1]}, "array dtype 'V8'"),
    ({"__ndarray__": "AAAAAAAAAAA=", "dtype": "(2,)f4", "shape": [1]}, "array dtype"),
    ({"__tensor__": "not base64!", "dtype": "float32", "shape": [1]}, "not valid base64"),
    ({"__tensor__": 12, "dtype": "float32", "shape": [1]}, "not base64 text"),
    ({"__tensor__": "AAAAAA==", "dtype": "float32", "shape": [3]}, "does not fit shape"),
    ({"__tensor__": "AAAAAA==", "dtype": "float32", "shape": "1"}, "is not a list of sizes"),
    ({"__tensor__": "AAAAAA==", "dtype": "float32", "shape": [-1]}, "is not a list of sizes"),
    ({"__objarray__": [1, 2], "shape": [3]}, "does not hold 3 values"),
    ({"__float__": "1e999"}, "is not nan, inf or -inf"),
    ({"__tuple__": {"a": 1}}, "holds dict data"),
    ({"__items__": [[1]]}, "holds list data"),
    ({"__frame__": {"columns": 1}}, "lacks its columns"),
    ({"__result__": "NoSuchResult", "fields": {}}, "unknown result type 'NoSuchResult'"),
    ({"__result__": "_Inner", "fields": [1]}, "has no 'fields' object"),
    ({"__result__": "_Evolving", "fields": {"x": 1}, "version": "2"}, "not a whole number"),
    ({"what": 1}, "unrecognised JSON object"),
])
def test_damaged_stored_values_are_schema_errors(stored, match):
    with pytest.raises(ThermoLensSchemaError, match=match):
        _Evolving.from_json(_with_x(stored))


@pytest.mark.parametrize("text, error, match", [
    ("", ThermoLensInputError, "empty string"),
    ("   ", ThermoLensInputError, "empty string"),
    ("[1]", ThermoLensSchemaError, "holds a JSON list, not a stored thermo-lens result"),
    ('{"a": 1}', ThermoLensSchemaError, "holds an object without '__result__'"),
    ("{not json", ThermoLensSchemaError, "is not JSON .*line 1"),
    ("[" * 100_000 + "]" * 100_000, ThermoLensSchemaError, "nested too deeply"),
    (_with_x("[" * 100_000 + "]" * 100_000).replace('"[', "[").replace(']"', "]"), ThermoLensSchemaError,
     "nested too deeply"),
    (_with_x("[" * 500 + "]" * 500).replace('"[', "[").replace(']"', "]"), ThermoLensSchemaError,
     "nested more than 100 levels"),
])
def test_from_json_bad_text(text, error, match):
    with pytest.raises(error, match=match):
        _Evolving.from_json(text)


def test_from_json_bad_arguments_and_files(tmp_path, monkeypatch):
    from thermo_lens.core import result
    from thermo_lens.core.errors import SafeIOError

    for bad in (5, None, b"{}", ["{}"]):
        with pytest.raises(TypeError):  # under the test suite's type-check hook, its own TypeError first
            _Evolving.from_json(bad)
        with pytest.raises(ThermoLensInputTypeError, match="JSON text or a file path"):
            result._json_text(bad)  # what a user without the hook sees
    with pytest.raises(SafeIOError, match="no such file"):
        _Evolving.from_json(tmp_path / "missing.json")
    with pytest.raises(SafeIOError, match="is a directory"):
        _Evolving.from_json(tmp_path)
    monkeypatch.setattr(result, "MAX_JSON_BYTES", 100)
    big = _with_x("y" * 200)
    (tmp_path / "big.json").write_text(big)
    with pytest.raises(ThermoLensInputError, match="longer than 100 characters"):
        _Evolving.from_json(big)
    with pytest.raises(SafeIOError, match="larger than 100 bytes"):
        _Evolving.from_json(tmp_path / "big.json")
    monkeypatch.undo()
    with pytest.raises(ThermoLensInputTypeError, match="holds a _Inner, not a _Evolving"):
        _Evolving.from_json(_Inner(x=torch.zeros(1), label="a").to_json())


def test_every_stored_dtype_still_round_trips():
    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                  torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128):
        t = (torch.arange(6) % 3).to(dtype).reshape(2, 3)
        back = _Evolving.from_json(_with_x(encode({"t": t, "d": dtype})))
        assert back.x["d"] is dtype and back.x["t"].dtype == dtype and torch.equal(back.x["t"], t)
    arrays = [np.array(["ab", "c"]), np.array([b"x"]), np.array(["2024-01-01"], dtype="datetime64[D]"),
              np.arange(3, dtype=">f8"), np.array([True, False])]
    for a in arrays:
        assert np.array_equal(_Evolving.from_json(_with_x(encode(a))).x, a)


def test_an_unregistered_result_name_loads_the_measurement_modules_once(monkeypatch):
    """Result classes register when their module is imported, and measurement modules load lazily:
    reading a profile in a fresh process met ``LStarResult`` before anything imported it."""
    from thermo_lens.core import registry, result

    loads = []

    def load(**kwargs):
        loads.append(kwargs)
        result._REGISTRY["_Evolving"] = _Evolving  # what importing the providing module does
        return ()

    monkeypatch.delitem(result._REGISTRY, "_Evolving")
    monkeypatch.setattr(registry, "measurements", load)
    assert _Evolving.from_json(_with_x(3)) == _Evolving(3, "default") and len(loads) == 1
    with pytest.raises(ThermoLensSchemaError, match="unknown result type 'Nope'"):
        _Evolving.from_json(_with_x({"__result__": "Nope", "fields": {}}))


@pytest.mark.slow
def test_a_stored_profile_reads_back_in_a_fresh_process():
    import subprocess
    import sys

    code = ("from thermo_lens.measures.profile import ThermoProfile; "
            f"p = ThermoProfile.from_json({str(DATA / 'profile_schema1.json')!r}); "
            "print(sorted(type(r).__name__ for r in p.results.values()))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).parents[2])
    assert r.returncode == 0 and "'LStarResult'" in r.stdout, r.stderr[-2000:]
