"""Result JSON round-trip is exact (tensors bit-identical, NaN kept, nested results)."""

from dataclasses import dataclass

import numpy as np
import torch

from thermo_lens.result import Result


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
