"""Many-model studies: a spec file in, one directory of per-model profiles and a manifest out.

A study spec (TOML, or YAML where PyYAML is installed) lists models and the measurement
settings::

    [study]
    name = "heritage"
    prompts = "paper25"          # a built-in prompt set (thermo_lens.prompts) or a list
    prepend_bos = "host"         # "host" (as model.to_tokens) / true / false / "tokenizer"
    token_scope = "all_but_first"
    batch_size = 8

    [[models]]
    name = "EleutherAI/pythia-160m"   # hub name, local checkpoint directory, or zoo name
    lab = "EleutherAI"
    family = "Pythia"
    dtype = "float16"                 # optional
    device_map = "auto"               # optional, for models larger than one device
    num_gpus = 1                      # optional, what a Ray task asks for

    [[models]]
    zoo = "gpt2-tiny-wd"              # an embedded model (thermo_lens.zoo)
    lab = "thermo-lens zoo"
    twin_of = "gpt2-tiny-nowd"        # optional: base model of a fine-tuned/twin pair

Running a study (:func:`run_study`, or ``thermo-lens study SPEC --out DIR``):

* each model's :class:`~thermo_lens.profile.ThermoProfile` is written to ``DIR/<id>.json``
  atomically (a temporary file in ``DIR`` + rename, never through a symlink:
  :mod:`thermo_lens.safe_io`) as soon as it is done, and ``DIR/manifest.json`` records every
  model's status (``done`` with the file's SHA-256, or ``failed`` with its error);
* an ``id`` names a file, so it is a slug (letters, digits, ``. _ - + =``) and never a
  reserved name (``manifest``, ``summary``, ``report``, ``lock``); ids derived from names are
  slugged, and in ``thermo-lens profile a/tiny b/tiny`` made unique (``tiny``, ``tiny-2``);
* the manifest is the source of truth for the current spec: models no longer in the spec keep
  their files but are marked ``stale`` and left out of summaries and reports;
* rerunning resumes: a model is skipped only when the manifest says done *and* its file is
  ``<id>.json``, matches the recorded SHA-256, names the same model and has the same settings; a
  missing, corrupt or edited file is detected and recomputed, never silently used;
* a failing model (load error, unknown name, OOM, NaN) is recorded and the study goes on;
* every option is validated (:mod:`thermo_lens.validate`) when the spec is read, before any
  model is loaded; spec files are read with limits (1 MiB, 32 levels, 200,000 values with YAML aliases
  expanded);
* one run at a time per directory: a second concurrent run is refused (an exclusive lock on
  ``DIR/.lock``, removed when the run ends; temporary files of a killed run are removed by the
  next one);
* executors: ``"local"`` (in this process, one model after another) and ``"ray"`` (one model
  per Ray task, each asking for its ``num_gpus``; ``ray.init()`` locally or
  ``ray.init(address=...)`` on a cluster). Results are written only by the driver.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, no_type_check

from thermo_lens import validate as V
from thermo_lens.errors import ThermoLensInputError
from thermo_lens.safe_io import (
    FolderLock,
    FolderLockedError,
    SafeIOError,
    atomic_write_bytes,
    remove_stale_temps,
    safe_read_bytes,
    safe_read_text,
)

__all__ = [
    "ModelSpec",
    "StudySpec",
    "StudySpecError",
    "StudyLockedError",
    "StudyManifestError",
    "StudyOutcome",
    "StudyContents",
    "load_spec",
    "run_study",
    "read_manifest",
    "load_profiles",
    "read_study",
]

MANIFEST = "manifest.json"
_SETTINGS_KEYS = ("prompts", "prepend_bos", "token_scope", "batch_size", "truncate")
# Parsing limits: a spec is a short hand-written file; anything beyond these is a mistake or an attack.
MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_DEPTH = 32
MAX_SPEC_NODES = 200_000
MAX_SPEC_ALIASES = 1_000
MAX_MANIFEST_BYTES = 64 << 20
MAX_RESULT_BYTES = 4 << 30
_MAX_ERROR = 600  # characters of a spec error message


class StudySpecError(ThermoLensInputError):
    """A malformed study spec; the message names the file, the line and the field."""


class StudyLockedError(FolderLockedError):
    """Another run holds the study directory."""


class StudyManifestError(ThermoLensInputError):
    """The study folder's manifest is unreadable, corrupt or not a thermo-lens manifest."""


