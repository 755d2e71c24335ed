"""What a study measures: :class:`ModelSpec` (one model) and :class:`StudySpec` (models + settings).

Both validate every field on construction (:mod:`thermo_lens.core.validate`), before any model is
loaded or any file written; a spec file is parsed into them by :mod:`thermo_lens.experiments.study.spec_file`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from thermo_lens.core import validate as V
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.validate import validates_own_inputs

if TYPE_CHECKING:
    import torch

    from thermo_lens.core.tokens import BosMode

__all__ = ["ModelSpec", "StudySpec", "StudySpecError", "SETTINGS_KEYS", "StudySettings", "ModelOptions", "StudyPrompts",
           "default_id", "model_from_name"]

#: The measurement settings every profile of a study shares (they key its results).
SETTINGS_KEYS = ("prompts", "prepend_bos", "token_scope", "batch_size", "truncate")
MAX_ERROR = 600  # characters of a spec error message

#: A study's prompts: a built-in set's name, a list of prompts, or ``{group: [prompt, ...]}``
#: (:func:`thermo_lens.core.prompts.as_prompt_set`).
StudyPrompts = str | Sequence[str] | Mapping[str, Sequence[str]]


class StudySettings(TypedDict, total=False):
    """The measurement settings of :data:`SETTINGS_KEYS` (every profile of a study shares them)."""

    prompts: StudyPrompts
    prepend_bos: BosMode
    token_scope: str
    batch_size: int
    truncate: bool


class ModelOptions(TypedDict, total=False):
    """The optional :class:`ModelSpec` fields :func:`model_from_name` passes on."""

    lab: str | None
    family: str | None
    twin_of: str | None
    dtype: str | torch.dtype | None
    device: str | torch.device | None
    device_map: str | dict[str, int | str] | None
    num_gpus: int | float
    threads: int | None
    trust_remote_code: bool


class StudySpecError(ThermoLensInputError):
    """A malformed study spec; the message names the file, the line and the field."""


@validates_own_inputs  # every field is checked in __post_init__, with the messages users see
@dataclass(frozen=True)
class ModelSpec:
    """One model of a study. Exactly one of ``name`` (hub name, local directory or zoo name) and
    ``zoo``; a ``name`` that is an embedded model's name (and no local path) means that zoo model.

    ``id`` names the result file ``<id>.json``: letters, digits, ``. _ - + =``, not a
    reserved name (``manifest``, ``summary``, ``report``, ``lock``). Every field is validated on
    construction (:mod:`thermo_lens.core.validate`), before any model is loaded.
    """

    id: str
    name: str | None = None
    zoo: str | None = None
    lab: str | None = None
    family: str | None = None
    twin_of: str | None = None
    dtype: str | torch.dtype | None = None
    device: str | torch.device | None = None
    device_map: str | dict[str, int | str] | None = None
    num_gpus: int | float = 0
    threads: int | None = None
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        V.file_id(self.id, "id")
        if (self.name is None) == (self.zoo is None):
            raise ThermoLensInputError(
                f"model {self.id!r}: give exactly one of name (hub name or local path) and zoo (embedded model)")
        from thermo_lens import zoo

        if self.name is not None:
            V.text("name", self.name, max_len=4096)
            if self.name in zoo.names() and not os.path.exists(self.name):
                object.__setattr__(self, "zoo", self.name)  # a zoo name given as name
                object.__setattr__(self, "name", None)
            else:
                V.model_name(self.name, "name", hub_id=False)
        if self.zoo is not None:
            V.text("zoo", self.zoo, max_len=200)
            if self.zoo not in zoo.names():
                raise ThermoLensInputError(
                    f"zoo={V.excerpt(self.zoo)}: unknown embedded model; available: {', '.join(zoo.names())}")
            if self.family is None:  # the summary and the hierarchy plot group by it
                object.__setattr__(self, "family", zoo.family(self.zoo))
        for f in ("lab", "family", "twin_of"):
            V.optional_text(f, getattr(self, f))
        V.dtype(self.dtype)
        V.device(self.device, here=False)  # a Ray worker may have devices the driver lacks;
        V.device_map(self.device_map, here=False)  # run_study checks them here for "local"
        V.non_negative_number("num_gpus", self.num_gpus)
        V.optional_positive_int("threads", self.threads, maximum=4096)
        V.boolean("trust_remote_code", self.trust_remote_code)

    @property
    def source(self) -> str:
        return f"zoo:{self.zoo}" if self.zoo else str(self.name)


@validates_own_inputs
@dataclass(frozen=True)
class StudySpec:
    """A parsed study spec (see :mod:`thermo_lens.experiments.study` for the file format); validated on construction."""

    name: str
    models: tuple[ModelSpec, ...]
    prompts: StudyPrompts = "paper25"
    prepend_bos: BosMode = "host"
    token_scope: str = "all_but_first"
    batch_size: int = 8
    truncate: bool = False
    path: str | None = None

    def __post_init__(self) -> None:
        V.text("study name", self.name, max_len=200)
        if not isinstance(self.models, tuple) or not self.models:
            raise ThermoLensInputError("a study needs a non-empty tuple of ModelSpec")
        seen: dict[str, str] = {}
        for m in self.models:
            if not isinstance(m, ModelSpec):
                raise ThermoLensInputError(f"study models must be ModelSpec, got {type(m).__name__}")
            if m.id.lower() in seen:
                raise ThermoLensInputError(
                    f"duplicate model id {m.id!r} (ids name files and must differ, ignoring case); "
                    "give each model a distinct id")
            seen[m.id.lower()] = m.id
        check_prompts(self.prompts)
        V.prepend_bos(self.prepend_bos)
        V.token_scope(self.token_scope)
        V.positive_int("batch_size", self.batch_size, maximum=1 << 16)
        V.boolean("truncate", self.truncate)

    def settings(self) -> dict[str, Any]:
        """The measurement settings every profile of this study shares (:class:`StudySettings`)."""
        return {k: getattr(self, k) for k in SETTINGS_KEYS}

    @classmethod
    def from_models(cls, models: Iterable[str | ModelSpec], *, name: str = "profile",
                    **settings: Unpack[StudySettings]) -> "StudySpec":
        """A spec from model names for the CLI's ``profile`` command: zoo names are recognised,
        ids are slugs of the names made unique (``a/tiny b/tiny`` -> ``tiny``, ``tiny-2``).

        For per-model options (dtype, device), build each with :func:`model_from_name`.
        """
        specs: list[ModelSpec] = []
        seen: set[str] = set()
        for m in models:
            spec = m if isinstance(m, ModelSpec) else model_from_name(m, seen)
            seen.add(spec.id.lower())
            specs.append(spec)
        if not specs:
            raise StudySpecError("no models given")
        return cls(name=name, models=tuple(specs), **settings)


def check_prompts(prompts: object) -> None:
    """``prompts`` names a built-in prompt set or is a list / dict of prompts
    (:func:`thermo_lens.core.prompts.as_prompt_set`); the error is cut to a readable length."""
    from thermo_lens.core import prompts as prompt_sets

    try:
        prompt_sets.as_prompt_set(prompts)
    except (KeyError, TypeError, ValueError) as e:
        msg = str(e.args[0] if isinstance(e, KeyError) and e.args else e)
        raise ThermoLensInputError(f"prompts: {msg[:MAX_ERROR]}") from None


def default_id(name: str) -> str:
    """The id a model gets from its name: a local folder's own name, or the hub name with
    '/' -> '_', as a file-safe slug (:func:`thermo_lens.core.validate.slug`)."""
    if V.looks_like_path(name) or os.path.exists(name):
        name = Path(name).expanduser().name or name
    return V.slug(name.strip("/"))


def _unique_id(base: str, seen: set[str]) -> str:
    out, k = base, 2
    while out.lower() in seen:
        out, k = f"{base}-{k}", k + 1
    return out


def model_from_name(name: object, seen: Iterable[str] = (), **options: Unpack[ModelOptions]) -> ModelSpec:
    """A :class:`ModelSpec` for a model name (zoo name, local folder or hub id) with an id unique
    among ``seen`` (lower-case ids); ``options`` are further ``ModelSpec`` fields."""
    from thermo_lens import zoo

    name = V.text("model", name, max_len=4096)
    if name in zoo.names() and not os.path.exists(name):
        merged: ModelOptions = {"lab": "thermo-lens zoo", "family": zoo.family(name), **options}
        return ModelSpec(id=_unique_id(V.slug(name), set(seen)), zoo=name, **merged)
    return ModelSpec(id=_unique_id(default_id(name), set(seen)), name=V.model_name(name, "model"), **options)
