"""The tests' own layout: every test file sits in a folder named after its subject, each such folder
is on pytest's ``pythonpath`` (pyproject.toml), and file names are unique across folders.

The folders have no ``__init__.py``: pytest imports each test file by its file name, so two files of
one name in two folders would collide, and a test module that imports another (``from test_gain
import ...``) or a shared helper (``from conftest import ARCHS``) finds it through that path.
"""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def _subject_folders() -> list[Path]:
    return sorted(p for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))


def test_every_test_file_is_in_a_subject_folder():
    assert not sorted(p.name for p in TESTS.glob("test_*.py")), "move it into a folder of tests/ named after its subject"
    assert not sorted(str(p.relative_to(TESTS)) for p in TESTS.glob("*/*/**/test_*.py")), "one folder level under tests/"
    assert len(_subject_folders()) >= 10


def test_every_subject_folder_is_on_the_pytest_path():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert options["testpaths"] == ["tests"]
    assert sorted(options["pythonpath"]) == sorted(["tests"] + [f"tests/{p.name}" for p in _subject_folders()])


def test_test_file_names_are_unique_and_no_folder_is_a_package():
    names = [p.name for p in TESTS.glob("*/test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
    assert not sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("__init__.py"))
