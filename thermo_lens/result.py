"""Base for result objects: frozen dataclasses that round-trip through JSON exactly.

Subclass :class:`Result` with ``@dataclass(frozen=True)``; fields may be tensors, numpy arrays,
pandas DataFrames (by column), numbers, strings, lists/tuples/dicts of those, or other
:class:`Result` objects. Tensors and
arrays are stored as base64 of their raw bytes with dtype and shape, so ``from_json(to_json())``
gives bit-identical values (NaN included); everything else is plain JSON.

Stored results evolve (in the manner of tuned-lens' ``TunedLensConfig.from_dict``): every stored
result records its class's ``schema_version``. Reading one back fills the dataclass defaults of
fields added since it was written, warns about and drops fields this version does not know,
lets the class convert older layouts (:meth:`Result.migrate`), and refuses a result written by a
newer schema with a :class:`ThermoLensSchemaError` that says to upgrade.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from thermo_lens.errors import ThermoLensSchemaError

__all__ = ["Result", "encode", "decode"]



_REGISTRY: dict[str, type] = {}


def encode(obj: Any) -> Any:
    """Turn ``obj`` into JSON-ready data (see module docstring)."""
    if isinstance(obj, Result):
        data = {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}  # type: ignore[arg-type]
        return {"__result__": type(obj).__name__, "version": type(obj).schema_version, "fields": data}
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        arr = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
        return {"__tensor__": base64.b64encode(arr.tobytes()).decode("ascii"),
                "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
    if isinstance(obj, pd.DataFrame):
        return _encode_frame(obj)
    if isinstance(obj, np.ndarray) and obj.dtype == object:
        return {"__objarray__": [encode(v) for v in obj.ravel().tolist()], "shape": list(obj.shape)}
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


def decode(data: Any) -> Any:  # noqa: C901 - one flat branch per stored type
    """Inverse of :func:`encode`."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "__result__" in data:
        cls = _REGISTRY.get(data["__result__"])
        if cls is None:
            raise ValueError(f"unknown result type {data['__result__']!r} in JSON")
        fields = {k: decode(v) for k, v in data["fields"].items()}
        upgrade = getattr(cls, "_upgrade_fields", None)
        if upgrade is not None:
            fields = upgrade(fields)
        return _build(cls, fields, int(data.get("version", 1)))
    if "__tensor__" in data:
        raw = base64.b64decode(data["__tensor__"])
        if data["dtype"] == "bfloat16":
            bits = np.frombuffer(raw, dtype=np.int16).copy()
            return torch.from_numpy(bits).view(torch.bfloat16).reshape(data["shape"])
        arr = np.frombuffer(raw, dtype=np.dtype(data["dtype"])).copy()
        return torch.from_numpy(arr).reshape(data["shape"])
    if "__ndarray__" in data:
        raw = base64.b64decode(data["__ndarray__"])
        return np.frombuffer(raw, dtype=np.dtype(data["dtype"])).copy().reshape(data["shape"])
    if "__frame__" in data:
        return _decode_frame(data["__frame__"])
    if "__objarray__" in data:
        out = np.empty(len(data["__objarray__"]), dtype=object)
        out[:] = [decode(v) for v in data["__objarray__"]]
        return out.reshape(data["shape"])
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


def _build(cls: Any, fields: dict[str, Any], version: int) -> Any:
    """``cls(**fields)`` for fields stored under schema ``version`` (see the module docstring)."""
    if version > cls.schema_version:
        raise ThermoLensSchemaError(
            f"this {cls.__name__} was stored with schema version {version}, but this thermo-lens reads "
            f"{cls.__name__} up to version {cls.schema_version}: it was written by a newer thermo-lens. "
            "Upgrade thermo-lens (pip install -U thermo-lens) to read it."
        )
    fields = cls.migrate(dict(fields), version)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(fields) - set(known))
    if unknown:
        warnings.warn(
            f"{cls.__name__} (schema {version}) has field(s) {unknown} that this thermo-lens does not know; "
            "they are dropped (written by a different version?)", UserWarning, stacklevel=4)
    missing = [n for n, f in known.items() if n not in fields and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ThermoLensSchemaError(
            f"this {cls.__name__} (schema {version}) lacks the required field(s) {missing}; the file is "
            "damaged or was not written by thermo-lens"
        )
    return cls(**{k: v for k, v in fields.items() if k in known})


def _encode_column(values: Any, dtype: Any) -> Any:
    if isinstance(dtype, np.dtype) and dtype != np.dtype(object):
        return encode(np.asarray(values))
    return [None if v is pd.NA else encode(v) for v in list(values)]


def _encode_frame(df: pd.DataFrame) -> dict:
    """A DataFrame as columns (numeric ones as exact ndarrays), dtypes, index and axis names."""
    return {"__frame__": {
        "columns": [encode(c) for c in df.columns], "dtypes": [str(t) for t in df.dtypes],
        "data": [_encode_column(df.iloc[:, i].to_numpy(), t) for i, t in enumerate(df.dtypes)],
        "index": _encode_column(df.index.to_numpy(), df.index.dtype), "index_dtype": str(df.index.dtype),
        "index_name": df.index.name, "columns_name": df.columns.name,
    }}


def _decode_frame(f: dict) -> pd.DataFrame:
    cols = [decode(c) for c in f["columns"]]
    data = {}
    for c, t, v in zip(cols, f["dtypes"], f["data"]):
        vals = decode(v)
        data[c] = pd.array(vals, dtype=t) if not isinstance(vals, np.ndarray) and t != "object" else vals
    df = pd.DataFrame(data, columns=cols)
    if len(cols) != len(set(cols)):  # pragma: no cover - never produced by thermo-lens
        raise ValueError("duplicate column names in a stored frame")
    index = decode(f["index"])
    if not (isinstance(index, np.ndarray) and f["index_dtype"] == "int64"
            and np.array_equal(index, np.arange(len(df)))):
        df.index = pd.Index(index if isinstance(index, np.ndarray) else np.array(index, dtype=object),
                            dtype=None if f["index_dtype"] == "object" or f["index_dtype"] == "category"
                            else f["index_dtype"])
    df.index.name = f["index_name"]
    df.columns.name = f["columns_name"]
    return df


class Result:
    """Mixin for frozen-dataclass results: ``to_json`` / ``from_json`` / ``save`` / ``load``."""

    schema_version: ClassVar[int] = 1
    #: Fields renamed in a schema version: ``{version: {old name: new name}}``; results stored
    #: under an older version are read with the new names (:meth:`migrate`).
    renamed_fields: ClassVar[dict[int, dict[str, str]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _REGISTRY[cls.__name__] = cls

    @classmethod
    def migrate(cls, fields: dict[str, Any], version: int) -> dict[str, Any]:
        """Convert the decoded ``fields`` of a result stored under an older ``version`` to this
        class's current layout. The base class applies :attr:`renamed_fields`; subclasses that
        regroup fields extend it. Added fields need nothing here: their dataclass defaults fill them."""
        for since, renames in sorted(cls.renamed_fields.items()):
            if version < since:
                fields = {renames.get(k, k): v for k, v in fields.items()}
        return fields

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int | None = None) -> str:
        """JSON text of this result (exact round-trip); also written to ``path`` if given."""
        text = json.dumps({"thermo_lens_schema": self.schema_version, **encode(self)}, indent=indent)
        if path is not None:
            from thermo_lens.safe_io import atomic_write_text

            atomic_write_text(path, text)  # atomic; replaces a symlink instead of writing through it
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