@dataclass(frozen=True)
class ModelSpec:
    """One model of a study. Exactly one of ``name`` (hub name, local directory or zoo name) and
    ``zoo``; a ``name`` that is an embedded model's name (and no local path) means that zoo model.

    ``id`` names the result file ``<id>.json``: letters, digits, ``. _ - + =``, not a
    reserved name (``manifest``, ``summary``, ``report``, ``lock``). Every field is validated on
    construction (:mod:`thermo_lens.validate`), before any model is loaded.
    """

    id: str
    name: Any = None
    zoo: Any = None
    lab: Any = None
    family: Any = None
    twin_of: Any = None
    dtype: Any = None
    device: Any = None
    device_map: Any = None
    num_gpus: Any = 0
    threads: Any = None
    trust_remote_code: Any = False

    def __post_init__(self) -> None:
        V.file_id(self.id, "id")
        if (self.name is None) == (self.zoo is None):
            raise ThermoLensInputError(
                f"model {self.id!r}: give exactly one of name (hub name or local path) and zoo (embedded model)")
        from thermo_lens import zoo

        if self.name is not None:
            V.text("name", self.name, max_len=4096)
            if self.name in zoo.names() and not os.path.exists(self.name):
                object.__setattr__(self, "zoo", self.name)  # a zoo name given as name
                object.__setattr__(self, "name", None)
            else:
                V.model_name(self.name, "name", hub_id=False)
        if self.zoo is not None:
            V.text("zoo", self.zoo, max_len=200)
            if self.zoo not in zoo.names():
                raise ThermoLensInputError(
                    f"zoo={V.excerpt(self.zoo)}: unknown embedded model; available: {', '.join(zoo.names())}")
        for f in ("lab", "family", "twin_of"):
            V.optional_text(f, getattr(self, f))
        V.dtype(self.dtype)
        V.device(self.device, here=False)  # a Ray worker may have devices the driver lacks;
        V.device_map(self.device_map, here=False)  # run_study checks them here for "local"
        V.non_negative_number("num_gpus", self.num_gpus)
        V.optional_positive_int("threads", self.threads, maximum=4096)
        V.boolean("trust_remote_code", self.trust_remote_code)

    @property
    def source(self) -> str:
        return f"zoo:{self.zoo}" if self.zoo else str(self.name)


@dataclass(frozen=True)
class StudySpec:
    """A parsed study spec (see the module docstring for the file format); validated on construction."""

    name: Any
    models: tuple[ModelSpec, ...]
    prompts: Any = "paper25"
    prepend_bos: Any = "host"
    token_scope: Any = "all_but_first"
    batch_size: Any = 8
    truncate: Any = False
    path: str | None = None

    def __post_init__(self) -> None:
        V.text("study name", self.name, max_len=200)
        if not isinstance(self.models, tuple) or not self.models:
            raise ThermoLensInputError("a study needs a non-empty tuple of ModelSpec")
        seen: dict[str, str] = {}
        for m in self.models:
            if not isinstance(m, ModelSpec):
                raise ThermoLensInputError(f"study models must be ModelSpec, got {type(m).__name__}")
            if m.id.lower() in seen:
                raise ThermoLensInputError(
                    f"duplicate model id {m.id!r} (ids name files and must differ, ignoring case); "
                    "give each model a distinct id")
            seen[m.id.lower()] = m.id
        _check_prompts(self.prompts)
        V.prepend_bos(self.prepend_bos)
        V.token_scope(self.token_scope)
        V.positive_int("batch_size", self.batch_size, maximum=1 << 16)
        V.boolean("truncate", self.truncate)

    def settings(self) -> dict[str, Any]:
        """The measurement settings every profile of this study shares."""
        return {k: getattr(self, k) for k in _SETTINGS_KEYS}

    @classmethod
    def from_models(cls, models: Iterable[str | ModelSpec], *, name: str = "profile", **settings: Any) -> "StudySpec":
        """A spec from model names for the CLI's ``profile`` command: zoo names are recognised,
        ids are slugs of the names made unique (``a/tiny b/tiny`` -> ``tiny``, ``tiny-2``).

        For per-model options (dtype, device), build each with :func:`model_from_name`.
        """
        specs: list[ModelSpec] = []
        seen: set[str] = set()
        for m in models:
            spec = m if isinstance(m, ModelSpec) else model_from_name(m, seen)
            seen.add(spec.id.lower())
            specs.append(spec)
        if not specs:
            raise StudySpecError("no models given")
        return cls(name=name, models=tuple(specs), **settings)


def _check_prompts(prompts: Any) -> None:
    from thermo_lens import prompts as prompt_sets

    try:
        prompt_sets.as_prompt_set(prompts)
    except (KeyError, TypeError, ValueError) as e:
        msg = str(e.args[0] if isinstance(e, KeyError) and e.args else e)
        raise ThermoLensInputError(f"prompts: {msg[:_MAX_ERROR]}") from None


def default_id(name: str) -> str:
    """The id a model gets from its name: a local folder's own name, or the hub name with
    '/' -> '_', as a file-safe slug (:func:`thermo_lens.validate.slug`)."""
    if V.looks_like_path(name) or os.path.exists(name):
        name = Path(name).expanduser().name or name
    return V.slug(name.strip("/"))


_slug = default_id  # the old private name


