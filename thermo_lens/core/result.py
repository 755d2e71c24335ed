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

Reading is bounded and strict: at most :data:`MAX_JSON_BYTES` of text and :data:`MAX_DEPTH`
levels of nesting; tensors and arrays only of the dtypes a result stores (bool, integers, floats,
complex; for arrays also dates and fixed-width text), never ``object`` or a name looked up on
``torch``; base64 data and shapes checked. Anything else is a :class:`ThermoLensSchemaError`
naming what is wrong (an empty string or a wrong type: :class:`ThermoLensInputError`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence, TypeVar

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from thermo_lens.core import registry
from thermo_lens.core.errors import ThermoLensError, ThermoLensInputError, ThermoLensInputTypeError, ThermoLensSchemaError

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

__all__ = ["Result", "Selection", "DimIndex", "encode", "decode", "register_plot", "label", "DIM_LABELS", "MAX_JSON_BYTES",
           "MAX_DEPTH"]

#: The largest JSON text (characters, or bytes of a file) :meth:`Result.from_json` reads.
MAX_JSON_BYTES = 1 << 31
#: The deepest nesting of stored values :func:`decode` follows (a profile uses about 12).
MAX_DEPTH = 100
# Tensor dtypes a result stores (bfloat16 travels as int16 bits); array dtypes by numpy kind:
# bool, signed, unsigned, float, complex, timedelta, datetime, unicode and byte strings.
_TORCH_DTYPES = frozenset({"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
                           "float64", "complex64", "complex128"})
_ARRAY_KINDS = "biufcmMUS"

#: Result class name -> class (every :class:`Result` subclass, registered when defined): how stored
#: JSON, which names its class, is read back. Live results are matched by type, never by name.
_REGISTRY: dict[str, type] = registry._RESULT_TYPES
#: What a result stores as an array of values.
ArrayLike = torch.Tensor | np.ndarray
#: JSON-ready data (what :func:`encode` returns): nested dicts and lists of these.
JSONData = dict[str, object] | list[object] | str | int | float | bool | None
#: A figure function of :func:`register_plot`.
PlotFn = TypeVar("PlotFn", bound=Callable[..., object])
R = TypeVar("R", bound="Result")
# Result class name -> its figure, registered by thermo_lens.views (results never import views: the
# figures sit in a layer above; `Result.plot` loads them on first use).
_PLOTS: dict[str, Callable[..., Figure]] = {}
_FIGURES_MODULE = "thermo_lens.views"


def register_plot(result: str) -> Callable[[PlotFn], PlotFn]:
    """Decorator (for :mod:`thermo_lens.views`): ``fn(result, **kwargs) -> Figure`` is what
    ``result.plot(**kwargs)`` draws for instances of the result class named ``result``."""
    def wrap(fn: PlotFn) -> PlotFn:
        _PLOTS[result] = fn
        return fn
    return wrap


def encode(obj: object) -> JSONData:
    """Turn ``obj`` into JSON-ready data (see module docstring)."""
    if isinstance(obj, Result):
        return _encode_result(obj)
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


def _encode_result(obj: Result) -> dict[str, object]:
    # ignore: mypy cannot see that a Result subclass is a dataclass (the mixin itself is not one)
    data = {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}  # type: ignore[arg-type]  # see above
    return {"__result__": type(obj).__name__, "version": type(obj).schema_version, "fields": data}


def decode(data: object) -> object:
    """Inverse of :func:`encode`.

    Raises:
        ThermoLensSchemaError: data :func:`encode` does not write (an unknown marker or dtype,
            bad base64, a shape that does not fit the data, nesting deeper than :data:`MAX_DEPTH`).
    """
    return _decode(data, 0)


def _decode(data: object, depth: int) -> object:
    if depth > MAX_DEPTH:
        raise ThermoLensSchemaError(f"stored values nested more than {MAX_DEPTH} levels deep; not a thermo-lens result")
    if isinstance(data, list):
        return [_decode(v, depth + 1) for v in data]
    if not isinstance(data, dict):
        return data
    for marker, decoder in _DECODERS.items():
        if marker in data:
            return decoder(data, depth + 1)
    raise ThermoLensSchemaError(f"unrecognised JSON object with keys {_excerpt(sorted(map(str, data)))}")


def _decode_result(data: dict, depth: int) -> Result:
    name, fields, version = data["__result__"], data.get("fields"), data.get("version", 1)
    cls = _result_class(name)
    if cls is None:
        raise ThermoLensSchemaError(f"unknown result type {_excerpt(name)} in JSON (written by another package or a "
                                    "newer thermo-lens?)")
    if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
        raise ThermoLensSchemaError(f"the stored {cls.__name__} has no 'fields' object")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ThermoLensSchemaError(f"the stored {cls.__name__} has version {_excerpt(version)}, not a whole number")
    decoded = {k: _decode(v, depth) for k, v in fields.items()}
    upgrade = getattr(cls, "_upgrade_fields", None)
    if upgrade is not None:
        decoded = upgrade(decoded)
    return _build(cls, decoded, version)


def _result_class(name: object) -> type | None:
    """The result class stored under ``name``. Classes register themselves when their module is
    imported, and the measurement modules are imported lazily: a profile read in a fresh process
    names results (``LStarResult``...) whose module nothing imported yet, so on a miss the
    measurement registry loads its providers once and the name is looked up again."""
    if not isinstance(name, str):
        return None
    if name not in _REGISTRY:
        registry.measurements()  # imports every module that provides a measurement (and its result)
    return _REGISTRY.get(name)


def _decode_tensor(data: dict, depth: int) -> torch.Tensor:
    name = data.get("dtype")
    if name not in _TORCH_DTYPES:
        raise ThermoLensSchemaError(f"tensor dtype {_excerpt(name)} is not one a thermo-lens result stores "
                                    f"({', '.join(sorted(_TORCH_DTYPES))})")
    raw = _b64(data["__tensor__"])
    shape = _shape(data.get("shape"))
    if name == "bfloat16":
        bits = _frombuffer(raw, np.dtype(np.int16), shape)
        return torch.from_numpy(bits).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(_frombuffer(raw, np.dtype(name), shape)).reshape(shape)


def _decode_ndarray(data: dict, depth: int) -> np.ndarray:
    shape = _shape(data.get("shape"))
    return _frombuffer(_b64(data["__ndarray__"]), _array_dtype(data.get("dtype")), shape).reshape(shape)


def _decode_objarray(data: dict, depth: int) -> np.ndarray:
    values, shape = data["__objarray__"], _shape(data.get("shape"))
    if not isinstance(values, list) or len(values) != math.prod(shape):
        raise ThermoLensSchemaError(f"a stored object array of shape {shape} does not hold {math.prod(shape)} values")
    out = np.empty(len(values), dtype=object)
    out[:] = [_decode(v, depth) for v in values]
    return out.reshape(shape)


def _decode_float(data: dict, depth: int) -> float:
    if data["__float__"] not in ("nan", "inf", "-inf"):
        raise ThermoLensSchemaError(f"stored float {_excerpt(data['__float__'])} is not nan, inf or -inf")
    return float(data["__float__"])


def _decode_dtype(data: dict, depth: int) -> torch.dtype:
    name = data["__dtype__"]
    if name not in _TORCH_DTYPES:
        raise ThermoLensSchemaError(f"stored dtype {_excerpt(name)} is not a torch dtype a result stores "
                                    f"({', '.join(sorted(_TORCH_DTYPES))})")
    return getattr(torch, name)


def _decode_container(kind: str) -> Callable[[dict, int], object]:
    def decode_it(data: dict, depth: int) -> object:
        v = data[kind]
        if kind == "__dict__" and isinstance(v, dict):
            return {k: _decode(x, depth) for k, x in v.items()}
        if kind == "__tuple__" and isinstance(v, list):
            return tuple(_decode(x, depth) for x in v)
        if kind == "__items__" and isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
            return {_decode(k, depth): _decode(x, depth) for k, x in v}
        raise ThermoLensSchemaError(f"a stored {kind.strip('_')} holds {type(v).__name__} data")
    return decode_it


_DECODERS: dict[str, Callable[[dict, int], object]] = {
    "__result__": _decode_result,
    "__tensor__": _decode_tensor,
    "__ndarray__": _decode_ndarray,
    "__frame__": lambda data, depth: _decode_frame(data["__frame__"], depth),
    "__objarray__": _decode_objarray,
    "__float__": _decode_float,
    "__tuple__": _decode_container("__tuple__"),
    "__dict__": _decode_container("__dict__"),
    "__items__": _decode_container("__items__"),
    "__dtype__": _decode_dtype,
}


def _excerpt(value: object) -> str:
    from thermo_lens.core.validate import excerpt

    return excerpt(value, 60)


def _b64(text: object) -> bytes:
    if not isinstance(text, str):
        raise ThermoLensSchemaError(f"stored tensor data is {type(text).__name__}, not base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ThermoLensSchemaError("stored tensor data is not valid base64 (damaged file?)") from None


def _shape(shape: object) -> tuple[int, ...]:
    if not isinstance(shape, list) or len(shape) > 64 or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ThermoLensSchemaError(f"stored shape {_excerpt(shape)} is not a list of sizes")
    return tuple(shape)


def _array_dtype(name: object) -> np.dtype:
    try:
        dt = np.dtype(name) if isinstance(name, str) and len(name) <= 40 else None
    except TypeError:
        dt = None
    if dt is None or dt.kind not in _ARRAY_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise ThermoLensSchemaError(f"array dtype {_excerpt(name)} is not one a thermo-lens result stores "
                                    "(bool, integer, float, complex, date or fixed-width text; never object)")
    return dt


def _frombuffer(raw: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise ThermoLensSchemaError(f"stored data of {len(raw)} bytes does not fit shape {list(shape)} of {dtype}")
    return np.frombuffer(raw, dtype=dtype).copy()


def _build(cls: type[Result], fields: dict[str, object], version: int) -> Result:
    """``cls(**fields)`` for fields stored under schema ``version`` (see the module docstring)."""
    if version > cls.schema_version:
        raise ThermoLensSchemaError(
            f"this {cls.__name__} was stored with schema version {version}, but this thermo-lens reads "
            f"{cls.__name__} up to version {cls.schema_version}: it was written by a newer thermo-lens. "
            "Upgrade thermo-lens (pip install -U thermo-lens) to read it."
        )
    fields = cls.migrate(dict(fields), version)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]  # a Result subclass is a dataclass
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
    kwargs = {k: v for k, v in fields.items() if k in known}
    for name, value in kwargs.items():
        hint = _field_hints(cls).get(name)
        if hint is not None and not _conforms(value, hint, 0):
            raise ThermoLensSchemaError(
                f"this {cls.__name__}'s field {name!r} holds {_describe(value)}, not {_hint_name(hint)}; the file is "
                "damaged or was not written by thermo-lens")
    try:
        obj = cls(**kwargs)
    except ThermoLensError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as e:
        raise ThermoLensSchemaError(f"this {cls.__name__} cannot be rebuilt from its stored fields ({type(e).__name__}: "
                                    f"{_excerpt(str(e))}); the file is damaged or was not written by thermo-lens") from None
    why = obj._stored_problem()
    if why:
        raise ThermoLensSchemaError(f"this {cls.__name__} is inconsistent: {why}; the file is damaged or was not written "
                                    "by thermo-lens")
    return obj


_HINTS: dict[type, dict[str, Any]] = {}


def _field_hints(cls: type) -> dict[str, Any]:
    """Field name -> resolved annotation, for the fields whose annotation resolves (the others are
    not checked: an annotation that names a type only under ``TYPE_CHECKING``)."""
    if cls not in _HINTS:
        import sys
        import typing

        hints: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            owner = next((c for c in cls.__mro__ if f.name in getattr(c, "__annotations__", {})), cls)
            ns = dict(vars(sys.modules.get(owner.__module__, typing)))
            try:
                hints[f.name] = typing.get_type_hints(owner, ns)[f.name] if isinstance(f.type, str) else f.type
            except Exception:  # noqa: BLE001 - an annotation that does not resolve here is not checked
                continue
        _HINTS[cls] = hints
    return _HINTS[cls]


def _is_array_type(hint: object) -> bool:
    return hasattr(hint, "dim_str") and hasattr(hint, "dtypes")


def _conforms(value: object, hint: object, depth: int) -> bool:
    """Whether a decoded value fits a field's annotation: classes, unions, ``dict``/``list``/
    ``tuple`` of them, ``Literal``, and jaxtyping arrays (dtype and number of axes). Anything
    this does not understand passes (the class's own checks have the last word)."""
    import types
    import typing

    if depth > 20 or hint is Any or hint is object:
        return True
    if _is_array_type(hint) and isinstance(hint, type):
        return isinstance(value, hint)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_conforms(value, a, depth + 1) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin is typing.ClassVar:
        return True
    if hint is type(None):
        return value is None
    if origin in (dict, typing.Mapping, list, typing.Sequence, tuple) or hint in (dict, list, tuple):
        return _container_conforms(value, origin or hint, args, depth)
    if origin is not None:
        hint = origin
    if not isinstance(hint, type):
        return True
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _container_conforms(value: object, kind: object, args: tuple, depth: int) -> bool:
    import typing

    if kind in (dict, typing.Mapping):
        return isinstance(value, dict) and (len(args) != 2 or all(
            _conforms(k, args[0], depth + 1) and _conforms(v, args[1], depth + 1) for k, v in value.items()))
    if kind in (list, typing.Sequence):
        if not isinstance(value, (list, tuple)) or (kind is not typing.Sequence and not isinstance(value, list)):
            return False
        return not args or all(_conforms(v, args[0], depth + 1) for v in value)
    if not isinstance(value, tuple):
        return False
    if len(args) == 2 and args[1] is Ellipsis:
        return all(_conforms(v, args[0], depth + 1) for v in value)
    if args and args != ((),):
        return len(args) == len(value) and all(_conforms(v, a, depth + 1) for v, a in zip(value, args))
    return True


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {list(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {list(value.shape)}"
    return f"a {type(value).__name__} ({_excerpt(value)})"


def _hint_name(hint: object) -> str:
    if _is_array_type(hint):
        return f"a tensor {getattr(hint, '__name__', hint)}"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _encode_column(values: Sequence[object] | np.ndarray, dtype: object) -> JSONData:
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


def _decode_frame(f: object, depth: int = 0) -> pd.DataFrame:
    if not isinstance(f, dict) or not all(isinstance(f.get(k), list) for k in ("columns", "dtypes", "data")) \
            or not all(isinstance(t, str) and len(t) <= 40 for t in f["dtypes"]):
        raise ThermoLensSchemaError("a stored frame lacks its columns, dtypes or data")
    cols = [_decode(c, depth) for c in f["columns"]]
    data = {}
    for c, t, v in zip(cols, f["dtypes"], f["data"]):
        vals = _decode(v, depth)
        data[c] = pd.array(vals, dtype=t) if not isinstance(vals, np.ndarray) and t != "object" else vals
    df = pd.DataFrame(data, columns=cols)
    if len(cols) != len(set(cols)):  # pragma: no cover - never produced by thermo-lens
        raise ValueError("duplicate column names in a stored frame")
    index = _decode(f.get("index"), depth)
    if not (isinstance(index, np.ndarray) and f["index_dtype"] == "int64"
            and np.array_equal(index, np.arange(len(df)))):
        df.index = pd.Index(index if isinstance(index, np.ndarray) else np.array(index, dtype=object),
                            dtype=None if f["index_dtype"] == "object" or f["index_dtype"] == "category"
                            else f["index_dtype"])
    df.index.name = f["index_name"]
    df.columns.name = f["columns_name"]
    return df


#: How a cell is labelled per named dimension: ``label(layer=3, head=1) == "L3H1"``.
DIM_LABELS: dict[str, str] = {"layer": "L", "head": "H", "kv_head": "KV", "expert": "E", "feature": "F",
                              "state": "S", "pos": "pos", "prompt": "p"}


def label(**index: int) -> str:
    """The label of one cell, its dimensions in the order given: ``label(layer=3, head=1)`` is
    ``"L3H1"`` (:data:`DIM_LABELS`; another dimension is written with its own name)."""
    return "".join(f"{DIM_LABELS.get(d, d)}{int(i)}" for d, i in index.items())


def cell_frame(dims: Sequence[str], coords: Sequence[Any]) -> pd.DataFrame:
    """One row per cell of the grid ``coords`` (one sequence of labels per dimension in ``dims``),
    in C order (the order of a ``[*dims]`` tensor's ``ravel``), a column per dimension."""
    grids = np.meshgrid(*[np.asarray(c) for c in coords], indexing="ij") if len(dims) else []
    return pd.DataFrame({d: g.ravel() for d, g in zip(dims, grids)})


class Result:
    """Mixin for frozen-dataclass results: ``to_json`` / ``from_json`` / ``save`` / ``load``, and
    the named dimensions of their values.

    **Named dimensions.** A result's values are arrays over named dimensions (``prompt``, ``layer``,
    ``head``, ``kv_head``, ``expert``, ``state``, ``feature`` ...), declared once in the registry by
    the shape of each metric it carries (``"prompt layer head"``; a result with no registered
    metric declares them in :meth:`_dim_arrays`). From them every result has :attr:`sizes`,
    ``n_<dim>s`` (``n_prompts``, ``n_layers``, ``n_heads``, ``n_kv_heads``, ``n_experts`` ...: the
    size of that dimension), :meth:`labels` (``"L3H1"``), :meth:`tidy_frame`, the frame of its
    metrics one row per cell, and :meth:`select` (``attr.select(layer=3, head=1)``), its metrics at
    chosen cells (a :class:`Selection`).
    """

    schema_version: ClassVar[int] = 1
    #: Fields renamed in a schema version: ``{version: {old name: new name}}``; results stored
    #: under an older version are read with the new names (:meth:`migrate`).
    renamed_fields: ClassVar[dict[int, dict[str, str]]] = {}

    if TYPE_CHECKING:  # read through __getattr__ from the declared dimensions (a class may store or define its own)
        @property
        def n_prompts(self) -> int: ...
        @property
        def n_layers(self) -> int: ...
        @property
        def n_heads(self) -> int: ...
        @property
        def n_kv_heads(self) -> int: ...
        @property
        def n_experts(self) -> int: ...
        @property
        def n_states(self) -> int: ...

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        registry.register_result_type(cls)

    # ------------------------------------------------------------------ named dimensions
    def _dim_arrays(self) -> list[tuple[tuple[str, ...], Any]]:
        """``(dimension names, values)`` pairs that declare this result's dimensions: the values
        of each metric registered for its class, with the metric's shape. Results without
        registered metrics (a paired difference, a sweep) override it."""
        out = []
        for m in registry.metrics(result=type(self)):
            if not m.dims:
                continue
            try:
                values = m.values(self)
            except (AttributeError, KeyError, TypeError):  # an optional value this result does not hold
                continue
            out.append((m.dims, values))
        return out

    @property
    def sizes(self) -> dict[str, int]:
        """``{dimension: size}`` of the named dimensions of this result's values (``{"prompt": 4,
        "layer": 12, "head": 12}``), in the order the declared shapes name them."""
        sizes: dict[str, int] = {}
        for dims, values in self._dim_arrays():
            shape = getattr(values, "shape", None)
            if shape is None or len(shape) != len(dims):
                continue
            for d, n in zip(dims, shape):
                sizes.setdefault(d, int(n))
        return sizes

    def __getattr__(self, name: str) -> Any:
        # ``n_<dim>s`` / ``n_<dim>``: the size of a named dimension. Only reached when normal lookup
        # fails (a class's own field or property of that name wins).
        if name.startswith("n_") and len(name) > 2 and not name.startswith("n__"):
            sizes = self.sizes
            dim = name[2:]
            for d in (dim, dim[:-1] if dim.endswith("s") else dim):
                if d in sizes:
                    return sizes[d]
            raise AttributeError(f"{type(self).__name__} has no {name!r}: its values have no {dim.rstrip('s')!r} "
                                 f"dimension (its dimensions: {', '.join(sizes) or 'none'})")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def labels(self, *dims: str) -> list[str]:
        """The labels of every cell over ``dims`` (default: the dimensions after ``prompt``), in C
        order: ``["L0H0", "L0H1", ..., "L11H11"]`` for ``("layer", "head")``."""
        sizes, dims = self._label_dims(dims, type(self).__name__)
        return [label(**dict(zip(dims, idx))) for idx in np.ndindex(*(sizes[d] for d in dims))]

    def _label_dims(self, dims: tuple[str, ...], who: str) -> tuple[dict[str, int], tuple[str, ...]]:
        """The sizes, and ``dims`` or by default every dimension after ``prompt``, each checked to be
        one of this result's dimensions (``who`` names the result in the error)."""
        sizes = self.sizes
        dims = dims or tuple(d for d in sizes if d != "prompt")
        unknown = [d for d in dims if d not in sizes]
        if unknown:
            raise ThermoLensInputError(f"{who} has no dimension(s) {unknown}; its dimensions: "
                                       f"{', '.join(sizes) or 'none'}")
        return sizes, dims

    # Each index is a DimIndex, checked here with its own messages. The signature is the gradual one
    # (arguments of any type) so that a result may narrow ``select`` to its own kind
    # (GainResult.select(prompts), PairedDifference.select(prompts, layer=...), Provenance.select(rows)).
    def select(self, *args: Any, **index: Any) -> "Result":
        """The values of this result's registered metrics at the given cells of its named
        dimensions: ``attr.select(layer=3, head=1)``, ``gain.select(layer=slice(0, 4))``,
        ``traces.select(prompt=[0, 2], head=-1)``.

        Each dimension takes an ``int`` (the dimension is dropped, negative counts from the end),
        a ``slice`` or a sequence of ints (kept, in that order). Only the metrics that have every
        selected dimension are kept (a ``[prompt]`` summary has no ``layer`` to select). Returns a
        :class:`Selection`: the kept metrics' values by name (``sel.head_term``), their remaining
        dimensions with the original indices (``sel.coords``, ``sel.labels()`` say ``"L3H1"``),
        and ``to_frame()`` with the definition columns.

        Raises:
            ThermoLensInputError: a dimension this result's values do not have (the message lists
                its dimensions and sizes), an index out of range (the message gives the range),
                an index that is not an int, slice or sequence of ints, or no metric with every
                selected dimension.
        """
        if args:
            raise ThermoLensInputError(f"{type(self).__name__}.select takes named dimensions, e.g. "
                                       f"select(layer=3, head=1); its dimensions: {', '.join(self.sizes) or 'none'}")
        return Selection.of(self, index)

    def tidy_frame(self, frame: str = "to_frame") -> pd.DataFrame:
        """The generic frame of the metrics registered with ``frame`` (their :attr:`Metric.frame`
        method) and no frame options: one row per cell of their shared shape (``prompt, layer,
        head``), a column per dimension (the 0-based index) and per metric (its values, C order),
        then :meth:`_definition_columns` (``token_scope`` where the result has one, and the
        provenance's columns: model, BOS, dtype, weights, hooks ...)."""
        chosen = [m for m in registry.metrics(result=type(self)) if m.frame == frame and not m.frame_kwargs]
        shapes = {m.dims for m in chosen}
        if len(shapes) != 1:
            raise ThermoLensInputError(f"{type(self).__name__} has no single-shape frame {frame!r} "
                                       f"(registered metrics of shapes {sorted(' '.join(s) for s in shapes)})")
        dims = shapes.pop()
        values = [(m, m.values(self)) for m in chosen]
        shape = tuple(int(n) for n in np.shape(values[0][1]))
        for m, v in values:
            if tuple(np.shape(v)) != shape or len(shape) != len(dims):
                raise ThermoLensInputError(f"{type(self).__name__}.{m.name} has shape {tuple(np.shape(v))}, not "
                                           f"[{' '.join(dims)}] {shape}")
        df = cell_frame(dims, [np.arange(n) for n in shape])
        for m, v in values:
            df[m.frame_column] = (v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)).reshape(-1)
        return self._definition_columns(df)

    def _definition_columns(self, df: pd.DataFrame) -> pd.DataFrame:
        """``df`` with the columns that define its numbers: ``token_scope`` (where this result has
        one) and the provenance's (model, BOS, dtype, weights, hooks ...)."""
        scope = getattr(self, "token_scope", None)
        if isinstance(scope, str):
            df["token_scope"] = scope
        provenance = getattr(self, "provenance", None)
        if provenance is not None:
            for k, v in provenance.columns().items():
                df[k] = v
        return df

    def _stored_problem(self) -> str | None:
        """Why this result, just read back from JSON, is inconsistent (sizes that disagree between
        fields, a value out of its range), or ``None``. Subclasses with such invariants override
        it; :meth:`from_json` turns an answer into a :class:`ThermoLensSchemaError`."""
        return None

    def plot(self, **kwargs: object) -> Figure:
        """This result's figure (a plotly ``Figure``): the view registered for its class
        (:func:`register_plot`), else its first registered metric drawn from its shape
        (:func:`thermo_lens.views.metric_plot`). ``kwargs`` go to the view."""
        import importlib

        name = type(self).__name__
        if name not in _PLOTS:
            importlib.import_module(_FIGURES_MODULE)  # views register their figures on import
        if name in _PLOTS:
            return _PLOTS[name](self, **kwargs)
        drawn = registry.metrics(result=type(self))
        if not drawn:
            raise ThermoLensInputError(f"{name} has no figure and no registered metric to draw")
        return _PLOTS["__metric__"](self, drawn[0].name, **kwargs)

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
        text = json.dumps({"thermo_lens_schema": self.schema_version, **_encode_result(self)}, indent=indent)
        if path is not None:
            from thermo_lens.core.safe_io import atomic_write_text

            atomic_write_text(path, text)  # atomic; replaces a symlink instead of writing through it
        return text

    @classmethod
    def from_json(cls: type[R], text_or_path: str | os.PathLike) -> R:
        """Rebuild a result from :meth:`to_json` output (a JSON string or a file path).

        Raises:
            ThermoLensSchemaError: not JSON, not a stored result, damaged data, an unknown dtype,
                nested too deeply, or written by a newer schema.
            ThermoLensInputError: an empty string; a file that cannot be read or is larger than
                :data:`MAX_JSON_BYTES` (:class:`~thermo_lens.core.errors.SafeIOError`).
            ThermoLensInputTypeError: not a str or path, or a stored result of another class.
        """
        text, where = _json_text(text_or_path)
        try:
            data = json.loads(text)
        except RecursionError:
            raise ThermoLensSchemaError(f"{where} is nested too deeply to be a thermo-lens result") from None
        except json.JSONDecodeError as e:
            raise ThermoLensSchemaError(f"{where} is not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
        if not isinstance(data, dict) or "__result__" not in data:
            kind = "an object without '__result__'" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
            raise ThermoLensSchemaError(f"{where} holds {kind}, not a stored thermo-lens result (Result.to_json())")
        data.pop("thermo_lens_schema", None)
        try:
            obj = decode(data)
        except ThermoLensError:
            raise
        except RecursionError:
            raise ThermoLensSchemaError(f"{where} is nested too deeply to be a thermo-lens result") from None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RuntimeError) as e:
            raise ThermoLensSchemaError(f"{where} is damaged or was not written by thermo-lens "
                                        f"({type(e).__name__}: {_excerpt(str(e))})") from None
        if not isinstance(obj, cls):
            raise ThermoLensInputTypeError(
                f"{where} holds a {type(obj).__name__}, not a {cls.__name__}; read it with "
                f"{type(obj).__name__}.from_json (thermo_lens.{type(obj).__name__})")
        return obj


#: What :meth:`Result.select` takes per dimension: one index (the dimension is dropped), a slice or
#: a sequence of indices (kept).
DimIndex = int | slice | Sequence[int]


def _positions(result: str, dim: str, size: int, sel: object) -> int | list[int]:
    """The 0-based positions ``sel`` picks along ``dim`` of ``size`` (an int for a single index)."""
    def one(i: object) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ThermoLensInputError(f"{result}.select({dim}=...): {i!r} is not an index; give an int, a slice "
                                       f"or a list of ints in 0..{size - 1} (negative counts from the end)")
        if not -size <= int(i) < size:
            raise ThermoLensInputError(f"{result}.select: {dim} {int(i)} is out of range: {result} has {dim} "
                                       f"0..{size - 1} (negative counts from the end)")
        return int(i) % size

    if isinstance(sel, slice):
        picked = list(range(size))[sel]
    elif isinstance(sel, (int, np.integer)) and not isinstance(sel, bool):
        return one(sel)
    elif isinstance(sel, (list, tuple, range, np.ndarray, torch.Tensor)):
        picked = [one(i.item() if hasattr(i, "item") else i) for i in sel]
    else:
        picked = [one(sel)]  # raises: not an index
    if not picked:
        raise ThermoLensInputError(f"{result}.select({dim}={sel!r}) picks no {dim} of 0..{size - 1}")
    return picked


def _take(values: ArrayLike, axis: int, at: int | list[int]) -> ArrayLike:
    """``values`` at positions ``at`` of ``axis`` (one axis at a time: lists on two axes would pair up)."""
    if isinstance(values, torch.Tensor):
        return values.select(axis, at) if isinstance(at, int) else values.index_select(axis, torch.as_tensor(at))
    arr = np.asarray(values)
    return np.take(arr, at, axis=axis)


@dataclasses.dataclass(frozen=True)
class Selection(Result):
    """The values of a result's metrics at chosen cells of its named dimensions
    (:meth:`Result.select`).

    Attributes:
        source: the class of the result it was selected from (``"GainAttribution"``).
        index: what was selected, per dimension: the kept original indices (a tuple), or the one
            index of a dimension that was dropped.
        values: metric name -> its values at the selection (tensor or array), also read as
            attributes (``sel.head_term``).
        dims: metric name -> the dimensions its values still have.
        frames: metric name -> the frame it belongs to in the source (its :attr:`Metric.frame`).
        coords: dimension -> the original index of each position along it (``layer=(0, 1, 2, 3)``).
        columns: the definition columns of the source's frames (``token_scope``, model, BOS,
            dtype, weights, hooks ...), repeated on every row of :meth:`to_frame`.
    """

    source: str
    index: dict[str, tuple[int, ...] | int]
    values: dict[str, ArrayLike]
    dims: dict[str, tuple[str, ...]]
    frames: dict[str, str]
    coords: dict[str, tuple[int, ...]]
    columns: dict[str, object] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, result: Result, index: Mapping[str, object]) -> "Selection":
        name = type(result).__name__
        sizes = result.sizes
        unknown = [d for d in index if d not in sizes]
        if unknown:
            have = ", ".join(f"{d} (0..{n - 1})" for d, n in sizes.items()) or "none"
            raise ThermoLensInputError(f"{name} has no dimension {', '.join(map(repr, unknown))} to select; "
                                       f"its dimensions: {have}")
        at = {d: _positions(name, d, sizes[d], sel) for d, sel in index.items()}
        values: dict[str, ArrayLike] = {}
        dims: dict[str, tuple[str, ...]] = {}
        frames: dict[str, str] = {}
        coords: dict[str, tuple[int, ...]] = {}
        for m in registry.metrics(result=type(result)):
            if not set(at) <= set(m.dims):
                continue
            try:
                v = m.values(result)
            except (AttributeError, KeyError, TypeError):  # an optional value this result does not hold
                continue
            if len(np.shape(v)) != len(m.dims):
                continue
            kept = list(m.dims)
            for axis in reversed(range(len(m.dims))):  # from the last axis: earlier axes keep their number
                d = m.dims[axis]
                if d in at:
                    v = _take(v, axis, at[d])
                    if isinstance(at[d], int):
                        kept.pop(axis)
            values[m.name], dims[m.name], frames[m.name] = v, tuple(kept), m.frame
            for d in kept:
                picked = at.get(d)
                coords[d] = tuple(picked) if isinstance(picked, list) else tuple(range(sizes[d]))
        if not values:
            raise ThermoLensInputError(f"no metric of {name} has every dimension of {sorted(at)}; its metrics' "
                                       "dimensions: " + ", ".join(sorted({" ".join(m.dims) for m in
                                                                         registry.metrics(result=type(result))})))
        columns = dict(result._definition_columns(pd.DataFrame(index=[0])).iloc[0])
        return cls(source=name, index={d: a if isinstance(a, int) else tuple(a) for d, a in at.items()},
                   values=values, dims=dims, frames=frames, coords=coords, columns=columns)

    def __repr__(self) -> str:
        # What a notebook cell shows: where the selection is, each metric's values with the dimensions
        # they still have, and the definitions the numbers carry (token scope, BOS, dtype, weights, hooks).
        at = ", ".join(f"{d}={list(i) if isinstance(i, tuple) else i}" for d, i in self.index.items())
        lines = [f"Selection of {self.source} at {at}"]
        for name, v in self.values.items():
            arr = np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v, dtype=float)
            text = np.array2string(arr, precision=4, threshold=12, edgeitems=3, separator=", ")
            dims = f" [{' '.join(self.dims[name])}]" if self.dims[name] else ""
            lines.append(f"  {name}{dims}: " + text.replace("\n", "\n    "))
        if self.columns:
            lines.append("  definitions: " + ", ".join(f"{k}={v}" for k, v in self.columns.items() if v != ""))
        return "\n".join(lines)

    def _dim_arrays(self) -> list[tuple[tuple[str, ...], Any]]:
        return [(self.dims[k], v) for k, v in self.values.items()]

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values")
        if isinstance(values, dict) and name in values:
            return values[name]
        return super().__getattr__(name)

    def labels(self, *dims: str) -> list[str]:
        """The labels of every cell over ``dims`` (default: the dimensions after ``prompt``) with
        their original indices: ``select(layer=[3], head=[0, 2])`` is labelled ``["L3H0", "L3H2"]``;
        a dimension dropped by an int index (``layer=3``) is not a dimension any more, so
        ``select(layer=3, head=[0, 2])`` is labelled ``["H0", "H2"]``."""
        sizes, dims = self._label_dims(dims, "this selection")
        return [label(**{d: self.coords[d][i] for d, i in zip(dims, idx)})
                for idx in np.ndindex(*(sizes[d] for d in dims))]

    def to_frame(self, frame: str = "to_frame") -> pd.DataFrame:
        """One row per cell of the kept metrics of the source's frame ``frame`` (default: its
        main frame; ``"layer_frame"``, ``"prompt_frame"`` ... as the metrics declare): a column
        per dimension with the original indices (a dropped dimension's one index on every row),
        a column per metric (a metric over fewer dimensions repeats along the others), then the
        definition columns."""
        chosen = [k for k, f in self.frames.items() if f == frame]
        if not chosen:
            raise ThermoLensInputError(f"this selection of {self.source} holds no metric of its frame {frame!r}; "
                                       f"its frames: {', '.join(dict.fromkeys(self.frames.values()))}")
        widest = max((self.dims[k] for k in chosen), key=len)
        stray = [k for k in chosen if not set(self.dims[k]) <= set(widest)]
        if stray:
            raise ThermoLensInputError(f"the metrics {stray} of {self.source}'s {frame!r} do not share dimensions "
                                       f"with {list(widest)}; select a frame of one shape")
        df = cell_frame(widest, [np.asarray(self.coords[d]) for d in widest])
        for i, (d, at) in enumerate((d, at) for d, at in self.index.items() if isinstance(at, int)):
            df.insert(i, d, at)  # a dropped dimension: its one index, first, so the row says where it is
        grid = np.meshgrid(*[np.arange(len(self.coords[d])) for d in widest], indexing="ij") if widest else []
        for k in chosen:
            v = self.values[k]
            arr = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
            pos = tuple(g.ravel() for d, g in zip(widest, grid) if d in self.dims[k])
            df[k] = arr[pos] if pos else np.broadcast_to(arr, (len(df),))
        for c, const in self.columns.items():
            df[c] = const
        return df


def _json_text(text_or_path: object) -> tuple[str, str]:
    """``(JSON text, how to name it in errors)`` of :meth:`Result.from_json`'s argument: text that
    starts with ``{`` or ``[`` is JSON, any other string or path names a file."""
    from thermo_lens.core.safe_io import printable, safe_read_text

    if isinstance(text_or_path, str):
        if text_or_path.lstrip().startswith(("{", "[")):
            if len(text_or_path) > MAX_JSON_BYTES:
                raise ThermoLensInputError(f"the JSON text is longer than {MAX_JSON_BYTES:,} characters")
            return text_or_path, "the JSON text"
        if not text_or_path.strip():
            raise ThermoLensInputError("from_json got an empty string: pass the JSON text of a stored result "
                                       "(Result.to_json()) or the path of its file")
    elif not isinstance(text_or_path, os.PathLike):
        raise ThermoLensInputTypeError(f"from_json takes JSON text or a file path, got {type(text_or_path).__name__}")
    path = os.fspath(text_or_path)
    if not isinstance(path, str):
        raise ThermoLensInputTypeError(f"from_json takes a text path, got {type(path).__name__}")
    return safe_read_text(path, MAX_JSON_BYTES, what="result file"), printable(path)
