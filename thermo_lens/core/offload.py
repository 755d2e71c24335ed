"""Models whose weights are offloaded or dispatched (accelerate hooks, a ``device_map``).

A model loaded with CPU/disk offload (``device_map="auto"`` with ``offload_folder``,
``accelerate.cpu_offload``, ``disk_offload``) keeps its parameters on the ``meta`` device and
materialises each module's weights only while that module runs, from the offload hook's weights
map. Two things then differ from a model in memory:

* the pass starts on the hooks' **execution device**, not on the parameters' device (``meta``);
* reading a weight (spectral signature, attribution, weight-processing checks) must materialise
  that module for the read, one layer at a time, so the whole model is never resident.

:func:`execution_device` and :func:`materialised` are the two answers; nothing here imports
accelerate unless a model carries its hooks.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Protocol, runtime_checkable

import torch

from thermo_lens.core.errors import ThermoLensInputError

__all__ = ["execution_device", "is_offloaded", "materialised", "live_attr"]


@runtime_checkable
class _AlignHook(Protocol):
    """accelerate's device-aligning hook (``AlignDevicesHook``): where its module computes, and whether it
    keeps the module's weights offloaded (``offload``)."""

    execution_device: int | str | torch.device | None

    def pre_forward(self, module: torch.nn.Module, *args: object, **kwargs: object) -> object: ...  # loads the weights

    def post_forward(self, module: torch.nn.Module, output: object) -> object: ...  # offloads them again


def _align_hooks(hook: object) -> list[_AlignHook]:
    """The device-aligning hooks inside ``hook`` (accelerate nests them in ``SequentialHook``s when a
    module is hooked twice, e.g. once through a TransformerBridge wrapper and once directly)."""
    if hook is None:
        return []
    inner = getattr(hook, "hooks", None)
    if inner is not None:
        return [h for sub in inner for h in _align_hooks(sub)]
    return [hook] if isinstance(hook, _AlignHook) else []


def _offload_hook(module: torch.nn.Module) -> _AlignHook | None:
    """The hook that holds ``module``'s own offloaded parameters, or None. (Wrappers without
    parameters of their own, such as a bridge's component around the HF module, are hooked too;
    there is nothing to load for them.)"""
    own = any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))
    if not own:
        return None
    return next((h for h in _align_hooks(getattr(module, "_hf_hook", None)) if getattr(h, "offload", False)), None)


def is_offloaded(model: torch.nn.Module) -> bool:
    """Any of ``model``'s modules keeps its weights offloaded (parameters on ``meta``)."""
    return any(_offload_hook(m) is not None for m in model.modules())


def execution_device(model: torch.nn.Module) -> torch.device | None:
    """Where a dispatched or offloaded model computes its first module (the device tokens go to),
    or None for a model without accelerate hooks (its parameters' device is the answer)."""
    for m in model.modules():
        for h in _align_hooks(getattr(m, "_hf_hook", None)):
            dev = h.execution_device
            if dev is not None:
                return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)
    return None


def live_attr(module: object, name: str, default: object = None) -> Any:
    """``module.<name>``, following a TransformerBridge property alias (``b_out`` -> ``out.bias``,
    ``W_U`` -> ``u.weight``) to the parameter as it is now. The bridge stores each alias as the
    tensor it pointed to at boot: for an offloaded module that is the ``meta`` placeholder, which
    :func:`materialised` does not replace (it loads the module's parameters, not the alias)."""
    registry = getattr(module, "_property_alias_registry", None)
    path = registry.get(name) if isinstance(registry, dict) else None
    # only an alias the bridge stored on the instance (a class property of that name wins over
    # the alias, and is computed live already)
    if isinstance(path, str) and name in getattr(module, "__dict__", {}):
        obj = module
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            pass
    return getattr(module, name, default)


#: Modules loaded by an enclosing :func:`materialised` (re-entrant: an inner read does not reload).
_LOADED: set[int] = set()


@contextlib.contextmanager
def materialised(module: torch.nn.Module, what: str = "the weights") -> Iterator[None]:
    """Every offloaded parameter under ``module`` loaded (on its execution device) for the
    duration; a no-op for a module in memory. Tensors read inside stay valid afterwards (the hook
    only swaps the module's parameters back to ``meta``).

    Raises:
        ThermoLensInputError: a parameter under ``module`` is on ``meta`` and no offload hook holds
            its values (a model built with ``init_empty_weights`` and never loaded).
    """
    if not any(p.is_meta for p in module.parameters()):
        # Nothing offloaded below (an offload hook keeps its module's parameters on meta) or already
        # loaded by an enclosing read: one walk over the parameters instead of a hook lookup per module.
        yield
        return
    hooked = ((m, _offload_hook(m)) for m in module.modules() if id(m) not in _LOADED)
    offloaded = [(m, hook) for m, hook in hooked if hook is not None]
    if not offloaded:
        if any(p.is_meta for p in module.parameters()):
            raise ThermoLensInputError(
                f"{what}: the module's parameters are on the meta device and no offload hook holds their "
                "values (a model created with init_empty_weights and never loaded?). Load the weights, "
                "or dispatch the model with accelerate (device_map / cpu_offload / disk_offload)")
        yield
        return
    loaded: list[tuple[torch.nn.Module, _AlignHook]] = []
    try:
        for m, hook in offloaded:
            hook.pre_forward(m)  # what accelerate runs before the module's forward: weights map -> device
            loaded.append((m, hook))
            _LOADED.add(id(m))
        yield
    finally:
        for m, hook in reversed(loaded):
            _LOADED.discard(id(m))
            hook.post_forward(m, None)  # back to meta
