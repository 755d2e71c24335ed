"""One argument validation layer for the API, the study spec and the CLI.

Each validator takes the option's name and value, returns the value (normalised where a
normalisation is harmless, e.g. ``"cuda" -> "cuda"``, ``torch.float16 -> "float16"``), and raises
:class:`~thermo_lens.core.model.ThermoLensInputError` saying what was wrong and what to pass. Types are
checked strictly: ``truncate="no"`` is an error, not ``True``; ``batch_size=True`` is not ``1``.

The same functions run in :func:`thermo_lens.measures.profile`, :func:`thermo_lens.residual_gain`,
:func:`thermo_lens.spectral_signature`, ``ModelSpec`` / ``StudySpec`` (hence every spec file and
every CLI command) *before* any model is loaded, so a bad option never costs a model load.

Values quoted in messages are cut to :data:`EXCERPT` characters, so a hostile or huge value
cannot flood a terminal or a log.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from typing import Any, Callable, Sequence, TypeVar

from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.tokens import TOKEN_SCOPES, BosMode, check_bos, check_token_scope

__all__ = [
    "validates_own_inputs",
    "EXCERPT",
    "excerpt",
    "boolean",
    "positive_int",
    "optional_positive_int",
    "non_negative_number",
    "confidence_level",
    "text",
    "optional_text",
    "prepend_bos",
    "token_scope",
    "dtype",
    "device",
    "device_map",
    "fwd_hooks",
    "model_name",
    "looks_like_path",
    "slug",
    "file_id",
    "RESERVED_IDS",
    "DTYPES",
]

_F = TypeVar("_F")


def validates_own_inputs(obj: _F) -> _F:
    """Mark a public entry point (function or class) that checks its own inputs with the
    validators here, so that a bad value gets thermo-lens' specific message.

    Its annotations (``Literal`` token scopes and BOS modes, :data:`thermo_lens.core.inputs.Prompts`,
    :class:`thermo_lens.core.settings.RunOptions`) are for editors and type checkers; a runtime type
    checker (jaxtyping's import hook with beartype, as the test suite installs) leaves the entry
    point alone (``__no_type_check__``), so the tests exercise the messages users see.
    """
    obj.__no_type_check__ = True  # type: ignore[attr-defined]  # read by jaxtyping and typing tools
    return obj


EXCERPT = 80
# float64 works end to end: reductions run in float64 and are stored as float32 like the others.
DTYPES = ("float32", "float16", "bfloat16", "float64", "auto")
# Names a model id may not take: they are files of the output folder (case-insensitively, with
# any extension) or device names on Windows.
RESERVED_IDS = frozenset({
    "manifest", "summary", "report", "thermo-lens-report", "lock",
    "con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10)),
})
_MAX_ID = 200


def excerpt(value: object, limit: int = EXCERPT) -> str:
    """``repr(value)`` cut to ``limit`` characters (with the full length when cut); containers are
    shown a few items deep (:mod:`reprlib`), so a huge or self-referencing value costs nothing."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxlist, short.maxtuple, short.maxdict, short.maxset = 3, 6, 6, 6, 6
    short.maxstring, short.maxother = limit + 2, limit
    try:
        r = short.repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    except Exception:  # noqa: BLE001 - a hostile __repr__
        r = f"<{type(value).__name__}>"
    if len(r) > limit:
        size = f", {len(value)} characters" if isinstance(value, str) else ""
        r = r[:limit] + f"...(cut{size})"
    return r


def _fail(name: str, value: object, expected: str) -> ThermoLensInputError:
    return ThermoLensInputError(f"{name} must be {expected}, got {type(value).__name__} {excerpt(value)}")


def boolean(name: str, value: object) -> bool:
    """``True`` or ``False`` (numpy bools too); no truthy strings or numbers."""
    if isinstance(value, bool):
        return value
    import numpy as np

    if isinstance(value, np.bool_):
        return bool(value)
    raise _fail(name, value, "True or False")


def positive_int(name: str, value: object, *, maximum: int | None = None) -> int:
    """An ``int`` >= 1 (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise _fail(name, value, "a positive integer (1, 2, ...)")
    if maximum is not None and int(value) > maximum:
        raise ThermoLensInputError(f"{name} must be at most {maximum}, got {int(value)}")
    return int(value)


def optional_positive_int(name: str, value: object, *, maximum: int | None = None) -> int | None:
    return None if value is None else positive_int(name, value, maximum=maximum)


def non_negative_number(name: str, value: object) -> float | int:
    """A finite real number >= 0 (not a bool, not NaN)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) \
            or float(value) < 0:
        raise _fail(name, value, "a finite number >= 0")
    return value if isinstance(value, int) else float(value)