def _unique_id(base: str, seen: set[str]) -> str:
    out, k = base, 2
    while out.lower() in seen:
        out, k = f"{base}-{k}", k + 1
    return out


def model_from_name(name: Any, seen: Iterable[str] = (), **options: Any) -> ModelSpec:
    """A :class:`ModelSpec` for a model name (zoo name, local folder or hub id) with an id unique
    among ``seen`` (lower-case ids); ``options`` are further ``ModelSpec`` fields."""
    from thermo_lens import zoo

    V.text("model", name, max_len=4096)
    if name in zoo.names() and not os.path.exists(name):
        extra = {"lab": "thermo-lens zoo", "family": zoo.info(name).get("family")}
        return ModelSpec(id=_unique_id(V.slug(name), set(seen)), zoo=name, **{**extra, **options})
    return ModelSpec(id=_unique_id(default_id(name), set(seen)), name=V.model_name(name, "model"), **options)


# ---------------------------------------------------------------------------- spec parsing
_MODEL_FIELDS: dict[str, Any] = {
    "name": str, "zoo": str, "id": str, "lab": str, "family": str, "twin_of": str, "base": str,
    "dtype": str, "device": str, "device_map": (str, dict), "num_gpus": (int, float),
    "threads": int, "trust_remote_code": bool,
}
_STUDY_FIELDS: dict[str, Any] = {
    "name": str, "prompts": (str, list, dict), "prepend_bos": (bool, str), "token_scope": str,
    "batch_size": int, "truncate": bool,
}
_DTYPES = set(V.DTYPES)


def _line_of(text: str, pattern: str, start: int = 0) -> int:
    """1-based line of the first line at or after ``start`` (0-based) matching ``pattern``."""
    lines = text.splitlines()
    rx = re.compile(pattern)
    for i in range(start, len(lines)):
        if rx.search(lines[i]):
            return i + 1
    return start + 1 if lines else 1


def _table_starts(text: str, header: str) -> list[int]:
    rx = re.compile(r"^\s*\[\[\s*" + re.escape(header) + r"\s*\]\]")
    return [i for i, line in enumerate(text.splitlines()) if rx.search(line)]


def _yaml_loader() -> type:
    """PyYAML's SafeLoader with bounded nesting and a bounded number of aliases.

    Anchors and aliases (``&defaults`` / ``<<: *defaults``) are fine: the loader shares the aliased
    object instead of copying it. What could explode is anything that later walks the data as a
    tree (a billion-laughs spec is 1.5 KB and 10^9 values expanded), so :func:`_check_shape` walks
    it once, iteratively, and stops at :data:`MAX_SPEC_NODES` values or :data:`MAX_SPEC_DEPTH`
    levels (a self-referencing alias is infinitely deep) before anything else touches it.
    """
    import yaml

    class Loader(yaml.SafeLoader):
        depth = 0
        aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_SPEC_ALIASES:
                    raise yaml.composer.ComposerError(
                        None, None, f"more than {MAX_SPEC_ALIASES} YAML aliases (*name)", self.peek_event().start_mark)
            self.depth += 1
            if self.depth > MAX_SPEC_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_SPEC_DEPTH} levels deep", self.peek_event().start_mark)
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return Loader


def _check_shape(data: Any, path: Path) -> None:
    """Depth and size limits on parsed data, counted with YAML aliases expanded (iteratively:
    nothing recurses, nothing is copied)."""
    stack, nodes = [(data, 1)], 0
    while stack:
        obj, depth = stack.pop()
        nodes += 1
        if depth > MAX_SPEC_DEPTH:
            raise StudySpecError(f"{path}: nested more than {MAX_SPEC_DEPTH} levels deep "
                                 "(or a YAML alias that refers to itself)")
        if nodes > MAX_SPEC_NODES:
            raise StudySpecError(f"{path}: more than {MAX_SPEC_NODES:,} values with YAML aliases expanded; "
                                 "a spec lists models and settings")
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
            stack.extend((k, depth + 1) for k in obj if not isinstance(k, (str, int, float, bool)))
        elif isinstance(obj, (list, tuple)):
            stack.extend((v, depth + 1) for v in obj)


