"""The public docstrings state the real defaults.

Every public entry point (``thermo_lens.__all__``) documents each parameter that has a default and
says what the default is (``default ``X```` / ``(default)`` after the value); the documented value
must be the actual one (the last round's ``residual_gain`` docstring said ``prepend_bos`` defaulted
to ``True`` while it was ``"host"``). Run options are documented once, on RunSettings.
"""

from __future__ import annotations

import ast
import inspect
import re

import pytest

import thermo_lens as tl
from thermo_lens.core.settings import RunSettings

_ARG = re.compile(r"^\s{4,8}(\*{0,2}[A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*\*{0,2}[A-Za-z_][A-Za-z0-9_]*)*)\s*:\s", re.M)
# "default ``X``", "Default ``X``", "default: ``X``", "(default ``X``)", "``X`` (default", "``X`` (the default"
_DEFAULT = [re.compile(r"[Dd]efault:?\s+``([^`]+)``"), re.compile(r"``([^`]+)``\s*\((?:the )?default")]


def _args_section(doc: str) -> dict[str, str]:
    """``{parameter: its text}`` from a Google-style ``Args:``/``Attributes:`` section."""
    m = re.search(r"\n\s*(Args|Attributes):\n(.*?)(\n\s*\n\s*(Returns|Raises|Example|Yields|Note)\b|\Z)", doc, re.S)
    if not m:
        return {}
    body = m.group(2)
    out: dict[str, str] = {}
    starts = list(_ARG.finditer(body))
    for i, s in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(body)
        for name in re.split(r"\s*,\s*", s.group(1)):
            out[name.lstrip("*")] = body[s.end():end]
    return out


def _documented_default(text: str) -> str | None:
    for pat in _DEFAULT:
        m = pat.search(text)
        if m:
            return m.group(1)
    return None


def _is_literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return False
    return True


def _same(documented: str, actual: object) -> bool:
    try:
        value = ast.literal_eval(documented)
    except (ValueError, SyntaxError):
        return documented == repr(actual) or documented == str(actual)
    return value == actual and type(value) is type(actual) or (value is None and actual is None)


def _public_callables():
    for name in tl.__all__:
        obj = getattr(tl, name)
        if inspect.isfunction(obj):
            yield name, obj


@pytest.mark.parametrize("name,fn", list(_public_callables()), ids=[n for n, _ in _public_callables()])
def test_documented_defaults_are_the_real_ones(name, fn):
    doc = inspect.getdoc(fn) or ""
    documented = _args_section(doc)
    run_options = set(RunSettings.fields())
    problems = []
    for p in inspect.signature(fn).parameters.values():
        if p.default is inspect.Parameter.empty or p.name in ("settings",) or p.kind is p.VAR_KEYWORD:
            continue
        text = documented.get(p.name)
        if text is None:
            problems.append(f"{p.name}: not documented")
            continue
        said = _documented_default(text)
        if p.default is None:
            # None stands for a computed default, described in words ("default: the model's name")
            if "default" not in text.lower() and "none" not in text.lower():
                problems.append(f"{p.name}: the doc does not say what happens by default (None)")
            elif said is not None and _is_literal(said) and ast.literal_eval(said) is not None:
                problems.append(f"{p.name}: documented default {said} but the signature says None")
        elif said is None:
            problems.append(f"{p.name}: the doc does not state its default {p.default!r}")
        elif not _same(said, p.default):
            problems.append(f"{p.name}: documented default {said} but the signature says {p.default!r}")
    # Run options are the RunSettings fields: a docstring that names one's default must be right too.
    for opt in run_options & set(documented):
        said = _documented_default(documented[opt])
        if said is not None and not _same(said, getattr(RunSettings(), opt)):
            problems.append(f"run option {opt}: documented default {said}, actual {getattr(RunSettings(), opt)!r}")
    assert not problems, f"{name}: " + "; ".join(problems)


def test_run_settings_document_every_default():
    doc = _args_section(inspect.getdoc(RunSettings) or "")
    defaults = RunSettings()
    for field in RunSettings.fields():
        said, actual = _documented_default(doc.get(field, "")), getattr(defaults, field)
        if actual is None:
            assert "none" in doc.get(field, "").lower(), f"RunSettings.{field}: the doc does not say what None does"
            continue
        assert said is not None, f"RunSettings.{field}: the doc does not state its default"
        assert _same(said, actual), f"RunSettings.{field}: documented {said}, actual {actual!r}"
