"""Reading a study spec file (TOML, or YAML where PyYAML is installed) into a :class:`StudySpec`.

The file is read with limits (:data:`MAX_SPEC_BYTES`, :data:`MAX_SPEC_DEPTH` levels,
:data:`MAX_SPEC_NODES` values with YAML aliases expanded), parsed, and every section, field and
value checked before anything else happens. A mistake is a :class:`StudySpecError` naming the
file, the line and the field (``spec.toml:12: field 'models[0].dtype': ...``); a key given twice
is a mistake too (YAML would otherwise keep the last value silently). Text quoted in a message is
cut short and its control characters are escaped.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from thermo_lens.core import validate as V
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.safe_io import SafeIOError, printable, safe_read_text
from thermo_lens.core.tokens import TOKEN_SCOPES, bos_modes_text
from thermo_lens.experiments.study.spec import (
    MAX_ERROR,
    SETTINGS_KEYS,
    ModelSpec,
    StudySpec,
    StudySpecError,
    check_prompts,
    default_id,
)

if TYPE_CHECKING:
    import yaml

__all__ = ["load_spec", "MAX_SPEC_BYTES", "MAX_SPEC_DEPTH", "MAX_SPEC_NODES", "MAX_SPEC_ALIASES"]

# Parsing limits: a spec is a short hand-written file; anything beyond these is a mistake or an attack.
MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_DEPTH = 32
MAX_SPEC_NODES = 200_000
MAX_SPEC_ALIASES = 1_000
MAX_MODELS = 10_000

_MODEL_FIELDS: dict[str, Any] = {
    "name": str, "zoo": str, "id": str, "lab": str, "family": str, "twin_of": str, "base": str,
    "dtype": str, "device": str, "device_map": (str, dict), "num_gpus": (int, float),
    "threads": int, "trust_remote_code": bool,
}
_STUDY_FIELDS: dict[str, Any] = {
    "name": str, "prompts": (str, list, dict), "prepend_bos": (bool, str), "token_scope": str,
    "batch_size": int, "truncate": bool,
}
# Each study field's own check, and the message that replaces the check's generic one.
_STUDY_CHECKS: dict[str, Callable[[Any], Any]] = {
    "name": lambda v: V.text("name", v, max_len=200),
    "prepend_bos": V.prepend_bos,
    "token_scope": V.token_scope,
    "batch_size": lambda v: V.positive_int("batch_size", v, maximum=1 << 16),
    "prompts": check_prompts,
}
_STUDY_MESSAGES: dict[str, Callable[[Any], str]] = {
    "prepend_bos": lambda v: "must be " + bos_modes_text(bools=("true", "false")),
    "token_scope": lambda v: f"{V.excerpt(v)} is not one of {', '.join(TOKEN_SCOPES)}",
}
_YAML_SUFFIXES = (".yaml", ".yml")


def load_spec(path: str | os.PathLike) -> StudySpec:
    """Parse and validate a study spec file (``.toml``, or ``.yaml``/``.yml`` in any case).

    Limits: at most 1 MiB, 32 levels of nesting, 200,000 values with YAML aliases expanded (anchors
    and ``<<: *defaults`` merges work; an alias bomb is refused in well under a second). A UTF-8
    BOM is fine; a key given twice in one table is refused.

    Raises:
        StudySpecError: naming the file, the line and the field that is wrong (values quoted in
            the message are cut short).
    """
    path = Path(path)
    shown = printable(path)
    if not os.path.lexists(path):
        raise StudySpecError(f"{shown}: no such study spec file")
    try:
        text = safe_read_text(path, MAX_SPEC_BYTES, what="study spec")
    except SafeIOError as e:
        raise StudySpecError(str(e)) from None
    if path.suffix.lower() in _YAML_SUFFIXES:
        data, model_starts = _parse_yaml(text, shown), _yaml_item_lines(text)
    else:
        data, model_starts = _parse_toml(text, shown), _table_starts(text, "models")
    _check_shape(data, shown)
    return _validate(data, _Where(text, shown, model_starts), path)


# ---------------------------------------------------------------------------- parsing
def _parse_yaml(text: str, shown: str) -> object:
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML comes with transformers
        raise StudySpecError(f"{shown}: YAML specs need PyYAML (pip install pyyaml); or use TOML") from None
    try:
        data = yaml.load(text, Loader=_yaml_loader())  # a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark is not None else "line ?"
        problem = printable(str(getattr(e, "problem", None) or e)[:200])
        raise StudySpecError(f"{shown}:{line}: invalid YAML: {problem}") from None
    except RecursionError:
        raise StudySpecError(f"{shown}: nested too deeply") from None
    return {} if data is None else data


def _parse_toml(text: str, shown: str) -> dict[str, Any]:
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        twice = _toml_duplicate_key(text, msg)
        raise StudySpecError(f"{shown}: invalid TOML: {twice}{printable(msg[:200])}") from None
    except RecursionError:
        raise StudySpecError(f"{shown}: nested too deeply") from None


def _toml_duplicate_key(text: str, msg: str) -> str:
    """For tomllib's "Cannot overwrite a value (at line N, column M)": which key was given twice."""
    m = re.search(r"overwrite a value \(at line (\d+)", msg)
    lines = text.splitlines()
    if not m or not 0 < int(m.group(1)) <= len(lines):
        return ""
    key = re.match(r"\s*([^=]+?)\s*=", lines[int(m.group(1)) - 1])
    return f"key {V.excerpt(key.group(1), 60)} is given twice: " if key else ""


