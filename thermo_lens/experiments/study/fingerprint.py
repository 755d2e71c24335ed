"""Which weights a result was measured on: a fingerprint of the checkpoint, kept in the manifest.

A study's result is reused only when its model's path and settings match (the manifest's settings
key) *and* the checkpoint still holds the same files: a local folder whose weights were replaced
at the same path is profiled again, never resumed.

What is fingerprinted:

* a local checkpoint folder (and an embedded zoo model's folder): every top-level file the loader
  may read (weights, ``config.json``, tokenizer files, custom code) with its size and the SHA-256
  of its content. Training state that does not change the model (``optimizer.pt``,
  ``scheduler.pt``, ``rng_state*.pth``, ``trainer_state.json``, ``training_args.bin``) and
  ``*.md`` model cards are left out. Hashing reads the files once (SHA-256 runs at about 1.9 GB/s
  on one core: a 14 GB checkpoint costs some 8 s, once, beside minutes of loading it); each
  file's ``(mtime_ns, ctime_ns, inode, device)`` is recorded beside its hash, and a later run
  whose stat matches reuses the recorded hash, so resuming costs one ``stat`` per file. Any
  change of the stat (a replaced file gets a new inode and ctime; ctime cannot be set back) means
  the file is hashed again, and the content decides: a copied or touched checkpoint with the same
  bytes is still resumed, a replaced one is not, whatever its size or modification time;
* a hub id: the commit its ``main`` reference resolves to in the local Hugging Face cache
  (``refs/main``), read without any network call; ``None`` when the model is not cached yet (it
  is read again after the model was loaded).

Why not the cheaper size + mtime + safetensors header: another checkpoint of the same architecture
has the same size and header (the embedded ``gpt2-tiny-wd`` and ``gpt2-tiny-nowd`` are such a
pair), and ``cp -p`` / ``rsync -a`` carry the source's mtime over; and a stat alone would also
call a copied folder changed and recompute it.

A fingerprint is a JSON object ``{"kind": "folder" | "zoo" | "hub", ..., "digest": hex}``;
two fingerprints describe the same weights when their digests are equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat as stat_
from pathlib import Path
from typing import Any, Mapping

from thermo_lens.core.safe_io import SafeIOError, os_error_reason, printable, safe_read_text

__all__ = ["checkpoint_fingerprint", "weights_changed"]

# Files in a checkpoint folder that do not change the model a loader builds from it.
_NOT_MODEL = re.compile(r"^(optimizer|scheduler|scaler|rng_state)[^/]*\.(pt|pth|bin|safetensors)$"
                        r"|^trainer_state\.json$|^training_args\.bin$|\.md$", re.IGNORECASE)
_COMMIT = re.compile(r"[0-9a-f]{40}")
_CHUNK = 1 << 20


def checkpoint_fingerprint(zoo: str | None, name: str | None,
                           previous: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The fingerprint of the checkpoint a study model names (see the module docstring).

    Args:
        zoo: an embedded model's name, or ``None``.
        name: a local checkpoint folder or a hub id (when ``zoo`` is ``None``).
        previous: the fingerprint recorded earlier; its hashes are reused for files whose stat
            has not changed.

    Returns:
        The fingerprint, or ``None`` when there is nothing to fingerprint (no such folder and not
        a hub id). A folder that cannot be read gives a fingerprint with ``"error"`` and no digest.
    """
    if zoo is not None:
        from thermo_lens import zoo as zoo_models

        return _folder("zoo", zoo_models.path(zoo), previous)
    if name is None:
        return None
    path = Path(os.path.expanduser(name))
    if path.is_dir():
        return _folder("folder", path, previous)
    if os.path.lexists(path):  # a file or a dangling link: no checkpoint a loader could read
        return None
    return _hub(name)


