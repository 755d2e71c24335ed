"""Count the aten ops and host-synchronising ops a piece of code dispatches (CPU or device).

On a GPU every dispatched op is at least one kernel launch, and every host-synchronising op
(``tensor.item()``, ``float(t)``, ``bool(t)``, ``t.tolist()``, ``t.numpy()``, ``nonzero``, boolean
indexing and other ops whose output shape depends on the data) stalls the host until the device has
drained its queue. A census on the CPU therefore predicts the launch and stall counts of the same
code on a device, without one: ``benchmarks/census.py`` compares :func:`thermo_lens.measures.profile` with a
bare forward pass, and ``tests/scale/test_census.py`` guards the ratio and the per-batch syncs.

    with OpCensus() as c:
        thermo_lens.profile(model, prompts)
    c.total, c.syncs, c.sync_ops  # ops dispatched, host syncs, {op name: count} of the syncs
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCensus", "SYNC_OPS"]

#: aten ops that read a tensor's values on the host (a device sync) or whose output shape depends
#: on the values (the host must wait for them to size the output).
SYNC_OPS = frozenset({
    "aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.nonzero", "aten.nonzero_static", "aten.masked_select",
    "aten._unique", "aten._unique2", "aten.unique_dim", "aten.unique_consecutive", "aten.unique_dim_consecutive",
    "aten.equal", "aten.allclose", "aten.masked_scatter",
})

#: Tensor methods that read values on the host without dispatching an aten op on the CPU.
_HOST_READS = frozenset({"tolist", "numpy"})


def _is_bool_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()))


class _Dispatch(TorchDispatchMode):
    def __init__(self, census: "OpCensus") -> None:
        super().__init__()
        self.census = census

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: Sequence[type], args: tuple = (),
                           kwargs: dict[str, object] | None = None) -> object:
        name = str(func.overloadpacket)
        self.census.ops[name] += 1
        if name in SYNC_OPS:
            self.census.sync_ops[name] += 1
        elif name in ("aten.index", "aten.index_put", "aten.index_put_") and _is_bool_index(args):
            self.census.sync_ops[name + " (boolean mask)"] += 1
        elif name == "aten.repeat_interleave" and (kwargs or {}).get("output_size") is None and \
                isinstance(args[0], torch.Tensor) and len(args) >= 1 and args[0].dtype != torch.bool and \
                (len(args) == 1 or isinstance(args[1], torch.Tensor)):
            self.census.sync_ops[name + " (tensor repeats)"] += 1
        return func(*args, **(kwargs or {}))


class _Function(TorchFunctionMode):
    def __init__(self, census: "OpCensus") -> None:
        super().__init__()
        self.census = census

    def __torch_function__(self, func: Callable[..., object], types: Sequence[type], args: tuple = (),
                           kwargs: dict[str, object] | None = None) -> object:
        name = getattr(func, "__name__", "")
        if name in _HOST_READS:
            self.census.sync_ops[f"Tensor.{name}"] += 1
        return func(*args, **(kwargs or {}))


class OpCensus:
    """Context manager counting dispatched aten ops (``ops``: {``"aten.mm"``: n, ...}) and the
    host-synchronising ones among them (``sync_ops``), plus ``Tensor.tolist`` / ``Tensor.numpy``
    calls (host reads that dispatch nothing on the CPU). Composite ops are counted as the ops they
    decompose into, as a device runs them. Not reentrant; nested censuses are not supported."""

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()
        self.sync_ops: Counter[str] = Counter()
        self._modes: tuple[Any, Any] | None = None

    @property
    def total(self) -> int:
        """Aten ops dispatched."""
        return sum(self.ops.values())

    @property
    def syncs(self) -> int:
        """Host-synchronising ops (aten ops in :data:`SYNC_OPS`, boolean-mask indexing, tensor-repeat
        ``repeat_interleave``, ``tolist``, ``numpy``)."""
        return sum(self.sync_ops.values())

    def __enter__(self) -> "OpCensus":
        self._modes = (_Function(self), _Dispatch(self))
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._modes is not None
        for m in reversed(self._modes):
            m.__exit__(*exc)
        self._modes = None
