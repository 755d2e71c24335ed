"""Sweeps whose cells start at their layer: the runner and the host support live with the passes.

A sweep's cell at layer ``l`` leaves blocks ``0..l-1`` as they were without it, so its pass can
begin at block ``l`` from the unpatched run's ``x_l`` (:class:`thermo_lens.core.passes.from_layer.FromLayer`,
where :func:`start_support` allows it; the hosts, the fallbacks and the check are described there).
"""

from __future__ import annotations

from thermo_lens.core.passes.from_layer import BLOCK_HOOK, FromLayer, start_support
from thermo_lens.core.passes.from_layer import _takes_start  # noqa: F401  (the host probe, tested here)

__all__ = ["start_support", "FromLayer", "BLOCK_HOOK"]
