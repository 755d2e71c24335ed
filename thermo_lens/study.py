"""Many-model studies: a spec file in, one directory of per-model profiles and a manifest out.

A study spec (TOML, or YAML where PyYAML is installed) lists models and the measurement
settings::

    [study]
    name = "heritage"
    prompts = "paper25"          # a built-in prompt set (thermo_lens.prompts) or a list
    prepend_bos = true           # true / false / "tokenizer"
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
  atomically (temporary file + rename) as soon as it is done, and ``DIR/manifest.json`` records
  every model's status (``done`` with the file's SHA-256, or ``failed`` with its error);
* rerunning resumes: a model is skipped only when the manifest says done *and* its file exists
  and matches the recorded SHA-256 and the same settings; a missing or corrupt file is detected
  and recomputed, never silently used;
* a failing model (load error, unknown name, OOM, NaN) is recorded and the study goes on;
* one run at a time per directory: a second concurrent run is refused (an exclusive lock on
  ``DIR/.lock``);
* executors: ``"local"`` (in this process, one model after another) and ``"ray"`` (one model
  per Ray task, each asking for its ``num_gpus``; ``ray.init()`` locally or
  ``ray.init(address=...)`` on a cluster). Results are written only by the driver.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import os
import re
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = [
    "ModelSpec",
    "StudySpec",
    "StudySpecError",
    "StudyLockedError",
    "StudyOutcome",
    "load_spec",
    "run_study",
    "read_manifest",
    "load_profiles",
]

MANIFEST = "manifest.json"
_SETTINGS_KEYS = ("prompts", "prepend_bos", "token_scope", "batch_size", "truncate")


class StudySpecError(ValueError):
    """A malformed study spec; the message names the file, the line and the field."""


class StudyLockedError(RuntimeError):
    """Another run holds the study directory."""


@dataclass(frozen=True)
class ModelSpec:
    """One model of a study. Exactly one of ``name`` (hub name or local directory) and ``zoo``."""

    id: str
    name: str | None = None
    zoo: str | None = None
    lab: str | None = None
    family: str | None = None
    twin_of: str | None = None
    dtype: str | None = None
    device: str | None = None
    device_map: Any = None
    num_gpus: float = 0
    threads: int | None = None
    trust_remote_code: bool = False

    @property
    def source(self) -> str:
        return f"zoo:{self.zoo}" if self.zoo else str(self.name)


@dataclass(frozen=True)
class StudySpec:
    """A parsed study spec (see the module docstring for the file format)."""

    name: str
    models: tuple[ModelSpec, ...]
    prompts: Any = "paper25"
    prepend_bos: Any = True
    token_scope: str = "all_but_first"
    batch_size: int = 8
    truncate: bool = False
    path: str | None = None

    def settings(self) -> dict[str, Any]:
        """The measurement settings every profile of this study shares."""
        return {k: getattr(self, k) for k in _SETTINGS_KEYS}

    @classmethod
    def from_models(cls, models: Iterable[str | ModelSpec], *, name: str = "profile", **settings: Any) -> "StudySpec":
        """A spec from model names (zoo names are recognised) for the CLI's ``profile`` command."""
        from thermo_lens import zoo

        specs, seen = [], set()
        for m in models:
            if isinstance(m, ModelSpec):
                spec = m
            elif m in zoo.names() and not Path(m).exists():
                spec = ModelSpec(id=_unique_id(m, seen), zoo=m, lab="thermo-lens zoo",
                                 family=zoo.info(m).get("family"))
            else:
                spec = ModelSpec(id=_unique_id(_slug(m), seen), name=m)
            seen.add(spec.id)
            specs.append(spec)
        if not specs:
            raise StudySpecError("no models given")
        return cls(name=name, models=tuple(specs), **settings)


def _slug(name: str) -> str:
    """A file-safe model id: a local directory's own name, or the hub name with '/' -> '_'."""
    if name.startswith(("/", ".", "~")) or (os.sep in name and Path(name).exists()):
        name = Path(name).expanduser().name or name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip("/")).strip("_") or "model"


def _unique_id(base: str, seen: set[str]) -> str:
    out, k = base, 2
    while out in seen:
        out, k = f"{base}-{k}", k + 1
    return out


# ---------------------------------------------------------------------------- spec parsing
_MODEL_FIELDS = {
    "name": str, "zoo": str, "id": str, "lab": str, "family": str, "twin_of": str, "base": str,
    "dtype": str, "device": str, "device_map": (str, dict), "num_gpus": (int, float),
    "threads": int, "trust_remote_code": bool,
}
_STUDY_FIELDS = {
    "name": str, "prompts": (str, list, dict), "prepend_bos": (bool, str), "token_scope": str,
    "batch_size": int, "truncate": bool,
}
_DTYPES = {"float32", "float16", "bfloat16", "float64", "auto"}


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


