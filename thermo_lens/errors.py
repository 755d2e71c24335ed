"""Every error and warning thermo-lens raises, under one base class.

``except thermo_lens.ThermoLensError`` catches anything thermo-lens raises on purpose; each class
also subclasses the built-in it stands for, so code written against the built-ins keeps working
(``except ValueError`` still catches bad input, ``except TypeError`` a wrong type)::

    ThermoLensError
    ├── ThermoLensInputError (ValueError)          bad input: what was wrong and what to pass
    │   ├── ThermoLensInputTypeError (TypeError)   ... of the wrong type
    │   └── SafeIOError                            a path the output folder must not use
    ├── ThermoLensNumericsError (FloatingPointError)  NaN/inf in the model; names the hook point
    ├── ThermoLensHookError (RuntimeError)         a user hook failed; names the hook and batch
    ├── UnsupportedHostError (TypeError)           a TransformerLens release or class not supported
    ├── ThermoLensSchemaError (ValueError)         a stored result this version cannot read
    └── FolderLockedError (RuntimeError)           another run holds the output folder

Errors of one feature (``StudySpecError``, ``LabSpecError``, ``ReportError``,
``ThermoLensViewError`` ...) live with the feature and subclass one of these. Warnings subclass
:class:`ThermoLensWarning` (a ``UserWarning``).

This module imports nothing from thermo-lens: every other module may import it.
"""

from __future__ import annotations

__all__ = [
    "ThermoLensError",
    "ThermoLensInputError",
    "ThermoLensInputTypeError",
    "ThermoLensNumericsError",
    "ThermoLensHookError",
    "UnsupportedHostError",
    "ThermoLensSchemaError",
    "FolderLockedError",
    "SafeIOError",
    "ThermoLensWarning",
]


class ThermoLensError(Exception):
    """Base class of every error thermo-lens raises on purpose."""


class ThermoLensInputError(ThermoLensError, ValueError):
    """Bad input to thermo-lens: the message says what was wrong and what to do."""


class ThermoLensInputTypeError(ThermoLensInputError, TypeError):
    """Bad input of the wrong type (also a ``TypeError``, so ``except TypeError`` still works)."""


class ThermoLensNumericsError(ThermoLensError, FloatingPointError):
    """The model produced NaN or inf; the message names the hook point (layer)."""


class ThermoLensHookError(ThermoLensError, RuntimeError):
    """A user hook failed (or returned the wrong shape) inside a thermo-lens run; the message
    names the hook, the batch and how to fix it."""


class UnsupportedHostError(ThermoLensError, TypeError):
    """The model object comes from a TransformerLens release or class thermo-lens does not support."""


class ThermoLensSchemaError(ThermoLensError, ValueError):
    """A stored result cannot be read by this version of thermo-lens (the message says why)."""


class FolderLockedError(ThermoLensError, RuntimeError):
    """Another process holds the output folder's lock."""


class SafeIOError(ThermoLensInputError):
    """A path the tool must not write through (a link, a folder outside the output folder...)."""


class ThermoLensWarning(UserWarning):
    """Base class of thermo-lens' warnings."""