def load_spec(path: str | os.PathLike) -> StudySpec:
    """Parse and validate a study spec file (``.toml``, or ``.yaml``/``.yml``).

    Limits: at most 1 MiB, 32 levels of nesting, 200,000 values with YAML aliases expanded (anchors
    and ``<<: *defaults`` merges work; an alias bomb is refused in well under a second). A UTF-8
    BOM is fine.

    Raises:
        StudySpecError: naming the file, the line and the field that is wrong (values quoted in
            the message are cut short).
    """
    path = Path(path)
    if not path.exists():
        raise StudySpecError(f"{path}: no such study spec file")
    try:
        text = safe_read_text(path, MAX_SPEC_BYTES, what="study spec")
    except SafeIOError as e:
        raise StudySpecError(str(e)) from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:  # pragma: no cover - PyYAML comes with transformers
            raise StudySpecError(f"{path}: YAML specs need PyYAML (pip install pyyaml); or use TOML")
        try:
            data = yaml.load(text, Loader=_yaml_loader())
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f"line {mark.line + 1}" if mark is not None else "line ?"
            problem = str(getattr(e, "problem", None) or e)[:200]
            raise StudySpecError(f"{path}:{line}: invalid YAML: {problem}") from None
        except RecursionError:
            raise StudySpecError(f"{path}: nested too deeply") from None
        if data is None:
            data = {}
        model_starts = _yaml_item_lines(text)
    else:
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise StudySpecError(f"{path}: invalid TOML: {str(e)[:200]}") from None
        except RecursionError:
            raise StudySpecError(f"{path}: nested too deeply") from None
        model_starts = _table_starts(text, "models")
    _check_shape(data, path)
    return _validate(data, text, path, model_starts)


def _yaml_item_lines(text: str) -> list[int]:
    lines = text.splitlines()
    out, inside = [], False
    for i, line in enumerate(lines):
        if re.match(r"^models\s*:", line):
            inside = True
            continue
        if inside and re.match(r"^\S", line):
            inside = False
        if inside and re.match(r"^\s*-\s", line):
            out.append(i)
    return out


def _validate(data: Any, text: str, path: Path, model_starts: list[int]) -> StudySpec:
    def err(line: int, field_: str, msg: str) -> StudySpecError:
        msg = msg if len(msg) <= _MAX_ERROR else msg[:_MAX_ERROR] + " ..."
        return StudySpecError(f"{path}:{line}: field '{V.excerpt(field_, 60).strip(chr(39))}': {msg}")

    def bad(v: Any) -> str:
        return f"bad value {V.excerpt(v)}"

    if not isinstance(data, dict):
        raise StudySpecError(f"{path}:1: the spec must be a table/mapping with 'study' and 'models'")
    unknown_top = [k for k in data if k not in ("study", "models")]
    if unknown_top:
        k = str(unknown_top[0])
        raise err(_line_of(text, rf"^\s*\[?\s*{re.escape(k[:100])}\b"), k, "unknown section; expected 'study' and 'models'")
    study = data.get("study", {})
    if not isinstance(study, dict):
        raise err(_line_of(text, r"^\s*study"), "study", "must be a table")
    for k, v in study.items():
        k = str(k)
        line = _line_of(text, rf"^\s*{re.escape(k[:100])}\s*[=:]")
        if k not in _STUDY_FIELDS:
            raise err(line, f"study.{k}", f"unknown field; allowed: {sorted(_STUDY_FIELDS)}")
        if not isinstance(v, _STUDY_FIELDS[k]) or (k == "batch_size" and (isinstance(v, bool) or v < 1)):
            raise err(line, f"study.{k}", bad(v))
        try:
            if k == "name":
                V.text("name", v, max_len=200)
            elif k == "prepend_bos":
                V.prepend_bos(v)
            elif k == "token_scope":
                V.token_scope(v)
            elif k == "batch_size":
                V.positive_int("batch_size", v, maximum=1 << 16)
            elif k == "prompts":
                _check_prompts(v)
        except ThermoLensInputError as e:
            msg = str(e).removeprefix("prompts: ")
            if k == "prepend_bos":
                msg = 'must be "host", true, false or "tokenizer"'
            elif k == "token_scope":
                msg = f"{V.excerpt(v)} is not one of last, all_but_first, all, frobenius"
            raise err(line if k != "prompts" else _line_of(text, r"^\s*prompts\s*[=:]"), f"study.{k}", msg) from None
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise err(_line_of(text, r"models"), "models", "at least one [[models]] entry is needed")
    if len(models) > 10_000:
        raise err(_line_of(text, r"models"), "models", f"{len(models)} models; at most 10000 per spec")
    specs: list[ModelSpec] = []
    seen: set[str] = set()
    for i, m in enumerate(models):
        start = model_starts[i] if i < len(model_starts) else 0
        where = _line_of(text, r".", start)
        if not isinstance(m, dict):
            raise err(where, f"models[{i}]", "must be a table")
        for k, v in m.items():
            k = str(k)
            line = _line_of(text, rf"^\s*-?\s*{re.escape(k[:100])}\s*[=:]", start)
            if k not in _MODEL_FIELDS:
                raise err(line, f"models[{i}].{k}", f"unknown field; allowed: {sorted(_MODEL_FIELDS)}")
            if not isinstance(v, _MODEL_FIELDS[k]) or (k == "num_gpus" and isinstance(v, bool)):
                raise err(line, f"models[{i}].{k}", bad(v))
            if k == "dtype" and v not in _DTYPES:
                raise err(line, f"models[{i}].dtype", f"{V.excerpt(v)} is not one of {sorted(_DTYPES)}")
        has_name, has_zoo = "name" in m, "zoo" in m
        if has_name == has_zoo or "twin_of" in m and "base" in m:
            msg = ("give exactly one of 'name' (hub name, local path or embedded model) and 'zoo'"
                   if has_name == has_zoo else "give one of 'twin_of' and 'base' (the same thing)")
            raise err(where, f"models[{i}]", msg)
        if has_zoo:
            from thermo_lens import zoo

            if m["zoo"] not in zoo.names():
                line = _line_of(text, r"^\s*-?\s*zoo\s*[=:]", start)
                raise err(line, f"models[{i}].zoo", f"unknown embedded model {V.excerpt(m['zoo'])}; available: {zoo.names()}")
        if "id" in m:
            mid = m["id"]
        else:
            mid = V.slug(m["zoo"]) if has_zoo else default_id(m["name"])
        if isinstance(mid, str) and mid.lower() in seen:
            raise err(where, f"models[{i}].id", f"duplicate model id {V.excerpt(mid)}; give each model a distinct 'id'")
        kw = {k: v for k, v in m.items() if k not in ("id", "base")}
        if "base" in m:
            kw["twin_of"] = m["base"]
        try:
            if has_name:
                from thermo_lens import zoo

                if m["name"] not in zoo.names() or os.path.exists(m["name"]):
                    V.model_name(m["name"], "name")  # a spec's name must be loadable as written
            spec = ModelSpec(id=mid, **kw)
        except ThermoLensInputError as e:
            field_ = next((k for k in ("id", *kw) if str(e).startswith((k, f"{k}="))), None)
            line = _line_of(text, rf"^\s*-?\s*{field_}\s*[=:]", start) if field_ else where
            raise err(line, f"models[{i}]" + (f".{field_}" if field_ else ""), str(e)) from None
        seen.add(spec.id.lower())
        specs.append(spec)
    settings = {k: study[k] for k in _SETTINGS_KEYS if k in study}
    try:
        return StudySpec(name=study.get("name", path.stem or "study"), models=tuple(specs), path=str(path), **settings)
    except ThermoLensInputError as e:
        raise StudySpecError(f"{path}: {str(e)[:_MAX_ERROR]}") from None


