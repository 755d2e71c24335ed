"""Result JSON round-trip is exact (tensors bit-identical, NaN kept, nested results)."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from thermo_lens.result import Result, encode
from thermo_lens.errors import ThermoLensSchemaError


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
DATA = Path(__file__).parent / "data"


def test_a_profile_stored_by_thermo_lens_0_1_still_loads():
    """tests/data/profile_schema1.json was written by the first release's format (every per-head
    spectral metric its own field, no per-result versions); it must load, with its numbers."""
    from thermo_lens.profile import ThermoProfile

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
    x: int
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