def load_spec(path: str | os.PathLike) -> StudySpec:
    """Parse and validate a study spec file (``.toml``, or ``.yaml``/``.yml``).

    Raises:
        StudySpecError: naming the file, the line and the field that is wrong.
    """
    path = Path(path)
    if not path.exists():
        raise StudySpecError(f"{path}: no such study spec file")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:  # pragma: no cover - PyYAML comes with transformers
            raise StudySpecError(f"{path}: YAML specs need PyYAML (pip install pyyaml); or use TOML")
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f"line {mark.line + 1}" if mark is not None else "line ?"
            raise StudySpecError(f"{path}:{line}: invalid YAML: {getattr(e, 'problem', e)}") from None
        model_starts = _yaml_item_lines(text)
    else:
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise StudySpecError(f"{path}: invalid TOML: {e}") from None
        model_starts = _table_starts(text, "models")
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


def _validate(data: dict, text: str, path: Path, model_starts: list[int]) -> StudySpec:
    def err(line: int, field_: str, msg: str) -> StudySpecError:
        return StudySpecError(f"{path}:{line}: field '{field_}': {msg}")

    if not isinstance(data, dict):
        raise StudySpecError(f"{path}:1: the spec must be a table/mapping with 'study' and 'models'")
    unknown_top = set(data) - {"study", "models"}
    if unknown_top:
        k = sorted(unknown_top)[0]
        raise err(_line_of(text, rf"^\s*\[?\s*{re.escape(k)}\b"), k, "unknown section; expected 'study' and 'models'")
    study = data.get("study", {})
    if not isinstance(study, dict):
        raise err(_line_of(text, r"^\s*study"), "study", "must be a table")
    for k, v in study.items():
        line = _line_of(text, rf"^\s*{re.escape(k)}\s*[=:]")
        if k not in _STUDY_FIELDS:
            raise err(line, f"study.{k}", f"unknown field; allowed: {sorted(_STUDY_FIELDS)}")
        if not isinstance(v, _STUDY_FIELDS[k]) or (k == "batch_size" and (isinstance(v, bool) or v < 1)):
            raise err(line, f"study.{k}", f"bad value {v!r}")
    if "prepend_bos" in study and isinstance(study["prepend_bos"], str) and study["prepend_bos"] != "tokenizer":
        raise err(_line_of(text, r"^\s*prepend_bos"), "study.prepend_bos", "must be true, false or \"tokenizer\"")
    if "token_scope" in study and study["token_scope"] not in ("last", "all_but_first", "all", "frobenius"):
        raise err(_line_of(text, r"^\s*token_scope"), "study.token_scope",
                  f"{study['token_scope']!r} is not one of last, all_but_first, all, frobenius")
    if "prompts" in study:
        from thermo_lens import prompts as prompt_sets

        try:
            prompt_sets.as_prompt_set(study["prompts"])
        except (KeyError, TypeError, ValueError) as e:
            raise err(_line_of(text, r"^\s*prompts\s*[=:]"), "study.prompts", str(e).strip("'\"")) from None
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise err(_line_of(text, r"models"), "models", "at least one [[models]] entry is needed")
    specs, seen = [], set()
    for i, m in enumerate(models):
        start = model_starts[i] if i < len(model_starts) else 0
        where = _line_of(text, r".", start)
        if not isinstance(m, dict):
            raise err(where, f"models[{i}]", "must be a table")
        for k, v in m.items():
            line = _line_of(text, rf"^\s*-?\s*{re.escape(k)}\s*[=:]", start)
            if k not in _MODEL_FIELDS:
                raise err(line, f"models[{i}].{k}", f"unknown field; allowed: {sorted(_MODEL_FIELDS)}")
            if not isinstance(v, _MODEL_FIELDS[k]) or (k == "num_gpus" and isinstance(v, bool)):
                raise err(line, f"models[{i}].{k}", f"bad value {v!r}")
            if k == "dtype" and v not in _DTYPES:
                raise err(line, f"models[{i}].dtype", f"{v!r} is not one of {sorted(_DTYPES)}")
        has_name, has_zoo = "name" in m, "zoo" in m
        if has_name == has_zoo:
            raise err(where, f"models[{i}]", "give exactly one of 'name' (hub name or local path) and 'zoo'")
        if has_zoo:
            from thermo_lens import zoo

            if m["zoo"] not in zoo.names():
                line = _line_of(text, r"^\s*-?\s*zoo\s*[=:]", start)
                raise err(line, f"models[{i}].zoo", f"unknown embedded model {m['zoo']!r}; available: {zoo.names()}")
        mid = m.get("id") or _slug(m.get("zoo") or m["name"])
        if mid in seen:
            raise err(where, f"models[{i}].id", f"duplicate model id {mid!r}; give each model a distinct 'id'")
        seen.add(mid)
        kw = {k: v for k, v in m.items() if k not in ("id", "base")}
        if "base" in m:
            kw["twin_of"] = m["base"]
        specs.append(ModelSpec(id=mid, **kw))
    settings = {k: study[k] for k in _SETTINGS_KEYS if k in study}
    return StudySpec(name=study.get("name", path.stem), models=tuple(specs), path=str(path), **settings)


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
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_manifest(out_dir: str | os.PathLike) -> dict[str, Any]:
    """The study manifest (``{"study": ..., "models": {id: {...}}}``); empty if none yet."""
    p = Path(out_dir) / MANIFEST
    if not p.exists():
        return {"models": {}}
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise RuntimeError(f"{p} is corrupt ({e}); delete it to recompute the study") from None


