"""The study's output folder: thermo-lens writes only into a folder that is new, empty, or already
a thermo-lens folder (it holds a thermo-lens ``manifest.json``).

A folder of the user's own files is refused before anything is written, so their ``summary.csv``
or ``report.html`` is never replaced; so are an empty name (it would mean the current folder), a
name with a NUL character, a file, and a symbolic link to a folder that does not exist. A link to
an existing folder is followed (``--out results`` pointing at a scratch disk is a choice); links
planted *inside* the folder are never written through (:mod:`thermo_lens.core.safe_io`).
"""

from __future__ import annotations

import os
from pathlib import Path

from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.safe_io import TEMP_PREFIX, FolderLock, SafeIOError, os_error_reason, printable
from thermo_lens.experiments.study.manifest import MANIFEST, read_manifest

__all__ = ["StudyFolderError", "output_path", "prepare_out", "check_owned", "check_out", "make_out", "foreign_entries"]

# Left by a thermo-lens run before its manifest exists (the lock; temporary files, TEMP_PREFIX),
# or by the desktop: a folder holding only these is as good as empty.
_OURS = {FolderLock.NAME}
_DESKTOP = {".DS_Store", "Thumbs.db", "desktop.ini", ".ipynb_checkpoints"}


class StudyFolderError(ThermoLensInputError):
    """The output folder cannot be used: empty name, a file, a dangling link, or a folder of
    files thermo-lens did not write."""


def output_path(value: object, what: str = "output folder") -> Path:
    """``value`` as the path of an output folder: a non-empty ``str`` or path without NUL."""
    if not isinstance(value, (str, os.PathLike)):
        raise StudyFolderError(f"{what} must be a folder name (str or path), got {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str):
        raise StudyFolderError(f"{what} must be a text path, got {type(text).__name__}")
    if not text.strip():
        raise StudyFolderError(f"the {what} name is empty (that would be the current folder); give a name")
    if "\x00" in text:
        raise StudyFolderError(f"the {what} name {printable(text)} contains a NUL character")
    return Path(text)


def prepare_out(out_dir: str | os.PathLike[str]) -> Path:
    """Check the output folder (see the module docstring), create it if needed; returns its path.

    Raises:
        StudyFolderError: empty name, a file, a dangling link, or a folder of other files.
        StudyManifestError: its ``manifest.json`` is corrupt or not thermo-lens'.
        thermo_lens.core.safe_io.SafeIOError: it cannot be created or is not writable.
    """
    out = check_out(out_dir)
    if out.is_dir():
        check_owned(out)
    return make_out(out)


def check_out(out_dir: object, what: str = "output folder") -> Path:
    """``out_dir`` as an output folder's path, refused when empty, a file or a dangling link (a
    folder's contents are the caller's to check)."""
    out = output_path(out_dir, what)
    shown = printable(out)
    if out.is_symlink() and not out.exists():
        raise StudyFolderError(f"output folder {shown} is a symbolic link to {printable(os.readlink(out))}, which "
                               "does not exist; create that folder or choose another output folder")
    if os.path.lexists(out) and not out.is_dir():
        raise StudyFolderError(f"output folder {shown} is a file; choose a folder name")
    return out


def make_out(out: Path) -> Path:
    """Create the output folder ``out`` if needed; it must be writable."""
    shown = printable(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SafeIOError(f"cannot create output folder {shown}: {os_error_reason(e)}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise SafeIOError(f"output folder {shown} is not writable; choose another output folder")
    return out


def check_owned(out: Path) -> None:
    """Refuse a folder that holds files thermo-lens did not write (see the module docstring)."""
    if os.path.lexists(out / MANIFEST):
        read_manifest(out)  # a corrupt, linked or foreign manifest.json is refused, naming the fix
        return
    foreign = foreign_entries(out)
    if foreign:
        names = ", ".join(printable(n)[:60] for n in sorted(foreign)[:5]) + (" ..." if len(foreign) > 5 else "")
        raise StudyFolderError(
            f"output folder {printable(out)} already holds files thermo-lens did not write ({names}); "
            f"choose a new or empty folder, or the folder of an earlier thermo-lens run (with its {MANIFEST})")


def foreign_entries(out: Path, limit: int = 6) -> list[str]:
    """Up to ``limit`` names in ``out`` that no thermo-lens run leaves there before its first result
    (the lock, temporary files, desktop litter)."""
    foreign: list[str] = []
    try:
        with os.scandir(out) as entries:
            for e in entries:
                if e.name in _OURS or e.name in _DESKTOP or e.name.startswith(TEMP_PREFIX):
                    continue
                foreign.append(e.name)
                if len(foreign) >= limit:
                    break
    except OSError as e:
        raise SafeIOError(f"cannot read output folder {printable(out)}: {os_error_reason(e)}") from None
    return foreign
