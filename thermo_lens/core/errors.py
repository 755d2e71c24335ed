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
    "PromptTooShortError",
    "ThermoLensNumericsError",
    "ThermoLensHookError",
    "UnsupportedHostError",
    "ThermoLensSchemaError",
    "FolderLockedError",
    "SafeIOError",
    "ThermoLensWarning",
    "readable",
]


#: The longest unbroken run of characters an error message keeps (an echoed input: a value, a name),
#: and the longest message; what is cut is said where it was.
MAX_RUN = 160
MAX_MESSAGE = 4000


def readable(message: str) -> str:
    """``message`` at a readable length: every unbroken run of characters longer than
    :data:`MAX_RUN` (an echoed 1 MB string, say) keeps its head and tail around a note of how much
    was cut, and a message still longer than :data:`MAX_MESSAGE` keeps its start and end."""
    if len(message) <= MAX_RUN:
        return message
    out, start = [], 0
    n = len(message)
    while start < n:  # runs of non-space characters, one linear scan
        end = start
        while end < n and not message[end].isspace():
            end += 1
        run = message[start:end]
        if len(run) > MAX_RUN:
            run = f"{run[:MAX_RUN // 2]}...({len(run) - MAX_RUN + 20} characters cut)...{run[-(MAX_RUN // 2 - 20):]}"
        out.append(run)
        ws = end
        while ws < n and message[ws].isspace():
            ws += 1
        out.append(message[end:ws])
        start = ws
    text = "".join(out)
    if len(text) > MAX_MESSAGE:
        cut = len(text) - MAX_MESSAGE
        text = f"{text[:MAX_MESSAGE - 1000]} ...({cut} characters cut)... {text[-1000:]}"
    return text


class ThermoLensError(Exception):
    """Base class of every error thermo-lens raises on purpose. Its message is kept readable
    (:func:`readable`): an input echoed into it is cut, never printed in full."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str) and len(args[0]) > MAX_RUN:
            args = (readable(args[0]),)
        super().__init__(*args)


class ThermoLensInputError(ThermoLensError, ValueError):
    """Bad input to thermo-lens: the message says what was wrong and what to do."""


class PromptTooShortError(ThermoLensInputError):
    """A prompt has fewer real tokens than the measurement needs (e.g. 2 where the token scope
    drops position 0)."""


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
