"""The study folder's manifest (``DIR/manifest.json``): the source of truth for what is done.

Layout (version 2)::

    {"thermo_lens_manifest": 2,
     "study": {"name": ..., "spec": path, "settings": {...}, "executor": "local", "models": [ids]},
     "models": {id: {"status": "done" | "failed" | "pending" | "running",
                     "file": "<id>.json", "sha256": ..., "settings_key": ..., "model": {...},
                     "weights": {fingerprint} | null, "stale": true (no longer in the spec), ...}}}

A recorded result is accepted (:func:`check_entry`) only when the entry is done, its file is
``<id>.json`` and matches the recorded SHA-256, the profile inside names the same model and was
measured with the same settings. Whether the model's weights are still the ones measured is
:mod:`thermo_lens.experiments.study.fingerprint`'s part.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from thermo_lens.core import validate as V
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.result import MAX_JSON_BYTES
from thermo_lens.core.safe_io import SafeIOError, atomic_write_bytes, printable, safe_read_bytes, safe_read_text
from thermo_lens.experiments.study.spec import ModelSpec

__all__ = ["MANIFEST", "StudyManifestError", "read_manifest", "write_manifest", "check_entry", "settings_key",
           "model_record", "sha256"]

MANIFEST = "manifest.json"
MANIFEST_VERSION = 2
MAX_MANIFEST_BYTES = 64 << 20
MAX_RESULT_BYTES = MAX_JSON_BYTES
_FIX = "delete it (the result files stay) or use another output folder"


class StudyManifestError(ThermoLensInputError):
    """The study folder's manifest is unreadable, corrupt or not a thermo-lens manifest."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_manifest(out_dir: str | os.PathLike) -> dict[str, Any]:
    """The study manifest (``{"study": ..., "models": {id: {...}}}``); empty if none yet.

    Raises:
        StudyManifestError: unreadable, not UTF-8, corrupt JSON, or not shaped like a thermo-lens
            manifest (the message says to delete it or use another folder).
    """
    p = Path(out_dir) / MANIFEST
    if not os.path.lexists(p):
        return {"models": {}}
    try:
        text = safe_read_text(p, MAX_MANIFEST_BYTES, follow_symlinks=False, what="study manifest")
    except SafeIOError as e:
        raise StudyManifestError(f"{e}; {_FIX}") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise StudyManifestError(f"{printable(p)} is corrupt ({printable(str(e)[:100])}); {_FIX}") from None
    problem = _manifest_problem(data)
    if problem:
        raise StudyManifestError(f"{printable(p)} is not a thermo-lens study manifest ({problem}); {_FIX}")
    return data


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> None:
    """Replace the manifest atomically (:func:`thermo_lens.core.safe_io.atomic_write_bytes`)."""
    atomic_write_bytes(out_dir / MANIFEST, json.dumps(manifest, indent=2).encode())


def _manifest_problem(data: object) -> str | None:
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
        if entry.get("weights") is not None and not isinstance(entry["weights"], dict):
            return f"entry {V.excerpt(mid, 40)}: weights is not an object"
    study = data.get("study", {})
    if not isinstance(study, dict):
        return "'study' is not an object"
    current = study.get("models")
    if current is not None and not (isinstance(current, list) and all(isinstance(m, str) for m in current)):
        return "'study.models' is not a list of ids"
    # Another tool's manifest.json (a web app's, a dataset's) is not taken for ours: a thermo-lens
    # manifest is marked, or (written before the mark) has the study's settings or model statuses.
    marked = "thermo_lens_manifest" in data or "settings" in study
    if not marked and not (models and all("status" in e for e in models.values())):
        return "no 'thermo_lens_manifest' mark, study settings or model statuses"
    return None


def settings_key(settings: dict[str, Any], model: dict[str, Any]) -> str:
    """A short hash of the study's settings and one model's record: a result measured under
    another key is not reused."""
    payload = {"settings": settings, "model": model}
    return sha256(json.dumps(payload, sort_keys=True, default=str).encode())[:16]


def model_record(model: ModelSpec) -> dict[str, Any]:
    """The :class:`ModelSpec` as plain JSON data (what the manifest stores)."""
    return json.loads(json.dumps(asdict(model), default=str))


def check_entry(out: Path, mid: str, entry: object, settings: dict[str, Any] | None,
                key: str | None = None) -> tuple[Any | None, str | None]:
    """``(profile, None)`` when the manifest entry's result is acceptable, else ``(None, why)``.

    Accepted only when the entry is done, its file is ``<id>.json`` (a hand-edited manifest
    cannot point one model at another's file or outside the folder), the file's SHA-256 matches,
    the profile inside names the same model id, and its settings key matches (``key`` if given,
    else recomputed from the manifest's settings and the entry's model record).
    """
    if not isinstance(entry, dict) or entry.get("status") != "done":
        return None, "not done"
    try:
        V.file_id(mid)
    except ThermoLensInputError:
        return None, f"id {V.excerpt(mid, 40)} is not a valid result name"
    if entry.get("file") != f"{mid}.json":
        return None, f"the manifest points it at {V.excerpt(entry.get('file'), 60)}, not {mid}.json"
    if key is None and settings is not None and isinstance(entry.get("model"), dict):
        key = settings_key(settings, entry["model"])
    if key is not None and entry.get("settings_key") != key:
        return None, "measured with other settings"
    f = out / f"{mid}.json"
    if not os.path.lexists(f):
        return None, f"{f.name} is missing"
    try:
        data = safe_read_bytes(f, MAX_RESULT_BYTES, follow_symlinks=False, what="result")
    except SafeIOError as e:
        return None, str(e)
    if sha256(data) != entry.get("sha256"):
        return None, f"{f.name} does not match the manifest's SHA-256 (corrupt or edited)"
    return _check_profile(f.name, data, mid, settings)


def _check_profile(fname: str, data: bytes, mid: str, settings: dict[str, Any] | None) -> tuple[Any | None, str | None]:
    from thermo_lens.measures.profile import ThermoProfile

    try:
        prof = ThermoProfile.from_json(data.decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - any unreadable result is reported, not raised
        return None, f"{fname} is not a readable profile ({type(e).__name__}: {str(e)[:200]})"
    if not isinstance(prof, ThermoProfile) or str(prof.meta.get("name")) != mid:
        return None, f"{fname} holds the profile of {V.excerpt(getattr(prof, 'meta', {}).get('name'), 60)}, not {mid!r}"
    if settings is None:
        return prof, None
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
            return None, f"{fname} was measured with {k}={recorded!r}, the study uses {settings[k]!r}"
    return prof, None