def _yaml_loader() -> type:
    """PyYAML's SafeLoader with bounded nesting, a bounded number of aliases and no duplicate keys.

    Anchors and aliases (``&defaults`` / ``<<: *defaults``) are fine: the loader shares the aliased
    object instead of copying it. What could explode is anything that later walks the data as a
    tree (a billion-laughs spec is 1.5 KB and 10^9 values expanded), so :func:`_check_shape` walks
    it once, iteratively, and stops at :data:`MAX_SPEC_NODES` values or :data:`MAX_SPEC_DEPTH`
    levels (a self-referencing alias is infinitely deep) before anything else touches it. A key
    merged in with ``<<`` may be overridden; a key written twice may not.
    """
    import yaml

    class Loader(yaml.SafeLoader):
        depth = 0
        aliases = 0

        def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
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

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            if isinstance(node, yaml.MappingNode):
                _refuse_duplicate_keys(self, node)
            return super().construct_mapping(node, deep=deep)

    return Loader


def _refuse_duplicate_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> None:
    import yaml

    first: dict[Any, int] = {}
    for key_node, _ in node.value:  # before merges are flattened in: only keys written here
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node)
        try:
            seen = first.get(key)
        except TypeError:  # an unhashable key: the mapping itself refuses it later
            continue
        if seen is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {V.excerpt(key, 60)} is given twice (first on line {seen + 1}); keep one",
                key_node.start_mark)
        first[key] = key_node.start_mark.line


def _check_shape(data: object, shown: str) -> None:
    """Depth and size limits on parsed data, counted with YAML aliases expanded (iteratively:
    nothing recurses, nothing is copied)."""
    stack, nodes = [(data, 1)], 0
    while stack:
        obj, depth = stack.pop()
        nodes += 1
        if depth > MAX_SPEC_DEPTH:
            raise StudySpecError(f"{shown}: nested more than {MAX_SPEC_DEPTH} levels deep "
                                 "(or a YAML alias that refers to itself)")
        if nodes > MAX_SPEC_NODES:
            raise StudySpecError(f"{shown}: more than {MAX_SPEC_NODES:,} values with YAML aliases expanded; "
                                 "a spec lists models and settings")
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
            stack.extend((k, depth + 1) for k in obj if not isinstance(k, (str, int, float, bool)))
        elif isinstance(obj, (list, tuple)):
            stack.extend((v, depth + 1) for v in obj)


def _yaml_item_lines(text: str) -> list[int]:
    """0-based lines where the items of the top-level ``models:`` list start."""
    out, inside = [], False
    for i, line in enumerate(text.splitlines()):
        if re.match(r"^models\s*:", line):
            inside = True
            continue
        if inside and re.match(r"^\S", line):
            inside = False
        if inside and re.match(r"^\s*-\s", line):
            out.append(i)
    return out


def _table_starts(text: str, header: str) -> list[int]:
    rx = re.compile(r"^\s*\[\[\s*" + re.escape(header) + r"\s*\]\]")
    return [i for i, line in enumerate(text.splitlines()) if rx.search(line)]


# ---------------------------------------------------------------------------- validation
class _Where:
    """Finds the line of a field in the spec's text and builds the error that names it."""

    def __init__(self, text: str, shown: str, model_starts: list[int]):
        self.lines = text.splitlines()
        self.shown = shown
        self.model_starts = model_starts

    def line(self, pattern: str, start: int = 0) -> int:
        """1-based line of the first line at or after ``start`` (0-based) matching ``pattern``."""
        rx = re.compile(pattern)
        for i in range(start, len(self.lines)):
            if rx.search(self.lines[i]):
                return i + 1
        return start + 1 if self.lines else 1

    def key_line(self, key: str, start: int = 0) -> int:
        return self.line(rf"^\s*-?\s*{re.escape(key[:100])}\s*[=:]", start)

    def model_start(self, i: int) -> int:
        return self.model_starts[i] if i < len(self.model_starts) else 0

    def error(self, line: int, field: str, msg: str) -> StudySpecError:
        msg = msg if len(msg) <= MAX_ERROR else msg[:MAX_ERROR] + " ..."
        return StudySpecError(f"{self.shown}:{line}: field '{V.excerpt(field, 60).strip(chr(39))}': {printable(msg)}")


