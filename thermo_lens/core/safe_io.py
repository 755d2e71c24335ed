"""Safe file I/O: atomic writes that never follow a symlink, bounded reads with clear errors.

Every file thermo-lens writes (study results, the manifest, ``summary.csv``, the report) goes
through :func:`atomic_write_bytes` / :func:`atomic_write_text`:

* the data goes to a temporary file made by :func:`tempfile.mkstemp` *in the target folder*
  (``O_CREAT | O_EXCL``: it never opens an existing file or a symlink), is flushed and fsynced,
  then renamed over the target with :func:`os.replace`. ``rename`` replaces a symlink at the
  target instead of following it, so a planted ``report.html -> ~/.bashrc`` is replaced, and
  ``~/.bashrc`` is never touched. Readers see the old file or the new one, never a part;
* a failed write (disk full, permission) removes its temporary file and raises
  :class:`SafeIOError` naming the file and the reason;
* temporary names start with :data:`TEMP_PREFIX`; a killed process can leave one behind, and
  :func:`remove_stale_temps` (called by a study run while it holds the folder's lock) deletes
  them.

:func:`safe_read_text` / :func:`safe_read_bytes` read at most ``limit`` bytes and turn every
failure (missing, a directory, unreadable, too large, not UTF-8, a symlink where one is refused)
into a :class:`SafeIOError` that says which file and what to do. A UTF-8 byte-order mark is
dropped.

:func:`printable` escapes control characters (``ESC`` becomes ``\\x1b``) in text that came from
a user or a file before it is shown on a terminal, and :func:`neutralise_formulas` makes a table's
text cells safe to open in a spreadsheet.

:func:`make_folder` makes (or reuses) a subfolder of an output folder one name at a time, and
refuses a symbolic link or a file at any of those names: a planted ``figures -> /elsewhere`` is
never written through.

:class:`FolderLock` is an exclusive, non-blocking ``flock`` on ``DIR/.lock``, opened with
``O_NOFOLLOW``, removed again when the holder is done.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from thermo_lens.core.errors import FolderLockedError, SafeIOError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "SafeIOError",
    "TEMP_PREFIX",
    "atomic_write_bytes",
    "atomic_write_text",
    "safe_read_bytes",
    "safe_read_text",
    "sha256_nofollow",
    "remove_stale_temps",
    "FolderLock",
    "FolderLockedError",
    "make_folder",
    "neutralise_formulas",
    "printable",
    "os_error_reason",
    "disk_full",
]

TEMP_PREFIX = ".thermo-lens-tmp."
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """``str(text)`` with every character that could drive a terminal escaped as Python writes it
    (``ESC`` -> ``\\x1b``, a right-to-left override -> ``\\u202e``): C0/C1 controls, format
    characters and separators other than a plain space. ``keep_newlines``: ``\\n`` and ``\\t`` stay
    (multi-line messages); a carriage return is always escaped (it would overwrite the line).
    """
    s = str(text)
    if s.isprintable():
        return s
    keep = "\n\t" if keep_newlines else ""
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in s)


def _reason(e: OSError, where: str | os.PathLike | None = None) -> str:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        place = where if where is not None else e.filename
        on = f"the device of {printable(place)[:300]}" if place not in (None, "") else "the device"
        what = "no space left on" if e.errno == errno.ENOSPC else "disk quota exceeded on"
        return f"{what} {on}; free some space and rerun"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if e.errno == errno.EROFS:
        return "read-only file system"
    if e.errno == errno.ELOOP:
        return "it is a symbolic link, which thermo-lens does not follow here; remove the link"
    if e.errno == errno.EISDIR:
        return "it is a directory, not a file"
    if e.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a folder"
    if e.errno == errno.ENOENT:
        return "no such file or folder"
    return e.strerror or type(e).__name__


def os_error_reason(e: OSError, where: str | os.PathLike | None = None) -> str:
    """What an ``OSError`` means for the user, in words ("no space left on the device of
    ``where``; free some space and rerun", "permission denied", "it is a symbolic link ...").
    ``where``: the file or folder being written (default: the error's own file name)."""
    return _reason(e, where)


def disk_full(e: BaseException) -> bool:
    """Whether ``e`` says the disk is full: an ``OSError`` ENOSPC/EDQUOT, or a library's own error
    that wraps one (safetensors raises ``SafetensorError("... No space left on device ...")``)."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(e)
    return "No space left on device" in text or "StorageFull" in text or "Disk quota exceeded" in text


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, never following a symlink at ``path``.

    The folder must exist. Raises :class:`SafeIOError` (the temporary file is removed).
    """
    path = Path(path)
    folder = path.parent
    if path.is_dir() and not path.is_symlink():
        raise SafeIOError(f"cannot write {path}: it is a directory; choose a file name")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{TEMP_PREFIX}{path.name[:80]}.", suffix=".tmp")
    except OSError as e:
        raise SafeIOError(f"cannot write {path}: {_reason(e, folder)}") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise SafeIOError(f"cannot write {path}: {_reason(e, folder)}") from None
        raise
    _fsync_dir(folder)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | _CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_folder(root: str | os.PathLike, *parts: str) -> Path:
    """``root/part0/part1/...``, each part made if missing and refused if it is a symbolic link or a
    file (``root`` itself is taken as it is: the caller checked it). Returns the path.

    Raises:
        SafeIOError: naming the link or file and what to do.
    """
    path = Path(root)
    for part in parts:
        if not part or part in (".", "..") or "/" in part or "\x00" in part:
            raise SafeIOError(f"cannot use {printable(path)}/{printable(part)}: not a plain folder name")
        path = path / part
        try:
            os.mkdir(path, 0o777)
            continue
        except FileExistsError:
            pass
        except OSError as e:
            raise SafeIOError(f"cannot create folder {printable(path)}: {_reason(e)}") from None
        try:
            import stat

            st = os.lstat(path)
        except OSError as e:
            raise SafeIOError(f"cannot use folder {printable(path)}: {_reason(e)}") from None
        if stat.S_ISLNK(st.st_mode):
            raise SafeIOError(f"cannot use {printable(path)}: it is a symbolic link, which thermo-lens does not "
                              "follow inside its output folder; remove the link and rerun")
        if not stat.S_ISDIR(st.st_mode):
            raise SafeIOError(f"cannot use {printable(path)}: it is a file, where thermo-lens keeps a folder; "
                              "move it away and rerun")
    return path


@contextlib.contextmanager
def _open_regular(path: Path, what: str, follow_symlinks: bool) -> Iterator[int]:
    """A read-only descriptor of the regular file ``path``, closed on exit; opening it, a folder, a
    FIFO, a device or any ``OSError`` while it is open: :class:`SafeIOError` naming ``what``."""
    import stat

    # O_NONBLOCK: opening a FIFO must not hang waiting for a writer (it is refused below).
    flags = os.O_RDONLY | _CLOEXEC | getattr(os, "O_NONBLOCK", 0) | (0 if follow_symlinks else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise SafeIOError(f"cannot read {what} {printable(path)}: {_reason(e)}") from None
    except ValueError:  # os.open refuses a path with a NUL character
        raise SafeIOError(f"cannot read {what} {printable(path)}: the path contains a NUL character") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise SafeIOError(f"cannot read {what} {printable(path)}: it is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise SafeIOError(f"cannot read {what} {printable(path)}: not a regular file")
        yield fd
    except OSError as e:
        if isinstance(e, SafeIOError):
            raise
        raise SafeIOError(f"cannot read {what} {printable(path)}: {_reason(e)}") from None
    finally:
        os.close(fd)


def safe_read_bytes(path: str | os.PathLike, limit: int, *, follow_symlinks: bool = True,
                    what: str = "file") -> bytes:
    """At most ``limit`` bytes of ``path``; :class:`SafeIOError` if it is larger or unreadable.

    ``follow_symlinks=False`` refuses a symlink (files thermo-lens itself wrote into an output
    folder are never links). ``what`` names the file in errors ("study spec", "manifest").
    """
    path = Path(path)
    with _open_regular(path, what, follow_symlinks) as fd:
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise SafeIOError(f"{what} {printable(path)} is larger than {limit:,} bytes; is it the right file?")
        return b"".join(chunks)


def safe_read_text(path: str | os.PathLike, limit: int, *, follow_symlinks: bool = True,
                   what: str = "file") -> str:
    """:func:`safe_read_bytes` decoded as UTF-8 (a leading byte-order mark is dropped)."""
    data = safe_read_bytes(path, limit, follow_symlinks=follow_symlinks, what=what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SafeIOError(f"{what} {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None


def sha256_nofollow(path: str | os.PathLike, *, what: str = "file") -> str:
    """SHA-256 (hex) of the regular file ``path``, read in chunks and never through a symbolic link
    at its last component (a link, a folder, a FIFO or an unreadable file: :class:`SafeIOError`)."""
    import hashlib

    with _open_regular(Path(path), what, follow_symlinks=False) as fd:
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()


def remove_stale_temps(folder: str | os.PathLike) -> list[str]:
    """Delete temporary files a killed writer left in ``folder``; returns their names.

    Call only while holding the folder's :class:`FolderLock` (no live writer then).
    """
    removed: list[str] = []
    try:
        entries = list(os.scandir(os.fspath(folder)))
    except OSError:
        return removed
    for e in entries:
        if e.name.startswith(TEMP_PREFIX) and e.name.endswith(".tmp") and not e.is_dir(follow_symlinks=False):
            try:
                os.unlink(e.path)
                removed.append(e.name)
            except OSError:
                pass
    return removed


class FolderLock:
    """Exclusive, non-blocking lock on ``folder/.lock`` (released when the process dies).

    The lock file is opened with ``O_NOFOLLOW`` (a planted symlink is refused, never written
    through) and holds the holder's PID. It is removed on release; a process that opened the
    old file before the removal notices (the path no longer names the file it locked) and
    retries, so two holders can never coexist.
    """

    NAME = ".lock"

    def __init__(self, folder: str | os.PathLike, *, what: str = "thermo-lens run",
                 error: type[FolderLockedError] = FolderLockedError):
        self.path = Path(folder) / self.NAME
        self.fd: int | None = None
        self.what, self.error = what, error

    def __enter__(self) -> "FolderLock":
        import fcntl

        for _ in range(100):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o644)
            except OSError as e:
                raise SafeIOError(f"cannot lock {self.path.parent}: {_reason(e)}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.pread(fd, 100, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    raise self.error(
                        f"another {self.what} (pid {holder[:20]}) is using {self.path.parent}; "
                        "wait for it to finish or use another output folder") from None
                raise SafeIOError(f"cannot lock {self.path.parent}: {_reason(e)}") from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path, follow_symlinks=False))
            except OSError:
                same = False
            if not same:  # the previous holder removed it after we opened it: try again
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            self.fd = fd
            return self
        raise FolderLockedError(f"could not lock {self.path.parent}: the lock file keeps changing")

    def __exit__(self, *exc: object) -> None:
        import fcntl

        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # while still holding it: see the class docstring
        except OSError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# A line break inside a cell followed by a formula character: a reader that splits lines (or a
# spreadsheet that takes the cell apart) would see the formula at the start of a line.
_FORMULA_AFTER_BREAK = re.compile(r"([\r\n])(?=[=+\-@\t])")
# Control characters other than tab, CR and LF (which CSV quoting carries): escaped, so that
# ``cat summary.csv`` cannot drive the terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def neutralise_formulas(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of a DataFrame whose text cells cannot run as spreadsheet formulas.

    A text cell starting with ``=``, ``+``, ``-``, ``@``, tab or carriage return gets a leading
    ``'`` (OWASP's advice for CSV injection), unless the whole cell is a number (``"-1.5"``); so
    does every line of a multi-line cell (``"x\\r=cmd"`` becomes ``"x\\r'=cmd"``). Other control
    characters (``ESC``, ``BEL``...) are escaped as ``\\x1b``. Numeric columns are untouched, so
    negative numbers stay numbers.
    """
    def fix(v: object) -> object:
        if not isinstance(v, str):
            return v
        if _CONTROL.search(v):
            v = _CONTROL.sub(lambda m: repr(m.group())[1:-1], v)
        if "\r" in v or "\n" in v:
            v = _FORMULA_AFTER_BREAK.sub(r"\1'", v)
        if v.startswith(_FORMULA_START):
            try:
                float(v)
                return v
            except ValueError:
                return "'" + v
        return v

    def _is_numeric(series: pd.Series) -> bool:
        import pandas as pd

        return pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)

    out = frame.copy()
    for col in out.columns:
        if not _is_numeric(out[col]):
            out[col] = out[col].map(fix).astype(object)
    if any(isinstance(c, str) and fix(c) != c for c in out.columns):
        out.columns = [fix(c) for c in out.columns]
    return out
