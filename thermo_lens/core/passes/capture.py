"""Clean activations for patching: one pass keeping the activations at some hook points.

:func:`capture` runs the prompts through the same :class:`~thermo_lens.core.passes.one_pass.Pass` as
every measurement (batching, BOS, the user's hooks, the hooks already on the model, provenance) and
keeps, per prompt, its real tokens' activation at each point, on the CPU.
:func:`thermo_lens.patch_from` and the sweeps' clean runs (:mod:`thermo_lens.experiments.sweeps.engine`) are this
function.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from torch import Tensor

from thermo_lens.core.inputs import Prompts
from thermo_lens.core.model import ModelView
from thermo_lens.core.passes.collected import Collected
from thermo_lens.core.passes.one_pass import collect
from thermo_lens.core.passes.recorder import Recorder, Reduction
from thermo_lens.core.settings import RunSettings
from thermo_lens.core.tokens import TokenBatch

__all__ = ["capture"]


def capture(view: ModelView, prompts: Prompts, points: Sequence[str], settings: RunSettings, *,
            position_dims: Callable[[str], tuple[int, ...]] = lambda name: (1,),
            shape: Callable[[Tensor], Tensor] | None = None, reductions: Sequence[Reduction] = (),
            min_tokens: int = 1,
            on_logits: Callable[[Tensor, TokenBatch], None] | None = None) -> tuple[dict[str, list[Tensor]], Collected]:
    """Run ``prompts`` (under ``settings``: BOS, batches, the user's hooks) and keep the activation at
    each hook point of ``points``: ``{point: [per prompt, caller's order, the activation without its
    batch axis cut to the prompt's real tokens along position_dims(point) (counted with the batch
    axis)]}``, on the CPU in the model's dtype, and the pass's :class:`Collected` (``reductions``
    recorded beside, ``on_logits`` as for :func:`~thermo_lens.core.passes.collect`). ``shape``: applied to
    the activation first (e.g. splitting a flat head axis)."""
    def keep(view_: ModelView, rec: Recorder) -> None:
        for k, point in enumerate(points):
            rec.add(point, ("capture", k),
                    lambda x, batch: (x if shape is None else shape(x)).detach().to("cpu", copy=True))
    got = collect(view, prompts, [keep, *reductions], settings, min_tokens=min_tokens, on_logits=on_logits)
    kept: dict[str, list[Any]] = {p: [None] * len(got.lengths) for p in points}
    caller = got.row_prompt.tolist() if got.row_prompt is not None else list(range(len(got.lengths)))
    recorded = got.lengths[got.row_prompt].tolist() if got.row_prompt is not None else got.lengths.tolist()
    for k, point in enumerate(points):
        r = 0
        for part in got.recorder._parts[("capture", k)]:  # one batch: [batch, ...], padded to its longest prompt
            for b in range(part.shape[0]):
                act = part[b]
                for d in position_dims(point):
                    act = act.narrow(d - 1, 0, int(recorded[r]))
                kept[point][caller[r]] = act.clone()
                r += 1
    return kept, got