def confidence_level(name: str, value: object) -> float:
    """A real number strictly between 0 and 1 (not a bool, not NaN), as a ``float``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < 1:
        raise ThermoLensInputError(f"{name} must be a confidence level in (0, 1), got {excerpt(value)}")
    return float(value)


def text(name: str, value: object, *, max_len: int = 1000) -> str:
    """A non-empty ``str`` of at most ``max_len`` characters without NUL."""
    if not isinstance(value, str) or not value.strip():
        raise _fail(name, value, "a non-empty string")
    if len(value) > max_len:
        raise ThermoLensInputError(f"{name} is {len(value)} characters long; at most {max_len} please")
    if "\x00" in value:
        raise ThermoLensInputError(f"{name} contains a NUL character: {excerpt(value)}")
    return value


def optional_text(name: str, value: object, *, max_len: int = 1000) -> str | None:
    return None if value is None else text(name, value, max_len=max_len)


def prepend_bos(value: object, name: str = "prepend_bos") -> BosMode:
    """One of :data:`~thermo_lens.core.tokens.BOS_MODES` (:func:`thermo_lens.core.tokens.check_bos`):
    ``"host"`` (exactly what the host's ``model.to_tokens`` does), ``True``, ``False`` or ``"tokenizer"``."""
    return check_bos(value, name)


def token_scope(value: object, name: str = "token_scope") -> str:
    """One of :data:`TOKEN_SCOPES` (:func:`thermo_lens.core.tokens.check_token_scope`)."""
    return check_token_scope(value, TOKEN_SCOPES, name=name)


def dtype(value: object, name: str = "dtype") -> str | None:
    """A dtype name from :data:`DTYPES` (a ``torch.dtype`` is named); None means the default."""
    if value is None:
        return None
    v = str(value).replace("torch.", "") if type(value).__name__ == "dtype" else value
    if isinstance(v, str) and v in DTYPES:
        return v
    raise _fail(name, value, "one of " + ", ".join(DTYPES))


def device(value: object, name: str = "device", *, here: bool = True) -> str | None:
    """A torch device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``; with ``here=True`` (default)
    it must also exist on this machine (``here=False`` for a spec that may run on Ray workers)."""
    if value is None:
        return None
    import torch

    if isinstance(value, torch.device):
        dev, shown = value, str(value)
    elif isinstance(value, str) and value.strip() and len(value) <= 64:
        try:
            dev = torch.device(value)
        except (RuntimeError, ValueError):
            raise _fail(name, value, 'a torch device such as "cpu", "cuda" or "cuda:0"') from None
        shown = value
    else:
        raise _fail(name, value, 'a torch device such as "cpu", "cuda" or "cuda:0"')
    if dev.type == "cpu":
        return shown
    if dev.type not in ("cuda", "mps"):
        raise ThermoLensInputError(f"{name}={excerpt(shown)}: only cpu, cuda and mps devices are supported")
    if not here:
        return shown
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ThermoLensInputError(f"{name}={excerpt(shown)}: no CUDA device is available here; use \"cpu\"")
        if dev.index is not None and dev.index >= n:
            raise ThermoLensInputError(
                f"{name}={excerpt(shown)}: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}")
        return shown
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ThermoLensInputError(f"{name}={excerpt(shown)}: MPS is not available here; use \"cpu\"")
        return shown
    raise ThermoLensInputError(f"{name}={excerpt(shown)}: only cpu, cuda and mps devices are supported")


def device_map(value: object, name: str = "device_map", *, here: bool = True) -> str | dict[str, int | str] | None:
    """``"auto"``/``"balanced"``/... or a small ``{module: device}`` mapping (accelerate's form)."""
    if value is None:
        return None
    if isinstance(value, str):
        if value in ("auto", "balanced", "balanced_low_0", "sequential"):
            return value
        return device(value, name, here=here)
    if isinstance(value, dict):
        if len(value) > 10_000:
            raise ThermoLensInputError(f"{name} has {len(value)} entries; at most 10000")
        for k, v in value.items():
            if not isinstance(k, str) or len(k) > 500:
                raise _fail(f"{name} key", k, "a module name (str)")
            if isinstance(v, bool) or not isinstance(v, (int, str)) or isinstance(v, int) and v < 0 \
                    or isinstance(v, str) and len(v) > 64:
                raise _fail(f"{name}[{excerpt(k, 40)}]", v, 'a GPU index, "cpu" or "disk"')
            # A GPU entry must name a GPU this machine has, before any weights are read.
            if isinstance(v, int):
                device(f"cuda:{v}", f"{name}[{excerpt(k, 40)}]", here=here)
            elif v not in ("cpu", "disk", "meta"):
                device(v, f"{name}[{excerpt(k, 40)}]", here=here)
        return value
    raise _fail(name, value, '"auto" or a {module: device} table')


def fwd_hooks(value: object, name: str = "fwd_hooks") -> list[tuple[Any, Callable]]:
    """A list of ``(hook_name_or_filter, fn)`` pairs, as ``run_with_hooks`` takes."""
    if value is None:
        raise ThermoLensInputError(f"{name} must be a list of (hook_name, fn) pairs; for none, pass [] or leave it out")
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Sequence) and not hasattr(value, "__iter__"):
        raise _fail(name, value, "a list of (hook_name, fn) pairs")
    out = []
    for i, pair in enumerate(value):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            hint = " (a single pair: wrap it in a list, [(hook_name, fn)])" if isinstance(pair, str) else ""
            raise _fail(f"{name}[{i}]", pair, "a (hook_name, fn) pair" + hint)
        hook_name, fn = pair
        if not (isinstance(hook_name, str) or callable(hook_name)):
            raise _fail(f"{name}[{i}] hook name", hook_name, "a hook name such as 'blocks.0.hook_resid_post' or a name filter")
        if not callable(fn):
            raise _fail(f"{name}[{i}] function", fn, "a function fn(activation, hook)")
        out.append((hook_name, fn))
    return out


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def looks_like_path(name: str) -> bool:
    """A model name that can only be a local folder: absolute, ``~``, ``./``, ``../`` or deeper than
    a hub ``org/name``."""
    return (os.path.isabs(name) or name.startswith(("~", "./", "../", ".\\")) or name in (".", "..")
            or name.count("/") > 1 or "\\" in name)


