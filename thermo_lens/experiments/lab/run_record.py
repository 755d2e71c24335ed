"""A lab run folder's record of what it wrote, and reading those files back only when they match.

``runs/<run>/record.json`` holds the SHA-256 of every file of every checkpoint the run wrote
(``step_NNNNNN/<file>``) and of its training state (``train_state.pt``)::

    {"thermo_lens_run": 2,
     "files": {"step_000006/model.safetensors": "<sha256>", "step_000006/metrics.json": ..., ...},
     "train_state": ["<sha256 of the newest>", "<sha256 of the one before>"]}

A file is read back (a checkpoint profiled, its ``metrics.json`` read, the training state
resumed) only when it is a regular file reached without a symbolic link (opened with
``O_NOFOLLOW``; a checkpoint folder is checked with ``lstat``) and its SHA-256 is the recorded one.
A planted file or link is never loaded: a checkpoint that fails the check is trained anew (the
link is removed, never followed), a training state that fails it is refused with the reason.

Write order (a kill at any point leaves a folder this module accepts or retrains): a checkpoint is
built in a temporary folder, its files hashed, the record rewritten (the new training state's
SHA-256 first, the previous one kept beside it), then the folder renamed into place and the
training state replaced. Until the state file is replaced, the older state is still a recorded one.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Callable

from thermo_lens.core.safe_io import (SafeIOError, atomic_write_bytes, printable, safe_read_bytes, safe_read_text,
                                 sha256_nofollow)

__all__ = ["RECORD", "TABLES_RECORD", "RECORD_VERSION", "read_record", "write_record", "checkpoint_problem", "read_checkpoint_file",
           "folder_hashes"]

RECORD = "record.json"
#: In the lab folder: the SHA-256 of ``runs.csv`` and ``effects.csv`` as the lab wrote them.
TABLES_RECORD = "tables.json"
RECORD_VERSION = 2
_RECORD_LIMIT = 16 << 20


def read_json_record(path: Path, limit: int, what: str, is_valid: Callable[[dict[str, Any]], bool],
                     refuse: Callable[[], Exception]) -> dict[str, Any] | None:
    """The JSON object thermo-lens wrote at ``path``, ``None`` when there is nothing there.

    Raises:
        SafeIOError: ``path`` is a link, unreadable or larger than ``limit`` bytes.
        refuse(): it is not JSON, not an object, or an object ``is_valid`` refuses.
    """
    if not os.path.lexists(path):
        return None
    text = safe_read_text(path, limit, follow_symlinks=False, what=what)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not is_valid(data):
        raise refuse()
    return data


def read_record(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The run's record, ``None`` when there is none (a run from before records, or a new one).

    Raises:
        SafeIOError: the record is a link, unreadable, or not a thermo-lens run record.
    """
    path = Path(run_dir) / RECORD

    def is_valid(data: dict[str, Any]) -> bool:
        return (data.get("thermo_lens_run") == RECORD_VERSION
                and isinstance(data.get("files"), dict) and isinstance(data.get("train_state"), list)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in data["files"].items())
                and all(isinstance(v, str) for v in data["train_state"]))

    return read_json_record(path, _RECORD_LIMIT, "run record", is_valid, lambda: SafeIOError(
        f"{printable(path)} is not a thermo-lens run record; delete the run folder {printable(Path(run_dir))} "
        "to train the run anew"))


def write_record(run_dir: str | os.PathLike, record: dict[str, Any]) -> None:
    atomic_write_bytes(Path(run_dir) / RECORD, json.dumps(dict(record, thermo_lens_run=RECORD_VERSION),
                                                          indent=1, sort_keys=True).encode() + b"\n")


def folder_hashes(folder: Path, prefix: str) -> dict[str, str]:
    """``{prefix/name: sha256}`` of every file directly in ``folder`` (a folder thermo-lens just built)."""
    return {f"{prefix}/{e.name}": sha256_nofollow(e.path, what="checkpoint file")
            for e in sorted(os.scandir(folder), key=lambda e: e.name)}


def checkpoint_problem(run_dir: str | os.PathLike, name: str, record: dict[str, Any] | None) -> str | None:
    """Why the checkpoint folder ``run_dir/name`` is not one this run wrote (``None``: it is).

    It must be a folder, not a link; hold exactly the files recorded for it, each a regular file
    (not a link) whose SHA-256 is the recorded one.
    """
    folder = Path(run_dir) / name
    try:
        st = os.lstat(folder)
    except OSError:
        return f"{name} is missing"
    if stat.S_ISLNK(st.st_mode):
        return f"{name} is a symbolic link, not a checkpoint this run wrote"
    if not stat.S_ISDIR(st.st_mode):
        return f"{name} is not a folder"
    if record is None:
        return f"{name} has no SHA-256 record (written by an earlier thermo-lens, or not by thermo-lens)"
    want = {k: v for k, v in record["files"].items() if k.startswith(name + "/")}
    if not want:
        return f"{name} is not in the run's record"
    try:
        have = {f"{name}/{e.name}" for e in os.scandir(folder)}
    except OSError as e:
        return f"{name} cannot be listed ({e.strerror})"
    if have != set(want):
        extra = sorted(have - set(want))
        return f"{name} holds other files than the ones recorded ({', '.join(map(printable, extra[:3])) or 'some missing'})"
    for rel, sha in want.items():
        try:
            if sha256_nofollow(Path(run_dir) / rel, what="checkpoint file") != sha:
                return f"{rel} does not match its recorded SHA-256 (corrupt, edited or replaced)"
        except SafeIOError as e:
            return str(e)
    return None


def read_checkpoint_file(run_dir: str | os.PathLike, rel: str, record: dict[str, Any] | None, limit: int) -> bytes:
    """The bytes of ``run_dir/rel`` (a file of a checkpoint), read without following a link and
    checked against the record.

    Raises:
        SafeIOError: a link, not recorded, or not matching its SHA-256.
    """
    import hashlib

    path = Path(run_dir) / rel
    folder = Path(run_dir) / rel.split("/")[0]
    if os.path.islink(folder):
        raise SafeIOError(f"cannot read {printable(path)}: {printable(folder.name)} is a symbolic link, which "
                          "thermo-lens does not follow in a run folder; remove the link and rerun")
    data = safe_read_bytes(path, limit, follow_symlinks=False, what="checkpoint file")
    want = None if record is None else record["files"].get(rel)
    if want is None or hashlib.sha256(data).hexdigest() != want:
        raise SafeIOError(f"{printable(path)} is not the file this run wrote (its SHA-256 is not in the run's "
                          f"record); delete {printable(folder)} and rerun to train it anew")
    return data
