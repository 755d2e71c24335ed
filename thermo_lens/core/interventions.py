"""User hooks in a thermo-lens run: batch context, clear errors, and patching from a clean run.

thermo-lens runs prompts in batches. With user hooks (``fwd_hooks``) the batches keep the
caller's prompt order, so a hook written for ``model.run_with_hooks(prompts, ...)`` sees the same
rows whenever all prompts fit one batch (``batch_size >= len(prompts)``). Beyond that, each hook
can read the current batch from ``hook.ctx["batch"]``, a :class:`BatchInfo`::

    def patch(x, hook):
        rows = hook.ctx["batch"].prompt_index          # caller's index of each row
        x[:, 3] = clean_cache[hook.name][rows, 3]       # position 3 of the matching clean prompts
        return x

:func:`patch_from` builds such hooks for you: it runs the clean prompts once, keeps only the
patched hook points, and returns hooks that copy clean activations into the matching prompt, at
the positions (and heads) you choose. A patch records the model and the BOS mode its clean run
used, and refuses a run on another model or with another BOS mode (the clean BOS would land on
another token). A hook that raises, or returns a tensor of another shape, gets a
:class:`ThermoLensHookError` naming the hook, the batch and the fix.
"""

from __future__ import annotations

import numbers
import weakref
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Unpack

import torch
from torch import Tensor

from thermo_lens.core import attached
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.core.passes.capture import capture
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.core.tokens import TOKENS_GIVEN
from thermo_lens.core.errors import ThermoLensHookError, ThermoLensInputError, ThermoLensInputTypeError
from thermo_lens.core.validate import validates_own_inputs

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel
    from thermo_lens.core.inputs import Prompts

__all__ = ["Patch", "patch_from"]



# ---------------------------------------------------------------------------- patching
def _int_list(name: str, value: object) -> tuple[int, ...]:
    """An int or a sequence of ints (not a string: ``heads='13'`` is not heads 1 and 3; not bools)."""
    def one(v: object) -> int:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ThermoLensInputTypeError(
                f"{name} must be an int or a list of ints, got {type(v).__name__} {v!r}")
        return int(v)
    if isinstance(value, (str, bytes)):
        raise ThermoLensInputTypeError(
            f"{name} must be an int or a list of ints, got the string {value!r} (a string is not a list of "
            f"{name}: pass e.g. {name}=[1, 3])")
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return (int(value),)
    if isinstance(value, Tensor):
        value = value.tolist()
    try:
        if not isinstance(value, Iterable):
            raise TypeError
        items = list(value)
    except TypeError:
        raise ThermoLensInputTypeError(f"{name} must be an int or a list of ints, got {type(value).__name__}") from None
    if not items:
        raise ThermoLensInputError(f"{name} is empty; pass an int or a non-empty list of ints (or None for all)")
    return tuple(one(v) for v in items)


def _positions(positions: object, n: int, which: str, prompt: int) -> list[int]:
    """``positions`` (as given to :func:`patch_from`, which checked them) as indices into a prompt of ``n`` tokens."""
    if positions is None:
        return list(range(n))
    ps = [positions] if isinstance(positions, int) else list(positions) if isinstance(positions, Iterable) else [positions]
    out = []
    for p in ps:
        if isinstance(p, bool) or not isinstance(p, int):
            raise ThermoLensInputError(f"positions must be ints (negative counts from each prompt's end), got {p!r}")
        q = p + n if p < 0 else p
        if not 0 <= q < n:
            raise ThermoLensInputError(
                f"position {p} is outside {which} prompt {prompt} ({n} tokens); positions index real "
                "tokens, negative ones from the end (-1 = last real token)")
        out.append(q)
    return out