# ---------------------------------------------------------------------------- running
@dataclass(frozen=True)
class StudyOutcome:
    """What a run did: ids computed now, skipped (already done), and failed (with errors)."""

    out_dir: str
    done: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: dict[str, str]

    @property
    def ok(self) -> bool:
        return not self.failed


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    """Kept for callers of the old name: :func:`thermo_lens.safe_io.atomic_write_bytes`."""
    atomic_write_bytes(path, data)


def read_manifest(out_dir: str | os.PathLike) -> dict[str, Any]:
    """The study manifest (``{"study": ..., "models": {id: {...}}}``); empty if none yet.

    Raises:
        StudyManifestError: unreadable, not UTF-8, corrupt JSON, or not shaped like a manifest
            (the message says to delete it or use another folder).
    """
    p = Path(out_dir) / MANIFEST
    if not os.path.lexists(p):
        return {"models": {}}
    fix = "delete it (the result files stay) or use another output folder"
    try:
        text = safe_read_text(p, MAX_MANIFEST_BYTES, follow_symlinks=False, what="study manifest")
    except SafeIOError as e:
        raise StudyManifestError(f"{e}; {fix}") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise StudyManifestError(f"{p} is corrupt ({str(e)[:100]}); {fix}") from None
    problem = _manifest_problem(data)
    if problem:
        raise StudyManifestError(f"{p} is not a thermo-lens study manifest ({problem}); {fix}")
    return data


def _manifest_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return "not a JSON object"
    models = data.get("models", {})
    if not isinstance(models, dict):
        return "'models' is not an object"
    for mid, entry in models.items():
        if not isinstance(entry, dict):
            return f"entry {V.excerpt(mid, 40)} is not an object"
        for key in ("status", "file", "sha256", "settings_key"):
            if key in entry and entry[key] is not None and not isinstance(entry[key], str):
                return f"entry {V.excerpt(mid, 40)}: {key} is not a string"
    study = data.get("study", {})
    if not isinstance(study, dict):
        return "'study' is not an object"
    current = study.get("models")
    if current is not None and not (isinstance(current, list) and all(isinstance(m, str) for m in current)):
        return "'study.models' is not a list of ids"
    return None


_Lock = FolderLock  # the old private name


def _settings_key(settings: dict[str, Any], model: dict[str, Any]) -> str:
    payload = {"settings": settings, "model": model}
    return _sha256(json.dumps(payload, sort_keys=True, default=str).encode())[:16]


def _model_record(model: ModelSpec) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(model), default=str))


