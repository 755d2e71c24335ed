"""RunSettings: the options of one measurement run, declared once for every entry point.

Every activation-based entry point (:func:`~thermo_lens.residual_gain`,
:func:`~thermo_lens.sheaf_traces`, :func:`~thermo_lens.anisotropy_profile`,
:func:`~thermo_lens.gain_attribution`, :func:`~thermo_lens.measures.profile`, ...) takes the same run
options, either as keyword arguments (``prepend_bos=True, batch_size=4``) or as one
``settings=RunSettings(...)`` object; keywords override the object's fields. An unknown keyword
is an error that lists the valid ones, so options cannot drift between entry points.

Batching order (why ``sort_by_length`` defaults to ``None``): prompts that fit one batch
(``batch_size >= len(prompts)``) run as one batch in the caller's order, so a hook written for
``model.run_with_hooks`` on the same prompt list sees the same rows; more prompts run in length
buckets (less padding; results come back in the caller's order), where a hook reads
``hook.ctx["batch"]`` (:class:`thermo_lens.core.tokens.BatchInfo`). The plan never depends on the
hooks: two runs that differ only in their hooks batch identically, so their paired difference is
exactly the hooks' effect (an identity hook gives 0, not float rounding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypedDict

from thermo_lens.core import validate
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.tokens import BosMode

__all__ = ["RunSettings", "RunOptions", "HookFn", "NamesFilter", "FwdHooks"]

#: A forward hook, as TransformerLens calls it: ``fn(activation, hook)`` returning None (edited
#: in place) or a tensor of the activation's shape.
HookFn = Callable[..., Any]
#: A hook point given by name (``"blocks.0.attn.hook_z"``) or by a filter ``name -> bool``.
NamesFilter = str | Callable[[str], bool]
#: What ``fwd_hooks`` takes: ``(hook point, fn)`` pairs, as ``model.run_with_hooks`` does.
FwdHooks = Sequence[tuple[NamesFilter, HookFn]]
Hook = tuple[NamesFilter, HookFn]


class RunOptions(TypedDict, total=False):
    """The run options every entry point takes as keywords (``**run``), for editors and type
    checkers; the meaning and defaults are :class:`RunSettings`'s."""

    prepend_bos: BosMode
    batch_size: int
    truncate: bool
    fwd_hooks: FwdHooks
    progress: bool | None
    sort_by_length: bool | None


def _check_hooks(hooks: object) -> tuple[Hook, ...]:
    return tuple(validate.fwd_hooks(hooks))


@validate.validates_own_inputs
@dataclass(frozen=True)
class RunSettings:
    """How prompts are tokenized, batched and run (not what is measured).

    Attributes:
        prepend_bos: ``"host"`` (the default: exactly what the host's ``model.to_tokens`` does, so
            ``run_with_cache(prompt)`` and thermo-lens agree), ``True`` (prepend the BOS token,
            TransformerLens style; ``[CLS]`` on BERT), ``False`` or ``"tokenizer"`` (the HF
            tokenizer's own special tokens, the paper's protocol). Ignored (recorded as
            ``"tokens_as_given"``) when the prompts are token ids.
        batch_size: prompts per forward pass (default ``8``; right-padded: padding never enters a
            reduction).
        truncate: cut prompts longer than the context to their first ``n_ctx`` tokens instead of
            raising (default ``False``).
        fwd_hooks: your own ``(hook_name, fn)`` hooks (ablation, patching), run in the same pass
            before thermo-lens' reductions; recorded in every result's provenance (default ``()``).
        progress: progress bar over batches (``None``, the default: when there is more than one
            batch).
        sort_by_length: ``None`` (default): one batch in the caller's order when every prompt
            fits one batch, else length buckets (with or without hooks: the plan never depends on
            them). ``False``: always the caller's order. ``True`` with user hooks is refused (the
            hooks would see reordered rows even when the prompts fit one batch).
    """

    prepend_bos: BosMode = "host"
    batch_size: int = 8  # every field is validated in __post_init__ (clear message)
    truncate: bool = False
    fwd_hooks: FwdHooks = ()  # any iterable of (name, fn) pairs; stored as a tuple of pairs
    progress: bool | None = None
    sort_by_length: bool | None = None

    def __post_init__(self) -> None:
        validate.prepend_bos(self.prepend_bos)  # the one check: passes and tokenizers trust it
        validate.positive_int("batch_size", self.batch_size)
        validate.boolean("truncate", self.truncate)
        for name in ("progress", "sort_by_length"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise ThermoLensInputError(f"{name} must be True, False or None, got {v!r}")
        object.__setattr__(self, "fwd_hooks", _check_hooks(self.fwd_hooks))
        if self.sort_by_length and self.fwd_hooks:
            raise ThermoLensInputError(
                "sort_by_length=True reorders the prompts into batches, and your fwd_hooks would see "
                "other rows than model.run_with_hooks on the same list; leave sort_by_length unset "
                "(batches then keep your order) or read hook.ctx['batch'].prompt_index in the hook")

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def resolve(cls, settings: "RunSettings | Mapping[str, Any] | None" = None, /, **options: Any) -> "RunSettings":
        """``settings`` (or the defaults) with ``options`` overriding its fields.

        Raises:
            ThermoLensInputError: an option that is not a run setting (the message lists them),
                or a bad value.
        """
        unknown = sorted(set(options) - set(cls.fields()))
        if unknown:
            raise ThermoLensInputError(
                f"unknown option(s) {', '.join(map(repr, unknown))}; run options are "
                f"{', '.join(cls.fields())} (see thermo_lens.RunSettings)")
        if settings is None:
            return cls(**options)
        if isinstance(settings, Mapping):
            return cls.resolve(None, **{**settings, **options})
        if not isinstance(settings, RunSettings):
            raise ThermoLensInputError(f"settings must be a thermo_lens.RunSettings, got {type(settings).__name__}")
        return dataclasses.replace(settings, **options) if options else settings

    @property
    def by_length(self) -> bool | None:
        """Whether prompts are batched by token length: ``True``, ``False``, or ``None`` (one batch
        in the caller's order when they fit one batch, else by length; never hook-dependent)."""
        return self.sort_by_length

    def describe(self) -> dict[str, Any]:
        """JSON-ready description (the hooks are described in the result's provenance)."""
        order = {True: "by token length", False: "caller's order",
                 None: "one batch in the caller's order if the prompts fit one, else by token length"}
        return {"prepend_bos": self.prepend_bos, "batch_size": self.batch_size, "truncate": self.truncate,
                "batch_order": order[self.sort_by_length], "n_fwd_hooks": len(self.fwd_hooks)}