@dataclass(frozen=True)
class Patch:
    """Hooks that patch clean activations into a run: pass as ``fwd_hooks=patch``.

    Iterating gives ``(hook_name, fn)`` pairs (the shape ``run_with_hooks`` takes). Row ``b`` of a
    batch gets the activations of clean prompt ``source[prompt_index[b]]`` at :attr:`positions`
    (negative: from each prompt's end; ``None``: every position, which needs equal lengths).

    Attributes:
        hook_names: the patched hook points.
        clean_prompts: the clean prompts the activations come from.
        positions, heads: what is patched (``heads`` for ``[batch, pos, head, d]`` hooks).
        source: per run prompt, the index of its clean prompt.
        description: recorded as the hooks' ``source`` in every result's provenance.
        prepend_bos: the BOS mode of the clean run as it resolved (``True``, ``False``,
            ``"host:..."``, ``"tokens_as_given"``); a run with another BOS mode is refused.
        model_name: the model it was built on; a run on another model object is refused.
    """

    hook_names: tuple[str, ...]
    clean_prompts: tuple[str, ...]
    positions: object  # as given to patch_from (an int or ints, checked there), or None: every position
    heads: tuple[int, ...] | None
    source: tuple[int, ...] | None
    description: str
    _clean: dict[str, list[Tensor]] = field(repr=False)
    _clean_lengths: tuple[int, ...] = field(repr=False)
    prepend_bos: str | bool | None = None
    model_name: str = ""
    _model: Callable[[], object] | None = field(default=None, repr=False)  # a weakref to the model

    def check_run(self, *, view: ModelView, prepend_bos: str | bool, **_: object) -> None:
        """Refuse a run this patch was not built for: another model object, or another BOS mode
        (the clean prompts' positions would not line up with the run's). Called by every
        thermo-lens pass before it runs."""
        built_on = self._model() if self._model is not None else None
        if built_on is not None and built_on is not view.model or (self._model is not None and built_on is None):
            raise ThermoLensInputError(
                f"this patch was built on {self.model_name!r} (another model object) and is applied to {view.name!r}: "
                "its clean activations come from the other model. Build it on this model: "
                "thermo_lens.patch_from(model, clean_prompts, hook_names, ...)")
        if TOKENS_GIVEN not in (self.prepend_bos, prepend_bos) and self.prepend_bos != prepend_bos:
            raise ThermoLensInputError(
                f"this patch's clean run used prepend_bos={self.prepend_bos!r}, but this run uses "
                f"prepend_bos={prepend_bos!r}: the clean BOS would land on another token (position 0 holds a "
                "BOS in one run and the first word in the other). Pass the same prepend_bos to patch_from and "
                "to the run.")

    def __iter__(self):
        return iter(self.hooks())

    def __len__(self) -> int:
        return len(self.hook_names)

    def hooks(self) -> list[tuple[str, Callable]]:
        return [(name, self._hook(name)) for name in self.hook_names]

    def _hook(self, name: str) -> Callable:
        clean = self._clean[name]

        def patch(x: Tensor, hook: object = None) -> Tensor:
            info = getattr(hook, "ctx", {}).get("batch") if hook is not None else None
            if info is None:
                raise ThermoLensHookError(
                    f"patch_from hook at {name} ran outside a thermo-lens run (no hook.ctx['batch']); "
                    "pass it as fwd_hooks= to a thermo-lens entry point")
            for b, (i, n) in enumerate(zip(info.prompt_index.tolist(), info.lengths.tolist())):
                j = i if self.source is None else self.source[i]
                if not 0 <= j < len(clean):
                    raise ThermoLensHookError(
                        f"patch_from at {name}: run prompt {i} has no clean prompt ({len(clean)} clean prompts); "
                        "pass as many clean prompts as prompts, or source=[clean index per prompt]")
                nc = self._clean_lengths[j]
                if self.positions is None and nc != n:
                    raise ThermoLensHookError(
                        f"patch_from at {name}: prompt {i} has {n} tokens but clean prompt {j} has {nc}; "
                        "patching every position needs equal lengths: pass positions=[...] (negative "
                        "positions count from each prompt's end)")
                pr = _positions(self.positions, n, "run", i)
                pc = _positions(self.positions, nc, "clean", j)
                src = clean[j].to(device=x.device, dtype=x.dtype)
                if self.heads is None:
                    x[b, pr] = src[pc]
                else:
                    if x.ndim != 4:
                        raise ThermoLensHookError(
                            f"patch_from at {name}: heads= needs a [batch, pos, head, d_head] activation, "
                            f"got shape {tuple(x.shape)}")
                    h = list(self.heads)
                    x[b, torch.tensor(pr)[:, None], torch.tensor(h)[None, :]] = src[torch.tensor(pc)[:, None], torch.tensor(h)[None, :]]
            return x

        patch.thermo_lens_source = self.description  # type: ignore[attr-defined]  # mypy does not model attributes set on a function
        patch.thermo_lens_check = self.check_run  # type: ignore[attr-defined]  # as above
        patch.__qualname__ = "patch_from"
        patch.__module__ = "thermo_lens"
        return patch