def _check_entry(out: Path, mid: str, entry: Any, settings: dict[str, Any] | None,
                 key: str | None = None) -> tuple[Any | None, str | None]:
    """``(profile, None)`` when the manifest entry's result is acceptable, else ``(None, why)``.

    Accepted only when the entry is done, its file is ``<id>.json`` (a hand-edited manifest
    cannot point one model at another's file or outside the folder), the file's SHA-256 matches,
    the profile inside names the same model id, and its settings key matches (``key`` if given,
    else recomputed from the manifest's settings and the entry's model record).
    """
    from thermo_lens.profile import ThermoProfile

    if not isinstance(entry, dict) or entry.get("status") != "done":
        return None, "not done"
    try:
        V.file_id(mid)
    except ThermoLensInputError:
        return None, f"id {V.excerpt(mid, 40)} is not a valid result name"
    if entry.get("file") != f"{mid}.json":
        return None, f"the manifest points it at {V.excerpt(entry.get('file'), 60)}, not {mid}.json"
    if key is None and settings is not None and isinstance(entry.get("model"), dict):
        key = _settings_key(settings, entry["model"])
    if key is not None and entry.get("settings_key") != key:
        return None, "measured with other settings"
    f = out / f"{mid}.json"
    if not os.path.lexists(f):
        return None, f"{f.name} is missing"
    try:
        data = safe_read_bytes(f, MAX_RESULT_BYTES, follow_symlinks=False, what="result")
    except SafeIOError as e:
        return None, str(e)
    if _sha256(data) != entry.get("sha256"):
        return None, f"{f.name} does not match the manifest's SHA-256 (corrupt or edited)"
    try:
        prof = ThermoProfile.from_json(data.decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - any unreadable result is reported, not raised
        return None, f"{f.name} is not a readable profile ({type(e).__name__}: {str(e)[:200]})"
    if not isinstance(prof, ThermoProfile) or str(prof.meta.get("name")) != mid:
        return None, f"{f.name} holds the profile of {V.excerpt(getattr(prof, 'meta', {}).get('name'), 60)}, not {mid!r}"
    if settings is not None:
        for k in ("token_scope", "prepend_bos"):
            recorded = prof.meta.get(k)
            if k == "prepend_bos":
                # ``prepend_bos`` is what "host" resolved to (True, False, "host:..."); the mode asked
                # for is ``prepend_bos_requested`` (profiles before it: explicit modes only).
                if "prepend_bos_requested" in prof.meta:
                    recorded = prof.meta["prepend_bos_requested"]
                elif settings.get(k) == "host":
                    continue
            if k in settings and k in prof.meta and recorded != settings[k]:
                return None, f"{f.name} was measured with {k}={recorded!r}, the study uses {settings[k]!r}"
    return prof, None


def load_model(model: ModelSpec) -> Any:
    """Boot the model a :class:`ModelSpec` names (zoo, local directory or hub) as a bridge."""
    import torch

    kwargs: dict[str, Any] = {}
    if model.dtype and model.dtype != "auto":
        kwargs["dtype"] = getattr(torch, model.dtype)
    if model.device_map is not None:
        kwargs["device_map"] = model.device_map
    elif model.device:
        kwargs["device"] = model.device
    if model.zoo:
        from thermo_lens import zoo

        return zoo.load(model.zoo, **kwargs)
    from thermo_lens.host import import_bridge

    TransformerBridge = import_bridge("loading a study model by name")

    if model.trust_remote_code:
        kwargs["trust_remote_code"] = True
    name = str(model.name)
    name = os.path.expanduser(name) if name.startswith("~") else name
    return TransformerBridge.boot_transformers(name, **kwargs)


def profile_one(model: ModelSpec, settings: dict[str, Any]) -> str:
    """Load one model and profile it; returns the profile's JSON text (used by every executor)."""
    import torch

    from thermo_lens import prompts as prompt_sets
    from thermo_lens.profile import profile

    if model.threads:
        torch.set_num_threads(model.threads)
    bridge = load_model(model)
    try:
        prompt_set = prompt_sets.as_prompt_set(settings.get("prompts", "paper25"))
        result = profile(
            bridge,
            prompt_set,
            prepend_bos=settings.get("prepend_bos", "host"),
            token_scope=settings.get("token_scope", "all_but_first"),
            batch_size=settings.get("batch_size", 8),
            truncate=settings.get("truncate", False),
            name=model.id,
            lab=model.lab,
            family=model.family,
            twin_of=model.twin_of,
            source=model.source,
            progress=False,
        )
        return result.to_json()
    finally:
        del bridge


def _describe(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}".strip()
    return msg if len(msg) < 2000 else msg[:2000] + " ..."


def _prepare_out(out: Path) -> None:
    if os.path.lexists(out) and not out.is_dir():
        raise ThermoLensInputError(f"output folder {out} is a file; choose a folder name")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from thermo_lens.safe_io import _reason

        raise SafeIOError(f"cannot create output folder {out}: {_reason(e)}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise SafeIOError(f"output folder {out} is not writable; choose another --out")


def run_study(
    spec: StudySpec | str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    executor: str = "local",
    ray_address: str | None = None,
    progress: bool | None = None,
    profile_fn: Callable[[ModelSpec, dict[str, Any]], str] | None = None,
) -> StudyOutcome:
    """Run (or resume) a study into ``out_dir``; see the module docstring.

    Args:
        spec: a :class:`StudySpec` or the path of a spec file.
        out_dir: the study directory (created if needed).
        executor: ``"local"`` or ``"ray"``.
        ray_address: for ``"ray"``: ``None`` starts a local Ray (``ray.init()``); an address
            (``"auto"``, ``"ray://host:10001"``) joins a cluster.
        progress: progress bar over models (default: on when stderr is a terminal).
        profile_fn: ``(ModelSpec, settings) -> JSON text``; default :func:`profile_one` (loads
            and profiles).

    Returns:
        :class:`StudyOutcome`. Failures of single models are recorded in the manifest, never
        raised. The manifest lists the spec's models as current (``study.models``); entries of
        models no longer in the spec stay, marked ``stale``, with their files.

    Raises:
        StudyLockedError: another run uses ``out_dir``.
        StudyManifestError: ``out_dir`` holds a corrupt manifest.
        thermo_lens.safe_io.SafeIOError: the folder is a file, not writable, or the disk is full.
    """
    from tqdm.auto import tqdm

    if profile_fn is None:
        profile_fn = profile_one
    if not isinstance(spec, StudySpec):
        spec = load_spec(spec)
    if executor not in ("local", "ray"):
        raise ThermoLensInputError(f"executor must be 'local' or 'ray', got {V.excerpt(executor)}")
    if executor == "local":  # every model runs here: its device must exist here, checked before any load
        for m in spec.models:
            try:
                V.device(m.device)
                V.device_map(m.device_map)
            except ThermoLensInputError as e:
                raise ThermoLensInputError(f"model {m.id!r}: {e}") from None
    out = Path(out_dir)
    _prepare_out(out)
    with FolderLock(out, what="thermo-lens study run", error=StudyLockedError):
        remove_stale_temps(out)  # left by a killed run; nobody else writes here while we hold the lock
        manifest = read_manifest(out)
        settings = spec.settings()
        current = [m.id for m in spec.models]
        manifest["thermo_lens_manifest"] = 2
        manifest["study"] = {"name": spec.name, "spec": spec.path, "settings": settings,
                             "executor": executor, "models": current}
        entries: dict[str, Any] = manifest.setdefault("models", {})
        for mid, entry in entries.items():
            if mid in current:
                entry.pop("stale", None)
            else:
                entry["stale"] = True  # kept on disk, left out of summaries and reports
        keys = {m.id: _settings_key(settings, _model_record(m)) for m in spec.models}
        todo, skipped = [], []
        for m in spec.models:
            previous = entries.get(m.id)
            prof, why = _check_entry(out, m.id, previous, settings, keys[m.id])
            if prof is not None:
                skipped.append(m.id)
                continue
            todo.append(m)
            entries[m.id] = {"status": "pending", "source": m.source, "lab": m.lab, "family": m.family,
                             "model": _model_record(m), "settings_key": keys[m.id]}
            if isinstance(previous, dict) and previous.get("status") == "done":
                entries[m.id]["note"] = f"previous result not used ({why}): recomputed"
        write_manifest = lambda: atomic_write_bytes(out / MANIFEST, json.dumps(manifest, indent=2).encode())
        write_manifest()

        done, failed = [], {}

        def record(m: ModelSpec, text: str | None, error: str | None, seconds: float) -> None:
            entry = entries[m.id]
            entry.update(finished=_now(), seconds=round(seconds, 3))
            if error is None:
                try:
                    from thermo_lens.profile import ThermoProfile

                    if not isinstance(text, str) or not text.lstrip().startswith("{"):
                        raise TypeError(f"the profile function returned {type(text).__name__}, not profile JSON text")
                    ThermoProfile.from_json(text)  # never write a result that does not read back
                    data = text.encode()
                    fname = f"{m.id}.json"
                    atomic_write_bytes(out / fname, data)
                    entry.update(status="done", file=fname, sha256=_sha256(data), error=None)
                    done.append(m.id)
                except Exception as e:  # noqa: BLE001 - recorded, the study goes on
                    error = f"result could not be saved: {_describe(e)}"
            if error is not None:
                entry.update(status="failed", error=error)
                failed[m.id] = error
            write_manifest()

        show = progress if progress is not None else sys.stderr.isatty()
        bar = tqdm(total=len(todo), desc=f"study {spec.name}", unit="model", disable=not show)
        if executor == "local":
            for m in todo:
                bar.set_postfix_str(m.id)
                entries[m.id].update(status="running", started=_now())
                write_manifest()
                t0 = time.perf_counter()
                try:
                    text, error = profile_fn(m, settings), None
                except (Exception, MemoryError) as e:  # noqa: BLE001 - recorded, the study goes on
                    text, error = None, _describe(e)
                    entries[m.id]["traceback"] = traceback.format_exc(limit=8)
                record(m, text, error, time.perf_counter() - t0)
                bar.update(1)
        else:
            _run_ray(todo, settings, profile_fn, ray_address, record, entries, write_manifest, bar)
        bar.close()
    return StudyOutcome(out_dir=str(out), done=tuple(done), skipped=tuple(skipped), failed=failed)


def _run_ray(todo, settings, profile_fn, ray_address, record, entries, write_manifest, bar) -> None:
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "the Ray executor needs Ray: pip install 'thermo-lens[ray]' (or pip install ray)"
        ) from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)

    # Ray pickles this closure by value; a runtime type-check wrapper (the test suite's jaxtyping
    # hook) holds weakrefs that cannot be pickled, so it opts out.
    @no_type_check
    def task(m: ModelSpec, s: dict) -> tuple[str | None, str | None, float]:
        t0 = time.perf_counter()
        try:
            return profile_fn(m, s), None, time.perf_counter() - t0
        except (Exception, MemoryError) as e:  # noqa: BLE001 - sent back and recorded
            return None, _describe(e), time.perf_counter() - t0

    remote = ray.remote(task)
    pending = {}
    for m in todo:
        opts = {"num_cpus": 1, "num_gpus": m.num_gpus or 0, "max_retries": 0}
        pending[remote.options(**opts).remote(m, settings)] = m
        entries[m.id].update(status="running", started=_now())
    write_manifest()
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            m = pending.pop(ready[0])
            try:
                text, error, seconds = ray.get(ready[0])
            except Exception as e:  # noqa: BLE001 - a crashed worker (e.g. OOM-killed)
                text, error, seconds = None, _describe(e), 0.0
            record(m, text, error, seconds)
            bar.update(1)
    finally:
        if started_here:
            ray.shutdown()