class _Lock:
    """Exclusive, non-blocking lock on ``DIR/.lock`` (released when the process dies)."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> "_Lock":
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(self.fd, 100, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            self.fd = None
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise StudyLockedError(
                    f"another thermo-lens study run (pid {holder}) is using {self.path.parent}; "
                    "wait for it to finish or use another --out directory"
                ) from None
            raise
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc: Any) -> None:
        import fcntl

        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


def _settings_key(spec: StudySpec, model: ModelSpec) -> str:
    payload = {"settings": spec.settings(), "model": asdict(model)}
    return _sha256(json.dumps(payload, sort_keys=True, default=str).encode())[:16]


def _is_done(out_dir: Path, entry: dict | None, key: str) -> bool:
    if not entry or entry.get("status") != "done" or entry.get("settings_key") != key:
        return False
    f = out_dir / entry.get("file", "")
    if not f.is_file():
        return False
    return _sha256(f.read_bytes()) == entry.get("sha256")


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
    from transformer_lens.model_bridge import TransformerBridge

    if model.trust_remote_code:
        kwargs["trust_remote_code"] = True
    return TransformerBridge.boot_transformers(str(model.name), **kwargs)


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
            prepend_bos=settings.get("prepend_bos", True),
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


def run_study(
    spec: StudySpec | str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    executor: str = "local",
    ray_address: str | None = None,
    progress: bool | None = None,
    profile_fn: Callable[[ModelSpec, dict[str, Any]], str] = profile_one,
) -> StudyOutcome:
    """Run (or resume) a study into ``out_dir``; see the module docstring.

    Args:
        spec: a :class:`StudySpec` or the path of a spec file.
        out_dir: the study directory (created if needed).
        executor: ``"local"`` or ``"ray"``.
        ray_address: for ``"ray"``: ``None`` starts a local Ray (``ray.init()``); an address
            (``"auto"``, ``"ray://host:10001"``) joins a cluster.
        progress: progress bar over models (default: on when stderr is a terminal).
        profile_fn: ``(ModelSpec, settings) -> JSON text``; the default loads and profiles.

    Returns:
        :class:`StudyOutcome`. Failures are recorded in the manifest, never raised.
    """
    from tqdm.auto import tqdm

    if not isinstance(spec, StudySpec):
        spec = load_spec(spec)
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _Lock(out):
        manifest = read_manifest(out)
        manifest["study"] = {"name": spec.name, "spec": spec.path, "settings": spec.settings(),
                             "executor": executor}
        entries: dict[str, Any] = manifest.setdefault("models", {})
        keys = {m.id: _settings_key(spec, m) for m in spec.models}
        todo, skipped = [], []
        for m in spec.models:
            previous = entries.get(m.id)
            if _is_done(out, previous, keys[m.id]):
                skipped.append(m.id)
                continue
            todo.append(m)
            entries[m.id] = {"status": "pending", "source": m.source, "lab": m.lab, "family": m.family,
                             "settings_key": keys[m.id]}
            if previous and previous.get("status") == "done":
                entries[m.id]["note"] = "result file missing, corrupt or from other settings: recomputed"
        write_manifest = lambda: _atomic_write(out / MANIFEST, json.dumps(manifest, indent=2).encode())
        write_manifest()

        done, failed = [], {}

        def record(m: ModelSpec, text: str | None, error: str | None, seconds: float) -> None:
            entry = entries[m.id]
            entry.update(finished=_now(), seconds=round(seconds, 3))
            if error is None:
                try:
                    from thermo_lens.profile import ThermoProfile

                    ThermoProfile.from_json(text)  # never write a result that does not read back
                    data = text.encode()
                    fname = f"{m.id}.json"
                    _atomic_write(out / fname, data)
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
        settings = spec.settings()
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


def load_profiles(out_dir: str | os.PathLike, *, include_failed: bool = False) -> dict[str, Any]:
    """The finished profiles of a study directory, by model id (verified against the manifest)."""
    from thermo_lens.profile import ThermoProfile

    out = Path(out_dir)
    manifest = read_manifest(out)
    result = {}
    for mid, entry in manifest.get("models", {}).items():
        if entry.get("status") != "done":
            continue
        f = out / entry["file"]
        data = f.read_bytes() if f.is_file() else b""
        if _sha256(data) != entry.get("sha256"):
            raise RuntimeError(f"{f} does not match the manifest's SHA-256 (corrupt or edited); rerun the study to recompute it")
        result[mid] = ThermoProfile.from_json(data.decode())
    return result
