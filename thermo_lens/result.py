"""Base for result objects: frozen dataclasses that round-trip through JSON exactly.

Subclass :class:`Result` with ``@dataclass(frozen=True)``; fields may be tensors, numpy arrays,
numbers, strings, lists/tuples/dicts of those, or other :class:`Result` objects. Tensors and
arrays are stored as base64 of their raw bytes with dtype and shape, so ``from_json(to_json())``
gives bit-identical values (NaN included); everything else is plain JSON.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

__all__ = ["Result", "encode", "decode"]

_REGISTRY: dict[str, type] = {}


def encode(obj: Any) -> Any:
    """Turn ``obj`` into JSON-ready data (see module docstring)."""
    if isinstance(obj, Result):
        data = {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        return {"__result__": type(obj).__name__, "fields": data}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        arr = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
        return {"__tensor__": base64.b64encode(arr.tobytes()).decode("ascii"),
                "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        return {"__ndarray__": base64.b64encode(a.tobytes()).decode("ascii"),
                "dtype": str(a.dtype), "shape": list(a.shape)}
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return encode(obj.item())
    if isinstance(obj, float) and not np.isfinite(obj):
        return {"__float__": repr(obj)}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v) for v in obj]}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {"__dict__": {k: encode(v) for k, v in obj.items()}}
        return {"__items__": [[encode(k), encode(v)] for k, v in obj.items()]}
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).replace("torch.", "")}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot serialise {type(obj).__name__} in a thermo-lens result")


def decode(data: Any) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "__result__" in data:
        cls = _REGISTRY.get(data["__result__"])
        if cls is None:
            raise ValueError(f"unknown result type {data['__result__']!r} in JSON")
        return cls(**{k: decode(v) for k, v in data["fields"].items()})
    if "__tensor__" in data:
        raw = base64.b64decode(data["__tensor__"])
        if data["dtype"] == "bfloat16":
            arr = np.frombuffer(raw, dtype=np.int16).copy()
            return torch.from_numpy(arr).view(torch.bfloat16).reshape(data["shape"])
        arr = np.frombuffer(raw, dtype=np.dtype(data["dtype"])).copy()
        return torch.from_numpy(arr).reshape(data["shape"])
    if "__ndarray__" in data:
        raw = base64.b64decode(data["__ndarray__"])
        return np.frombuffer(raw, dtype=np.dtype(data["dtype"])).copy().reshape(data["shape"])
    if "__float__" in data:
        return float(data["__float__"])
    if "__tuple__" in data:
        return tuple(decode(v) for v in data["__tuple__"])
    if "__dict__" in data:
        return {k: decode(v) for k, v in data["__dict__"].items()}
    if "__items__" in data:
        return {decode(k): decode(v) for k, v in data["__items__"]}
    if "__dtype__" in data:
        return getattr(torch, data["__dtype__"])
    raise ValueError(f"unrecognised JSON object with keys {sorted(data)}")


class Result:
    """Mixin for frozen-dataclass results: ``to_json`` / ``from_json`` / ``save`` / ``load``."""

    schema_version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _REGISTRY[cls.__name__] = cls

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int | None = None) -> str:
        """JSON text of this result (exact round-trip); also written to ``path`` if given."""
        text = json.dumps({"thermo_lens_schema": self.schema_version, **encode(self)}, indent=indent)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> Any:
        """Rebuild a result from :meth:`to_json` output (a JSON string or a file path)."""
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text_or_path).read_text()
        data = json.loads(text)
        data.pop("thermo_lens_schema", None)
        obj = decode(data)
        if not isinstance(obj, cls):
            raise TypeError(f"JSON holds a {type(obj).__name__}, not a {cls.__name__}")
        return obj