@validates_own_inputs
def patch_from(
    model: TransformerLensModel | ModelView,
    clean_prompts: Prompts,
    hook_names: str | Sequence[str],
    *,
    positions: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    source: Sequence[int] | None = None,
    settings: RunSettings | None = None,
    **run: Unpack[RunOptions],
) -> Patch:
    """Activation patching from a clean prompt set, by prompt and position.

    Runs ``clean_prompts`` once (a thermo-lens pass under the run settings, nothing but
    ``hook_names`` kept, on the CPU: :func:`thermo_lens.core.passes.capture.capture`) and returns hooks
    that, in any thermo-lens run, replace the activation of run prompt ``i`` at ``positions`` by
    clean prompt ``source[i]``'s (default: clean prompt ``i``).

    Args:
        model: the TransformerLens model (or ModelView).
        clean_prompts: the clean prompts (anything :func:`thermo_lens.core.inputs.as_prompts` takes).
        hook_names: hook point(s), e.g. ``"blocks.1.hook_resid_pre"`` or ``"blocks.0.attn.hook_z"``.
        positions: token positions to patch (an int or a list; negative from each prompt's end,
            ``-1`` = last real token); ``None``: every position (run and clean prompt must then
            have the same token length).
        heads: for per-head hooks (``hook_z``, ``hook_q``...), patch only these heads (negative
            from the end); ``None`` (the default): every head.
        source: clean prompt index for each run prompt (default: the same index).
        settings, **run: the clean run's settings (:class:`thermo_lens.RunSettings`), as every entry
            point takes them: ``prepend_bos`` (default ``"host"``; the patch records the BOS mode as it
            resolved and refuses a run with another one), ``truncate``, ``fwd_hooks`` (run in the clean
            run, recorded in the patch's description), ``progress``, ``sort_by_length`` and
            ``batch_size``: prompts per pass, here ``1`` unless given (each clean prompt alone, so its
            activations are exactly those of ``model.run_with_cache(prompt)``; more is faster, equal up
            to float rounding).

    Returns:
        :class:`Patch`, to pass as ``fwd_hooks=patch`` (or ``list(patch) + other_hooks``).

    Example::

        patch = tl.patch_from(model, clean, "blocks.1.hook_resid_pre", positions=[-1])
        g = tl.residual_gain(model, corrupted, fwd_hooks=patch)
    """
    from thermo_lens.core.inputs import as_model_prompts

    view = as_view(model)
    if isinstance(hook_names, str):
        names: tuple[str, ...] = (hook_names,)
    elif isinstance(hook_names, (list, tuple)) and hook_names:
        names = tuple(hook_names)
    else:
        raise ThermoLensInputTypeError(
            f"hook_names must be a hook name (a str such as 'blocks.0.hook_resid_pre') or a non-empty list of "
            f"names, got {type(hook_names).__name__} {hook_names!r}")
    bad_t = [n for n in names if not isinstance(n, str)]
    if bad_t:
        raise ThermoLensInputTypeError(
            f"hook_names must be strs such as 'blocks.0.hook_resid_pre', got {bad_t[0]!r} ({type(bad_t[0]).__name__})")
    attached.check_hook_names(view.model, names, view.name)
    ps = as_model_prompts(view, clean_prompts)
    heads_t: tuple[int, ...] | None = None
    if heads is not None:
        heads_t = _int_list("heads", heads)
        bad_h = [h for h in heads_t if not -view.n_heads <= h < view.n_heads]
        if bad_h:
            raise ThermoLensInputError(f"heads {bad_h} out of range 0..{view.n_heads - 1} (negative from the end)")
        heads_t = tuple(dict.fromkeys(h % view.n_heads for h in heads_t))
    src = None if source is None else _int_list("source", source)
    if src is not None and any(not 0 <= s < len(ps) for s in src):
        raise ThermoLensInputError(f"source indices must be in 0..{len(ps) - 1} (the clean prompts)")
    if positions is not None:
        _int_list("positions", positions)
    if settings is None and "batch_size" not in run:
        run["batch_size"] = 1  # each clean prompt alone (see batch_size above)
    clean_run = RunSettings.resolve(settings, **run)
    clean, got = capture(view, ps, names, clean_run)
    lengths = [int(n) for n in got.lengths.tolist()]
    bos = got.prepend_bos
    user = got.hooks[:len(clean_run.fwd_hooks)]  # the fwd_hooks first, then those already on the model
    hidden = got.hooks[len(clean_run.fwd_hooks):]
    desc = (f"patch_from {len(ps)} clean prompt(s) ({ps.name}; first {ps.texts[0][:40]!r}) at "
            f"positions {'all' if positions is None else positions}"
            + (f", heads {list(heads_t)}" if heads_t is not None else "")
            + (f", source {list(src)}" if src is not None else "")
            + f", prepend_bos={bos!r}"
            + (f"; clean run under fwd_hooks: {'; '.join(str(h) for h in user)}" if user else "")
            + (f"; clean run under hooks already on the model: {'; '.join(str(h) for h in hidden)}"
               if hidden else ""))
    return Patch(hook_names=names, clean_prompts=ps.texts, positions=positions, heads=heads_t, source=src,
                 description=desc, _clean=clean, _clean_lengths=tuple(lengths), prepend_bos=bos,
                 model_name=view.name, _model=weakref.ref(view.model))
