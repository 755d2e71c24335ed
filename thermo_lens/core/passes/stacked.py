"""Stacked conditions: many copies of the prompts in one pass, each copy under its own condition.

Copy ``c`` of the prompts is rows ``c * P .. (c + 1) * P - 1`` of the stacked prompt list; whole
copies run per pass (``max(1, rows_per_pass // P)`` of them, caller's order, right-padded, so each
row equals its own single-condition run up to float rounding). An *edit* at a hook point changes the
rows of the copies it concerns: ``edit(x, rows)`` with ``rows`` the :class:`StackedRows` of the batch
being run. The sweeps (:mod:`thermo_lens.experiments.sweeps.engine`) and the head ablation
(:mod:`thermo_lens.measures.ablation`) are this composition; the runner (a full forward, or from a layer) is
the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from torch import Tensor

from thermo_lens.core.inputs import PromptList
from thermo_lens.core.model import ModelView
from thermo_lens.core.passes.collected import Collected
from thermo_lens.core.passes.one_pass import Runner, collect
from thermo_lens.core.passes.recorder import Reduction
from thermo_lens.core.settings import RunSettings
from thermo_lens.core.tokens import TokenBatch

__all__ = ["StackedRows", "Edit", "run_stacked"]


@dataclass(frozen=True)
class StackedRows:
    """The batch being run, row by row (host lists: no device read): ``copy[b]`` and ``prompt[b]``
    of row ``b`` (``prompt``: the caller's index), its real ``length[b]``, and the batch itself."""

    batch: TokenBatch
    copy: tuple[int, ...]
    prompt: tuple[int, ...]
    length: tuple[int, ...]

    def of_copy(self, c: int) -> list[int]:
        """The rows of copy ``c`` in this batch."""
        return [b for b, k in enumerate(self.copy) if k == c]


#: An edit at one hook point: ``edit(activation, rows)`` changes the activation in place (or returns
#: a tensor of its shape).
Edit = Callable[[Tensor, StackedRows], Any]


def run_stacked(view: ModelView, ps: PromptList, n_copies: int, edits: Sequence[tuple[str, Edit]],
                reductions: Sequence[Reduction], settings: RunSettings, rows_per_pass: int, *, min_tokens: int = 1,
                runner: Runner | None = None, on_logits: Callable[[Tensor, TokenBatch], None] | None = None) -> Collected:
    """One pass of ``n_copies`` copies of ``ps`` stacked along the batch, with ``edits`` as thermo-lens'
    own hooks (after the user's ``fwd_hooks``, which see ``hook.ctx["batch"].prompt_index`` as indices
    into the caller's prompts). Returns the pass's :class:`Collected` (rows: copy-major)."""
    P = len(ps)
    per_pass = max(1, int(rows_per_pass) // P)
    rep = PromptList(texts=ps.texts * n_copies, categories=ps.categories * n_copies, name=ps.name,
                     token_ids=None if ps.token_ids is None else ps.token_ids * n_copies, padding=ps.padding)
    state: dict[str, StackedRows | None] = {"rows": None}

    def on_batch(batch: TokenBatch | None) -> None:
        if batch is None:
            state["rows"] = None
            return
        index = batch.prompt_index.tolist()  # (host tensors: no device read)
        state["rows"] = StackedRows(batch=batch, copy=tuple(i // P for i in index), prompt=tuple(i % P for i in index),
                                    length=tuple(batch.host_lengths))

    def hook(edit: Edit) -> Callable:
        def run_edit(x: Tensor, hook: object = None) -> Tensor:
            rows = state["rows"]
            assert rows is not None, "a stacked edit ran outside its pass"
            out = edit(x, rows)
            return x if out is None else out
        return run_edit

    run = RunSettings.resolve(settings, batch_size=per_pass * P, sort_by_length=False, progress=False)
    return collect(view, rep, reductions, run, min_tokens=min_tokens,
                   internal_hooks=[(name, hook(e)) for name, e in edits], row_prompt=list(range(P)) * n_copies,
                   on_batch=on_batch, on_logits=on_logits, runner=runner)