def model_name(value: object, name: str = "name", *, hub_id: bool = True) -> str:
    """A hub id (``org/name``), an existing local checkpoint folder or a zoo name.

    A name that can only be a path (see :func:`looks_like_path`) must exist, so a typo gives
    "no such folder" here rather than a hub error after a network round trip. ``hub_id=False``
    skips the hub-id spelling check (for a ``ModelSpec`` whose name a custom loader interprets).
    """
    value = text(name, value, max_len=4096)
    if os.path.exists(os.path.expanduser(value)):
        return value
    if looks_like_path(value):
        raise ThermoLensInputError(f"{name}={excerpt(value)}: no such local checkpoint folder")
    if hub_id and (not _HUB_ID.match(value) or len(value) > 200):
        raise ThermoLensInputError(
            f"{name}={excerpt(value)} is neither an existing local folder, an embedded model "
            "(thermo-lens zoo) nor a hub id like 'org/model'")
    return value


def slug(value: str) -> str:
    """A file-safe id: ``[A-Za-z0-9._+=-]`` (``lr=0.001+wd=0.1__seed0`` is one), not starting with
    ``.`` (hidden), ``-`` (an option), ``+`` or ``=`` (a spreadsheet formula), not ending with
    ``.``, at most 200 characters, and not a reserved name (``manifest``, ``report``, ...)."""
    s = re.sub(r"[^A-Za-z0-9._+=-]+", "_", value)
    s = s.lstrip(".+=-")[:_MAX_ID].rstrip(".")
    s = s or "model"
    first, dot, rest = s.partition(".")
    if first.lower() in RESERVED_IDS:
        s = f"{first}-model{dot}{rest}"
    return s


def file_id(value: object, name: str = "id") -> str:
    """A model id given by the user: it names ``<id>.json`` in the output folder, so it must
    already be a slug (:func:`slug`) and not a reserved name."""
    value = text(name, value, max_len=_MAX_ID)
    if slug(value) != value:
        raise ThermoLensInputError(
            f"{name}={excerpt(value)} cannot name a result file: use letters, digits and . _ - + = "
            f"(not . - + = first), at most {_MAX_ID} characters, not one of "
            f"manifest/summary/report/lock; e.g. {slug(value)!r}")
    return value