@dataclass(frozen=True)
class StudyContents:
    """A study folder as the manifest describes it.

    Attributes:
        profiles: id -> ThermoProfile, the accepted results of the current spec's models.
        stale: ids of results from an earlier spec (kept on disk, left out of summaries/reports).
        failed: id -> error of current models that failed.
        problems: id -> why a current model's recorded result was not accepted (missing,
            corrupt, edited, another model's file, other settings): rerun the study to recompute.
        manifest: the manifest itself.
    """

    profiles: dict[str, Any]
    stale: tuple[str, ...]
    failed: dict[str, str]
    problems: dict[str, str]
    manifest: dict[str, Any]


def read_study(out_dir: str | os.PathLike) -> StudyContents:
    """Read a study folder: accepted profiles, stale ids, failures and problems (never raises for
    one bad result; raises :class:`StudyManifestError` for a bad manifest)."""
    out = Path(out_dir)
    manifest = read_manifest(out)
    entries = manifest.get("models", {})
    study = manifest.get("study", {})
    current = study.get("models")
    current = list(entries) if current is None else current
    settings = study.get("settings") if isinstance(study.get("settings"), dict) else None
    profiles, failed, problems = {}, {}, {}
    for mid in current:
        entry = entries.get(mid)
        if not isinstance(entry, dict):
            problems[mid] = "listed in the study but has no manifest entry"
            continue
        if entry.get("status") == "failed":
            failed[mid] = str(entry.get("error") or "failed")
            continue
        if entry.get("status") != "done":
            problems[mid] = f"status {V.excerpt(entry.get('status'), 30)}: not finished"
            continue
        prof, why = _check_entry(out, mid, entry, settings)
        if prof is None:
            problems[mid] = why or "not accepted"
        else:
            profiles[mid] = prof
    stale = tuple(mid for mid in entries if mid not in current)
    return StudyContents(profiles, stale, failed, problems, manifest)


def load_profiles(out_dir: str | os.PathLike, *, strict: bool = False) -> dict[str, Any]:
    """The accepted profiles of a study directory's current models, by model id.

    A result is accepted only when its manifest entry, file name, SHA-256, recorded model id and
    settings all agree (see :func:`read_study`). Results that are not accepted are left out
    with a warning (``strict=True``: a ``RuntimeError``); stale results of models no longer in
    the spec are left out silently.
    """
    contents = read_study(out_dir)
    if contents.problems:
        msg = "; ".join(f"{k}: {v}" for k, v in list(contents.problems.items())[:20])
        msg = f"{Path(out_dir)}: results left out ({msg}); rerun the study to recompute them"
        if strict:
            raise RuntimeError(msg)
        warnings.warn(msg, stacklevel=2)
    return contents.profiles
