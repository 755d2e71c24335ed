"""Safe file I/O: atomic writes that never follow symlinks, bounded reads, the folder lock."""

import errno
import os
import threading

import pandas as pd
import pytest

from thermo_lens.core import safe_io
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.safe_io import (
    TEMP_PREFIX,
    FolderLock,
    FolderLockedError,
    SafeIOError,
    atomic_write_bytes,
    atomic_write_text,
    neutralise_formulas,
    remove_stale_temps,
    safe_read_bytes,
    safe_read_text,
)


def _temps(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_atomic_write_replaces_a_symlink_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    link = out / "report.html"
    link.symlink_to(victim)
    atomic_write_text(link, "<html>")
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == "<html>"
    assert not _temps(out)


def test_atomic_write_is_readable_like_any_file_and_leaves_no_temp(tmp_path):
    p = tmp_path / "a.json"
    atomic_write_bytes(p, b"{}")
    assert p.read_bytes() == b"{}" and p.stat().st_mode & 0o044
    atomic_write_bytes(p, b"[1]")
    assert p.read_bytes() == b"[1]" and not _temps(tmp_path)


def test_disk_full_during_a_write_is_a_clear_error_and_cleans_up(tmp_path, monkeypatch):
    p = tmp_path / "a.json"
    p.write_bytes(b"old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safe_io.os, "fsync", full)
    with pytest.raises(SafeIOError, match=r"cannot write .*a\.json: no space left on the device") as ei:
        atomic_write_bytes(p, b"new")
    monkeypatch.undo()
    assert f"no space left on the device of {tmp_path};" in str(ei.value)  # names where
    assert p.read_bytes() == b"old" and not _temps(tmp_path)


def test_disk_full_is_recognised_also_when_a_library_wraps_it():
    assert safe_io.disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert safe_io.disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert safe_io.disk_full(RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                          'message: "No space left on device" })'))
    assert not safe_io.disk_full(OSError(errno.EACCES, "Permission denied"))
    assert "no space left on the device of /data/x;" in safe_io.os_error_reason(OSError(errno.ENOSPC, "x"), "/data/x")
    assert "no space left on the device of /f;" in safe_io.os_error_reason(OSError(errno.ENOSPC, "x", "/f"))
    assert "disk quota exceeded on the device" in safe_io.os_error_reason(OSError(errno.EDQUOT, "x"))


def test_a_hard_linked_output_is_replaced_not_written_through(tmp_path):
    """A summary.csv that is a hard link to a file outside the folder: the write makes a new file
    (temporary file and rename); the other name keeps its content."""
    outside = tmp_path / "outside.csv"
    outside.write_text("precious\n")
    (tmp_path / "out").mkdir()
    os.link(outside, tmp_path / "out" / "summary.csv")
    atomic_write_bytes(tmp_path / "out" / "summary.csv", b"a,b\n1,2\n")
    assert outside.read_text() == "precious\n"
    assert (tmp_path / "out" / "summary.csv").read_bytes() == b"a,b\n1,2\n"
    assert os.stat(outside).st_nlink == 1


def test_write_into_missing_folder_or_onto_a_directory(tmp_path):
    with pytest.raises(SafeIOError, match="no such file or folder"):
        atomic_write_text(tmp_path / "missing" / "x.txt", "x")
    assert not (tmp_path / "missing").exists()
    (tmp_path / "d").mkdir()
    with pytest.raises(SafeIOError, match="is a directory"):
        atomic_write_text(tmp_path / "d", "x")
    (tmp_path / "f").write_text("")
    with pytest.raises(SafeIOError, match="not a folder"):
        atomic_write_text(tmp_path / "f" / "x.txt", "x")


def test_safe_read_errors(tmp_path):
    with pytest.raises(SafeIOError, match="no such file"):
        safe_read_text(tmp_path / "nope", 10)
    with pytest.raises(SafeIOError, match="is a directory"):
        safe_read_text(tmp_path, 10, what="study spec")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(SafeIOError, match="not UTF-8 text"):
        safe_read_text(tmp_path / "latin1.txt", 100)
    (tmp_path / "big.txt").write_bytes(b"x" * 101)
    with pytest.raises(SafeIOError, match="larger than 100 bytes"):
        safe_read_bytes(tmp_path / "big.txt", 100)
    assert safe_read_bytes(tmp_path / "big.txt", 101) == b"x" * 101
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfname = 1")
    assert safe_read_text(tmp_path / "bom.txt", 100) == "name = 1"
    (tmp_path / "link").symlink_to(tmp_path / "bom.txt")
    assert safe_read_text(tmp_path / "link", 100) == "name = 1"
    with pytest.raises(SafeIOError, match="symbolic link"):
        safe_read_text(tmp_path / "link", 100, follow_symlinks=False)
    assert issubclass(SafeIOError, ThermoLensInputError)


def test_unreadable_file(tmp_path, monkeypatch):
    p = tmp_path / "spec.toml"
    p.write_text("x")
    real_open = os.open

    def denied(path, *a, **k):
        if str(path) == str(p):
            raise PermissionError(errno.EACCES, "Permission denied", str(p))
        return real_open(path, *a, **k)

    monkeypatch.setattr(safe_io.os, "open", denied)
    with pytest.raises(SafeIOError, match="cannot read study spec .*permission denied"):
        safe_read_text(p, 10, what="study spec")


def test_lock_refuses_a_symlink_and_is_removed_after_use(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(victim)
    with pytest.raises(SafeIOError, match="symbolic link"):
        with FolderLock(out):
            pass
    assert victim.read_text() == "precious"
    (out / ".lock").unlink()
    with FolderLock(out) as lock:
        assert (out / ".lock").read_text() == str(os.getpid())
        with pytest.raises(FolderLockedError, match=f"pid {os.getpid()}"):
            with FolderLock(out):
                pass
        assert lock.fd is not None
    assert not (out / ".lock").exists()


def test_lock_holders_never_overlap(tmp_path):
    """Many threads racing for the lock (which is removed on release): never two holders."""
    inside, overlaps, got = [0], [0], [0]
    guard = threading.Lock()

    def worker():
        for _ in range(30):
            try:
                with FolderLock(tmp_path):
                    with guard:
                        inside[0] += 1
                        overlaps[0] += inside[0] > 1
                        got[0] += 1
                    with guard:
                        inside[0] -= 1
            except FolderLockedError:
                pass

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps[0] == 0 and got[0] > 0
    assert not (tmp_path / ".lock").exists()


def test_remove_stale_temps_only_removes_ours(tmp_path):
    (tmp_path / f"{TEMP_PREFIX}a.json.abc.tmp").write_text("partial")
    (tmp_path / ".other.tmp").write_text("not ours")
    (tmp_path / "a.json").write_text("{}")
    assert remove_stale_temps(tmp_path) == [f"{TEMP_PREFIX}a.json.abc.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp", "a.json"]


def test_neutralise_formulas_keeps_numbers_numeric():
    df = pd.DataFrame({
        "model": ["=HYPERLINK(\"http://x\")", "+1+2", "-cmd", "@SUM(A1)", "\tx", "plain", "-1.5"],
        "gain": [-0.5, 1.0, -2.0, 3.0, 0.0, 1.5, -7.25],
    })
    out = neutralise_formulas(df)
    assert out["model"].tolist() == ["'=HYPERLINK(\"http://x\")", "'+1+2", "'-cmd", "'@SUM(A1)", "'\tx", "plain", "-1.5"]
    assert out["gain"].tolist() == df["gain"].tolist() and pd.api.types.is_float_dtype(out["gain"])
    assert df["model"][0].startswith("=")  # the input frame is not modified
    text = out.to_csv(index=False)
    assert ",-0.5" in text and "\n'=HYPERLINK" in text.replace('"', "")


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "spec.toml"
    os.mkfifo(fifo)
    with pytest.raises(SafeIOError, match="not a regular file"):
        safe_read_text(fifo, 100, what="study spec")


def test_result_to_json_path_is_atomic_and_does_not_follow_symlinks(tmp_path):
    from thermo_lens.stats import summarize

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "result.json"
    link.symlink_to(victim)
    s = summarize([1.0, 2.0, 3.0])
    s.to_json(link)
    assert victim.read_text() == "precious" and not link.is_symlink()
    assert type(s).from_json(link.read_text()).mean == s.mean


def test_a_line_break_followed_by_a_formula_is_neutralised_too():
    df = pd.DataFrame({"lab": ["x\r=HYPERLINK(\"http://evil\")", "a\n+1", "\r\n@SUM(1)", "ok\nfine", "-2"],
                       "gain": [1.0, 2.0, 3.0, 4.0, 5.0]})
    out = neutralise_formulas(df)
    assert out["lab"].tolist() == ["x\r'=HYPERLINK(\"http://evil\")", "a\n'+1", "'\r\n'@SUM(1)", "ok\nfine", "-2"]
    for line in out.to_csv(index=False).replace('"', "").splitlines():
        assert not line.startswith(("=", "+", "@")), line


def test_control_characters_in_cells_are_escaped():
    out = neutralise_formulas(pd.DataFrame({"lab": ["a\x1b]0;pwned\x07b", "\x1b[2J"], "g": [1.0, 2.0]}))
    assert out["lab"].tolist() == ["a\\x1b]0;pwned\\x07b", "\\x1b[2J"]
    assert "\x1b" not in out.to_csv(index=False)


def test_printable_escapes_what_could_drive_a_terminal():
    from thermo_lens.core.safe_io import printable

    assert printable("plain /path/ü ok") == "plain /path/ü ok"
    assert printable("a\x1b[2Jb\u202ec\rd") == "a\\x1b[2Jb\\u202ec\\rd"
    assert printable("one\ntwo\tx\x07", keep_newlines=True) == "one\ntwo\tx\\x07"
    assert printable("one\ntwo") == "one\\ntwo"


def test_a_path_with_a_nul_character_is_a_clear_error(tmp_path):
    with pytest.raises(SafeIOError, match="NUL character"):
        safe_read_text(str(tmp_path / "a\x00b"), 100, what="study spec")
