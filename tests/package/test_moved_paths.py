"""The module paths from before the package moved into layer folders still import, for one release.

``import thermo_lens.gain`` must give the very module ``thermo_lens.measures.gain`` (one module
object: ``isinstance`` checks and ``mock.patch`` targets keep working) and say where it moved.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import thermo_lens
from thermo_lens import _moved


@pytest.mark.parametrize("old", ["thermo_lens.gain", "thermo_lens.model", "thermo_lens.spectral.kernels",
                                 "thermo_lens.sweeps", "thermo_lens.paired", "thermo_lens.study.spec"])
def test_an_old_path_is_the_moved_module_with_a_warning(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported earlier in the session: import it afresh
    new = _moved.new_name(old)
    assert new is not None and new != old
    real = importlib.import_module(new)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        alias = importlib.import_module(old)
    assert alias is real


def test_old_from_imports_give_the_same_objects():
    from thermo_lens.core.model import ModelView

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from thermo_lens.model import ModelView as OldModelView
    assert OldModelView is ModelView is thermo_lens.ModelView


def test_paths_that_did_not_move_are_left_alone():
    assert _moved.new_name("thermo_lens.views") is None
    assert _moved.new_name("thermo_lens.core.gain") is None
    assert _moved.new_name("numpy.linalg") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("thermo_lens.no_such_module")


def test_every_moved_name_exists_in_its_folder():
    for name, folder in _moved.MOVED.items():
        assert importlib.import_module(f"thermo_lens.{folder}.{name}")


def test_front_door_attributes_reach_the_folders_without_a_warning():
    from thermo_lens.experiments import sweeps
    from thermo_lens.measures import gain

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert thermo_lens.sweeps is sweeps and thermo_lens.gain is gain  # tl.sweeps.LogitDifference ...
