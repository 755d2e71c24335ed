"""User hooks in a pass: the batch context (``hook.ctx["batch"]``), clear errors, and which fired.

Every pass wraps the caller's ``fwd_hooks`` here (:func:`wrap_user_hooks`): a hook sees the batch
being run as :class:`thermo_lens.core.tokens.BatchInfo`, and a hook that raises or returns something the
host cannot use gets a :class:`~thermo_lens.core.errors.ThermoLensHookError` naming the hook, the batch
and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from thermo_lens.core.errors import ThermoLensHookError
from thermo_lens.core.provenance import describe_hook
from thermo_lens.core.tokens import BatchInfo

__all__ = ["wrap_user_hooks", "Current", "hook_site"]

class Current:
    """The batch being run (set by :func:`collect` around each pass), and which user hooks fired."""

    def __init__(self) -> None:
        self.info: BatchInfo | None = None
        self.fired: set[int] = set()


_FIX = ("Fixes: index your source by the batch's prompts (rows = hook.ctx['batch'].prompt_index; "
        "real lengths hook.ctx['batch'].lengths), use thermo_lens.patch_from(model, clean_prompts, "
        "hook_names, positions=...), or run all prompts in one batch (batch_size=len(prompts)).")
_RETURN = ("A hook must return None (after editing the activation in place) or a tensor of the activation's "
           "shape, dtype family and device, as model.run_with_hooks expects.")


def hook_site(name: str | Callable[[str], bool], fn: Callable[..., object], info: BatchInfo | None) -> str:
    rec = describe_hook(name, fn)
    at = rec.hook_point if isinstance(name, str) else f"{rec.hook_point} (matched {name!r})"
    if info is None:
        return f"user hook {rec.function} at {at}"
    return (f"user hook {rec.function} at {at} on batch {info.batch + 1}/{info.n_batches} "
            f"(prompts {info.prompt_index.tolist()}, lengths {info.lengths.tolist()}, padded width {info.width})")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_return(res: object, act: object, where: Callable[[], str]) -> None:
    """A hook's return value must be usable as the activation: None, or a real tensor of its shape
    on its device (anything else fails deep inside the host, or silently on a meta tensor)."""
    if res is None:
        return
    if not isinstance(res, Tensor):
        raise ThermoLensHookError(f"{where()} returned a {type(res).__name__} ({_short(res)}). {_RETURN}")
    if res.is_meta:
        raise ThermoLensHookError(f"{where()} returned a meta tensor (shape {tuple(res.shape)}, no values). {_RETURN}")
    if isinstance(act, Tensor):
        if res.shape != act.shape:
            raise ThermoLensHookError(
                f"{where()} returned shape {tuple(res.shape)} for an activation of shape {tuple(act.shape)}; a hook "
                f"must return a tensor of the activation's shape (or None after editing it in place). {_FIX}")
        if res.device != act.device:
            raise ThermoLensHookError(
                f"{where()} returned a tensor on {res.device} for an activation on {act.device}. {_RETURN}")
        if res.is_floating_point() != act.is_floating_point():
            raise ThermoLensHookError(
                f"{where()} returned a {res.dtype} tensor for a {act.dtype} activation. {_RETURN}")


def wrap_user_hooks(hooks: Sequence[tuple[str | Callable[[str], bool], Callable[..., object]]],
                    current: Current) -> list[tuple[str | Callable[[str], bool], Callable[..., object]]]:
    """Wrap ``(name, fn)`` hooks so they see ``hook.ctx["batch"]``, fail with a clear error (a hook
    that raises, or returns something the host cannot use) and record that they fired
    (``current.fired`` holds their indices)."""
    out = []
    for index, (name, fn) in enumerate(hooks):
        def hook(act: object, hook: object = None, *, _fn: Callable[..., object] = fn, _name: str | Callable[[str], bool] = name,
                 _i: int = index) -> object:
            info = current.info
            current.fired.add(_i)
            ctx = getattr(hook, "ctx", None) if hook is not None else None
            if isinstance(ctx, dict) and info is not None:
                ctx["batch"] = info

            def where() -> str:
                return hook_site(_name if isinstance(_name, str) else getattr(hook, "name", _name), _fn, info)
            try:
                res = _fn(act, hook=hook)
            except ThermoLensHookError:
                raise
            except Exception as e:  # noqa: BLE001 - re-raised with the hook and batch named
                raise ThermoLensHookError(f"{where()} raised {type(e).__name__}: {e}. {_FIX}") from e
            finally:
                # TransformerLens keeps hook.ctx between runs: never leave a stale batch behind for
                # a later model.run_with_hooks call to read.
                if isinstance(ctx, dict):
                    ctx.pop("batch", None)
            _check_return(res, act, where)
            return res
        hook.__qualname__ = getattr(fn, "__qualname__", "hook")
        out.append((name, hook))
    return out

