"""How many stacked rows a sweep runs per forward pass: ``batch_size="auto"`` and the retry on OOM.

A sweep stacks its conditions (copies of the prompts, each with one cell's edit) along the batch. On
a GPU a pass is latency-bound at small batches, so the more rows per pass, the fewer passes:
``"auto"`` (the default when no ``batch_size`` is given) sizes the passes from the device's free
memory. On the CPU it is today's fixed :data:`CPU_ROWS` (larger batches are not faster there).

The rule on CUDA: ``rows = HEADROOM * free / bytes_per_row`` with ``free`` from
``torch.cuda.mem_get_info`` (bytes free on the device now, the model's weights already resident) and
``bytes_per_row`` an upper estimate of one row's activations in a forward pass (:func:`row_bytes`):
``HEADROOM = 0.5`` leaves half of the free memory to the allocator's fragmentation, the model's own
temporaries and other processes. Whatever the estimate, a pass that still runs out of memory
(``torch.OutOfMemoryError``) is run again with half the rows (:func:`halving_on_oom`), down to one
row; the cells' values do not depend on the rows per pass (the batch plan stacks whole copies).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Protocol, TypeVar, runtime_checkable

import torch

from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.settings import RunSettings

__all__ = ["CPU_ROWS", "HEADROOM", "MAX_AUTO_ROWS", "rows_per_pass", "row_bytes", "halving_on_oom", "check_rows"]

#: Rows per pass on the CPU (and wherever the free memory cannot be read): the fixed default.
CPU_ROWS = 64
#: The share of the device's free memory that ``"auto"`` plans to fill.
HEADROOM = 0.5
#: The most rows ``"auto"`` puts in one pass (beyond this a pass is no longer latency-bound).
MAX_AUTO_ROWS = 8192

_F = TypeVar("_F", bound=Callable[..., Any])


@runtime_checkable
class RowShape(Protocol):
    """What the size of a row depends on: a :class:`~thermo_lens.core.model.ModelView` has it all."""

    @property
    def device(self) -> torch.device: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def d_model(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def d_vocab(self) -> int | None: ...
    @property
    def model(self) -> object: ...  # its ``cfg.d_mlp``, where it has one


def row_bytes(view: RowShape, width: int, logits: bool = True) -> int:
    """An upper estimate of the activation bytes one row of ``width`` tokens holds at the peak of a
    forward pass: the residual stream and a block's temporaries (``16 d_model + 2 d_mlp`` values per
    token, in the compute dtype, at least 4 bytes each), the attention scores and pattern of one layer
    (``2 n_heads width`` per token, float32), and the float32 logits (``d_vocab`` per token) when the
    pass runs to them."""
    item = max(torch.finfo(view.dtype).bits // 8, 4) if view.dtype.is_floating_point else 4
    d_mlp = int(getattr(getattr(view.model, "cfg", None), "d_mlp", None) or 4 * view.d_model)
    per_token = item * (16 * view.d_model + 2 * d_mlp) + 4 * 2 * view.n_heads * width
    if logits:
        per_token += 4 * int(view.d_vocab or 0)
    return int(width) * per_token


def rows_per_pass(view: RowShape, settings: RunSettings | None, run: dict[str, Any], width: int,
                  logits: bool = True) -> tuple[int, dict[str, Any]]:
    """The rows per pass of a sweep and its run options without ``batch_size="auto"``.

    ``batch_size`` given as an int: that. ``"auto"``, or none given and no ``settings``: on CUDA
    :data:`HEADROOM` of the free device memory over :func:`row_bytes` (at least 1, at most
    :data:`MAX_AUTO_ROWS`), elsewhere :data:`CPU_ROWS`. None given with ``settings``: its ``batch_size``."""
    run = dict(run)
    given = run.get("batch_size", "auto" if settings is None else settings.batch_size)
    if given != "auto":
        return (int(given) if isinstance(given, (int, float)) else given), run
    run.pop("batch_size", None)
    device = view.device
    if device.type != "cuda" or not torch.cuda.is_available():
        return CPU_ROWS, run
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, min(MAX_AUTO_ROWS, int(HEADROOM * free) // max(row_bytes(view, width, logits), 1))), run


def halving_on_oom(fn: _F, *, position: int | None = None, keyword: str | None = None) -> _F:
    """``fn`` run again with half its rows per pass (the argument at ``position`` or ``keyword``)
    each time it raises ``torch.OutOfMemoryError``, down to one row (then the error stands)."""
    @functools.wraps(fn)
    def run(*args: object, **kwargs: object) -> object:
        args_ = list(args)
        while True:
            try:
                return fn(*args_, **kwargs)
            except torch.OutOfMemoryError:
                rows = kwargs[keyword] if keyword is not None and keyword in kwargs else args_[position]  # type: ignore[index]
                if not isinstance(rows, (int, float)) or int(rows) <= 1:
                    raise
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()  # what the failed pass held goes back before the retry
                if keyword is not None and keyword in kwargs:
                    kwargs[keyword] = int(rows) // 2
                else:
                    args_[position] = int(rows) // 2  # type: ignore[index]
    return run  # type: ignore[return-value]


def check_rows(value: object) -> None:
    """``batch_size`` of a sweep: ``"auto"`` or what :class:`~thermo_lens.core.settings.RunSettings`
    accepts (it checks the rest)."""
    if isinstance(value, str) and value != "auto":
        raise ThermoLensInputError(f"batch_size must be a positive int or 'auto', got {value!r}")