def weights_changed(recorded: object, now: Mapping[str, Any] | None, *, strict: bool = True) -> str | None:
    """Why the weights ``now`` differ from the ``recorded`` fingerprint, or ``None`` if they do not.

    A result recorded without a fingerprint (an older manifest, or a custom loader) is not
    questioned, nor is a hub model whose revision was unknown on either side. ``strict=False``
    (reading a study, perhaps on another machine) also accepts a checkpoint that is not there to
    compare with.
    """
    if not isinstance(recorded, Mapping) or not recorded.get("digest"):
        return None
    if not strict and (now is None or now.get("kind") != recorded.get("kind") or now.get("path") != recorded.get("path")):
        return None  # not the checkpoint it was measured on (another machine, another folder)
    if now is None or now.get("kind") != recorded.get("kind"):
        return f"{_what(recorded)} is no longer there" if now is None else f"{_what(recorded)} is now a {now.get('kind')}"
    if now.get("error"):
        return f"cannot fingerprint {_what(recorded)}: {now['error']}"
    if now["kind"] == "hub":
        if not now.get("revision") or now["digest"] == recorded["digest"]:
            return None
        return (f"the hub model {printable(now.get('repo'))} is now at revision {str(now['revision'])[:12]}, "
                f"it was measured at {str(recorded.get('revision'))[:12]}")
    if now["digest"] == recorded["digest"]:
        return None
    return f"the weights in {_what(recorded)} changed since it was measured ({_file_changes(recorded, now)})"


# ---------------------------------------------------------------------------- folders
def _folder(kind: str, path: Path, previous: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": kind, "path": str(path.resolve()) if kind == "folder" else path.name}
    old = previous.get("files") if isinstance(previous, Mapping) and previous.get("kind") == kind else None
    old = old if isinstance(old, Mapping) else {}
    files: dict[str, Any] = {}
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
        for e in entries:
            if e.name.startswith(".") or _NOT_MODEL.search(e.name):
                continue
            st = os.stat(e.path)  # follows links: a Hugging Face snapshot folder links to its blobs
            if not stat_.S_ISREG(st.st_mode):
                continue
            files[e.name] = _file(Path(e.path), st, old.get(e.name))
    except (OSError, SafeIOError) as err:
        out.update(files={}, error=os_error_reason(err) if isinstance(err, OSError) else str(err), digest=None)
        return out
    out["files"] = files
    out["digest"] = _digest({n: [f["size"], f["sha256"]] for n, f in files.items()})
    return out


def _file(path: Path, st: os.stat_result, old: object) -> dict[str, Any]:
    key = [st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
    if isinstance(old, Mapping) and old.get("size") == st.st_size and old.get("stat") == key \
            and isinstance(old.get("sha256"), str):
        return {"size": st.st_size, "sha256": old["sha256"], "stat": key}
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return {"size": st.st_size, "sha256": h.hexdigest(), "stat": key}


def _file_changes(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    a, b = recorded.get("files") or {}, now.get("files") or {}
    parts = [f"{printable(n)} added" for n in sorted(set(b) - set(a))]
    parts += [f"{printable(n)} removed" for n in sorted(set(a) - set(b))]
    parts += [f"{printable(n)} differs" for n in sorted(set(a) & set(b))
              if not isinstance(a[n], Mapping) or a[n].get("sha256") != b[n].get("sha256")]
    return ", ".join(parts[:4]) + (" ..." if len(parts) > 4 else "") if parts else "different files"


# ---------------------------------------------------------------------------- hub models
def _hub(repo: str) -> dict[str, Any]:
    revision = _cached_revision(repo)
    return {"kind": "hub", "repo": repo, "revision": revision, "digest": revision}


def _cached_revision(repo: str, ref: str = "main") -> str | None:
    """The commit ``refs/<ref>`` points to in the local Hugging Face cache (no network)."""
    try:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
    except Exception:  # noqa: BLE001 - no huggingface_hub, or an unusable cache setting
        return None
    folder = cache / ("models--" + repo.strip("/").replace("/", "--"))
    try:
        text = safe_read_text(folder / "refs" / ref, 200, what="hub cache reference").strip()
    except SafeIOError:
        return None
    return text if _COMMIT.fullmatch(text) else None


# ---------------------------------------------------------------------------- helpers
def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _what(fp: Mapping[str, Any]) -> str:
    if fp.get("kind") == "zoo":
        return f"the embedded model {printable(fp.get('path'))}"
    if fp.get("kind") == "hub":
        return f"the hub model {printable(fp.get('repo'))}"
    return printable(fp.get("path"))