def _validate(data: object, where: _Where, path: Path) -> StudySpec:
    if not isinstance(data, dict):
        raise StudySpecError(f"{where.shown}:1: the spec must be a table/mapping with 'study' and 'models'")
    for k in data:
        if k not in ("study", "models"):
            k = str(k)
            raise where.error(where.line(rf"^\s*\[?\s*{re.escape(k[:100])}\b"), k,
                              "unknown section; expected 'study' and 'models'")
    study = data.get("study", {})
    if not isinstance(study, dict):
        raise where.error(where.line(r"^\s*study"), "study", "must be a table")
    for k, v in study.items():
        _check_study_field(str(k), v, where)
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise where.error(where.line(r"models"), "models", "at least one [[models]] entry is needed")
    if len(models) > MAX_MODELS:
        raise where.error(where.line(r"models"), "models", f"{len(models)} models; at most {MAX_MODELS} per spec")
    specs: list[ModelSpec] = []
    seen: set[str] = set()
    for i, m in enumerate(models):
        spec = _model_spec(i, m, where, seen)
        seen.add(spec.id.lower())
        specs.append(spec)
    settings = {k: study[k] for k in SETTINGS_KEYS if k in study}
    try:
        return StudySpec(name=study.get("name", path.stem or "study"), models=tuple(specs), path=str(path), **settings)
    except ThermoLensInputError as e:
        raise StudySpecError(f"{where.shown}: {printable(str(e)[:MAX_ERROR])}") from None


def _check_study_field(k: str, v: object, where: _Where) -> None:
    line = where.line(rf"^\s*{re.escape(k[:100])}\s*[=:]")
    if k not in _STUDY_FIELDS:
        raise where.error(line, f"study.{k}", f"unknown field; allowed: {sorted(_STUDY_FIELDS)}")
    if not isinstance(v, _STUDY_FIELDS[k]) or (k == "batch_size" and (isinstance(v, bool) or v < 1)):
        raise where.error(line, f"study.{k}", f"bad value {V.excerpt(v)}")
    check = _STUDY_CHECKS.get(k)
    if check is None:
        return
    try:
        check(v)
    except ThermoLensInputError as e:
        message = _STUDY_MESSAGES.get(k)
        msg = message(v) if message else str(e).removeprefix("prompts: ")
        raise where.error(line, f"study.{k}", msg) from None


def _check_model_fields(i: int, m: dict, where: _Where) -> None:
    start = where.model_start(i)
    for k, v in m.items():
        k = str(k)
        line = where.key_line(k, start)
        if k not in _MODEL_FIELDS:
            raise where.error(line, f"models[{i}].{k}", f"unknown field; allowed: {sorted(_MODEL_FIELDS)}")
        if not isinstance(v, _MODEL_FIELDS[k]) or (k == "num_gpus" and isinstance(v, bool)):
            raise where.error(line, f"models[{i}].{k}", f"bad value {V.excerpt(v)}")
        if k == "dtype" and v not in V.DTYPES:
            raise where.error(line, f"models[{i}].dtype", f"{V.excerpt(v)} is not one of {sorted(V.DTYPES)}")
    has_name, has_zoo = "name" in m, "zoo" in m
    if has_name == has_zoo:
        raise where.error(where.line(r".", start), f"models[{i}]",
                          "give exactly one of 'name' (hub name, local path or embedded model) and 'zoo'")
    if "twin_of" in m and "base" in m:
        raise where.error(where.line(r".", start), f"models[{i}]", "give one of 'twin_of' and 'base' (the same thing)")
    if has_zoo:
        from thermo_lens import zoo

        if m["zoo"] not in zoo.names():
            raise where.error(where.key_line("zoo", start), f"models[{i}].zoo",
                              f"unknown embedded model {V.excerpt(m['zoo'])}; available: {zoo.names()}")


def _model_spec(i: int, m: object, where: _Where, seen: set[str]) -> ModelSpec:
    start = where.model_start(i)
    first_line = where.line(r".", start)
    if not isinstance(m, dict):
        raise where.error(first_line, f"models[{i}]", "must be a table")
    _check_model_fields(i, m, where)
    mid = m["id"] if "id" in m else V.slug(m["zoo"]) if "zoo" in m else default_id(m["name"])
    if isinstance(mid, str) and mid.lower() in seen:
        raise where.error(first_line, f"models[{i}].id", f"duplicate model id {V.excerpt(mid)}; give each model a distinct 'id'")
    kw = {k: v for k, v in m.items() if k not in ("id", "base")}
    if "base" in m:
        kw["twin_of"] = m["base"]
    try:
        if "name" in m:
            from thermo_lens import zoo

            if m["name"] not in zoo.names() or os.path.exists(m["name"]):
                V.model_name(m["name"], "name")  # a spec's name must be loadable as written
        return ModelSpec(id=mid, **kw)
    except ThermoLensInputError as e:
        field = next((k for k in ("id", *kw) if str(e).startswith((k, f"{k}="))), None)
        line = where.key_line(field, start) if field else first_line
        raise where.error(line, f"models[{i}]" + (f".{field}" if field else ""), str(e)) from None
