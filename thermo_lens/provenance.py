"""Provenance: what was run to produce a result (prompts, tokenization, model, interventions).

One :class:`Provenance` is shared by every activation-based result (gain, anisotropy, sheaf
traces, gain attribution) instead of the same eight fields re-declared on each. It records the
user hooks of the run (:class:`HookRecord`: the hook point, the function's qualified name and,
for :func:`thermo_lens.patch_from` patches or SAE-like hook objects, where the inserted
activations come from), so an ablated or patched run never looks like a clean one in its repr,
frame, JSON or report.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from thermo_lens.result import Result

__all__ = ["Provenance", "HookRecord", "describe_hook", "hooks_text", "fold_legacy_fields", "ProvenanceFields"]


@dataclass(frozen=True)
class HookRecord(Result):
    """One user hook of a run.

    Attributes:
        hook_point: the hook name (``"blocks.1.hook_resid_pre"``) or the filter function's name.
        function: the hook function's qualified name (``module.qualname``).
        source: where inserted activations come from (a patch's clean prompts, an SAE's id), or
            ``""`` when the function does not say (set ``fn.thermo_lens_source = "..."`` to say).
    """

    hook_point: str
    function: str
    source: str = ""

    def __str__(self) -> str:
        return f"{self.hook_point} <- {self.function}" + (f" [{self.source}]" if self.source else "")


def _qualname(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, type) and hasattr(fn, "__func__"):
        return f"{type(owner).__module__}.{type(owner).__qualname__}.{fn.__name__}"
    mod = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{mod}.{name}"


def _source(fn: Any) -> str:
    src = getattr(fn, "thermo_lens_source", None)
    if src:
        return str(src)
    while isinstance(fn, functools.partial):
        fn = fn.func
        src = getattr(fn, "thermo_lens_source", None)
        if src:
            return str(src)
    owner = getattr(fn, "__self__", None) if hasattr(fn, "__func__") else fn
    cfg = getattr(owner, "cfg", None)
    if cfg is not None:  # an SAE (SAELens) or similar module used as / through a hook
        bits = [f"{k}={getattr(cfg, k)}" for k in ("release", "sae_id", "hook_name", "d_sae")
                if getattr(cfg, k, None) is not None]
        meta = getattr(cfg, "metadata", None)
        for k in ("release", "sae_id", "hook_name"):
            if meta is not None and getattr(meta, k, None) is not None and not any(b.startswith(k) for b in bits):
                bits.append(f"{k}={getattr(meta, k)}")
        if bits:
            return f"{type(owner).__name__}(" + ", ".join(bits) + ")"
    return ""


def describe_hook(hook_point: Any, fn: Callable) -> HookRecord:
    """The :class:`HookRecord` of one ``(hook_point, fn)`` pair."""
    point = hook_point if isinstance(hook_point, str) else f"filter {_qualname(hook_point)}"
    return HookRecord(hook_point=point, function=_qualname(fn), source=_source(fn))


def hooks_text(hooks: tuple[HookRecord, ...]) -> str:
    """``"none (clean run)"`` or the hooks, one per ``;``."""
    return "none (clean run)" if not hooks else "; ".join(str(h) for h in hooks)


@dataclass(frozen=True, eq=False)
class Provenance(Result):
    """What produced a result.

    Attributes:
        prompts: the prompt texts, in the caller's order.
        lengths: ``Int[Tensor, "prompt"]`` real tokens per prompt (BOS included when prepended).
        truncated: per prompt, whether it was cut to the context.
        prepend_bos: ``True``, ``False``, ``"tokenizer"`` or ``"tokens_as_given"``.
        model: :meth:`thermo_lens.ModelView.metadata` (name, geometry, dtype, raw/processed
            weights, norm placement).
        hooks: the user hooks of the run (:class:`HookRecord`), empty for a clean run.
        prompt_set: the prompt set's name (``"custom"`` for a list, ``"tokens"`` for token ids).
        categories: one category per prompt.
    """

    prompts: tuple[str, ...]
    lengths: Tensor
    truncated: tuple[bool, ...]
    prepend_bos: Any
    model: dict[str, Any]
    hooks: tuple[HookRecord, ...] = ()
    prompt_set: str = "custom"
    categories: tuple[str, ...] = field(default=())

    @property
    def dtype(self) -> str:
        return str(self.model.get("dtype"))

    @property
    def weights(self) -> str:
        return str(self.model.get("weights"))

    @property
    def post_ln(self) -> bool:
        return bool(self.model.get("post_ln"))

    @property
    def intervened(self) -> bool:
        """True when user hooks changed the run (ablation, patching, SAE...)."""
        return bool(self.hooks)

    @property
    def hooks_text(self) -> str:
        return hooks_text(self.hooks)

    def select(self, index: Tensor) -> "Provenance":
        """The provenance of the prompts ``index`` (``[k]`` long), in that order."""
        idx = [int(i) for i in index]
        cats = tuple(self.categories[i] for i in idx) if self.categories else ()
        return Provenance(prompts=tuple(self.prompts[i] for i in idx), lengths=self.lengths[index].clone(),
                          truncated=tuple(self.truncated[i] for i in idx), prepend_bos=self.prepend_bos,
                          model=self.model, hooks=self.hooks, prompt_set=self.prompt_set, categories=cats)

    def same_run_as(self, other: "Provenance") -> list[str]:
        """What differs between two runs besides their hooks (empty when they are paired)."""
        out = []
        if self.prompts != other.prompts:
            out.append(f"prompts differ ({len(self.prompts)} vs {len(other.prompts)} prompts"
                       + ("" if len(self.prompts) != len(other.prompts) else
                          f", first difference at prompt {next(i for i, (a, b) in enumerate(zip(self.prompts, other.prompts)) if a != b)}")
                       + ")")
        elif not torch.equal(self.lengths, other.lengths):
            out.append("token lengths differ (another tokenization)")
        if self.prepend_bos != other.prepend_bos:
            out.append(f"prepend_bos differs ({self.prepend_bos!r} vs {other.prepend_bos!r})")
        for k in ("name", "n_layers", "n_heads", "d_model", "dtype", "weights"):
            if self.model.get(k) != other.model.get(k):
                out.append(f"model {k} differs ({self.model.get(k)!r} vs {other.model.get(k)!r})")
        return out

    def columns(self) -> dict[str, Any]:
        """The definition columns every frame carries."""
        return {"model": self.model.get("name"), "prepend_bos": str(self.prepend_bos), "dtype": self.dtype,
                "weights": self.weights, "post_ln": self.post_ln, "hooks": self.hooks_text}


_LEGACY = ("prompts", "lengths", "truncated", "prepend_bos", "dtype", "weights", "post_ln", "model")


def fold_legacy_fields(fields: dict[str, Any], lengths_key: str = "lengths") -> dict[str, Any]:
    """Results stored before :class:`Provenance` existed carry its fields flat: fold them in."""
    if "provenance" in fields or "prompts" not in fields:
        return fields
    f = dict(fields)
    model = dict(f.pop("model", {}) or {})
    for k in ("dtype", "weights", "post_ln"):
        if k in f:
            model.setdefault(k, f.pop(k))
    prompts = tuple(f.pop("prompts"))
    lengths = f.pop(lengths_key)
    f["provenance"] = Provenance(prompts=prompts, lengths=lengths,
                                 truncated=tuple(f.pop("truncated", (False,) * len(prompts))),
                                 prepend_bos=f.pop("prepend_bos", None), model=model)
    return f


class ProvenanceFields:
    """Read-only access to a result's ``provenance`` under the names results always had."""

    provenance: Provenance

    @property
    def prompts(self) -> tuple[str, ...]:
        return self.provenance.prompts

    @property
    def lengths(self) -> Tensor:
        """``[prompt]`` real tokens per prompt (BOS included when prepended)."""
        return self.provenance.lengths

    @property
    def n_tokens(self) -> Tensor:
        """``[prompt]`` real tokens per prompt (BOS included when prepended)."""
        return self.provenance.lengths

    @property
    def truncated(self) -> tuple[bool, ...]:
        return self.provenance.truncated

    @property
    def prepend_bos(self) -> Any:
        return self.provenance.prepend_bos

    @property
    def dtype(self) -> str:
        return self.provenance.dtype

    @property
    def weights(self) -> str:
        return self.provenance.weights

    @property
    def post_ln(self) -> bool:
        return self.provenance.post_ln

    @property
    def model(self) -> dict[str, Any]:
        return self.provenance.model

    @property
    def hooks(self) -> tuple[HookRecord, ...]:
        """The user hooks of the run (empty for a clean run)."""
        return self.provenance.hooks

    @classmethod
    def _upgrade_fields(cls, fields: dict[str, Any]) -> dict[str, Any]:
        return fold_legacy_fields(fields)
