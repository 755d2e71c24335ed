"""A pass: prompts and their tokenized batch plan, run settings and the recorder, in one object.

:class:`Pass` is the one place where a run's prompts are tokenized (BOS handling), batched, its user
hooks checked (names against the model's hook points, hooks that know what they were built for),
the hooks already on the model detected, and its provenance built (:meth:`Pass.collected`). How each
batch runs is the runner's (:class:`Runner`): :class:`Forward` here, a replay of an
``ActivationCache`` (:mod:`thermo_lens.core.passes.cached`), a start at layer ``l`` from given residuals
(:mod:`thermo_lens.core.passes.from_layer`); stacked conditions are rows of one pass
(:mod:`thermo_lens.core.passes.stacked`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor

from thermo_lens.core import attached
from thermo_lens.core.errors import ThermoLensHookError
from thermo_lens.core.inputs import PromptList, as_model_prompts
from thermo_lens.core.model import ModelView, as_view
import thermo_lens.core.passes.memory as memory
from thermo_lens.core.passes.collected import Collected, check_finite, check_silent
from thermo_lens.core.passes.recorder import Recorder, Reduction, batch_mask
from thermo_lens.core.passes.user_hooks import Current, hook_site, wrap_user_hooks
from thermo_lens.core.provenance import HookRecord, attached_records, describe_hook
from thermo_lens.core.settings import RunSettings
from thermo_lens.core.tokens import MAX_PADDING, BatchInfo, TokenBatch, plan_batches, token_batch

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["Pass", "Runner", "Forward", "collect"]

Hooks = Sequence[tuple[Any, Callable]]


@runtime_checkable
class Runner(Protocol):
    """How one batch of a pass runs: ``run_batch(view, batch, rows, hooks, stop_after=,
    return_logits=)`` runs ``batch`` (its ``[batch, pos]`` tokens and mask) with ``hooks`` (the user's,
    thermo-lens' own, the reductions', in that order) and returns the logits when asked.
    ``rows``: the caller's prompt of each row (``[batch]``, on the host)."""

    def run_batch(self, view: ModelView, batch: TokenBatch, rows: Tensor, hooks: Hooks, *,
                  stop_after: str | None, return_logits: bool) -> Tensor | None: ...


class Forward:
    """A full forward pass from the embedding (:meth:`ModelView.run`)."""

    def run_batch(self, view: ModelView, batch: TokenBatch, rows: Tensor, hooks: Hooks, *,
                  stop_after: str | None, return_logits: bool) -> Tensor | None:
        return view.run(batch.tokens, batch_mask(batch), hooks, stop_after=stop_after, return_logits=return_logits)


@dataclass
class Pass:
    """One pass over a prompt list: what runs, in which batches, under which hooks, into which recorder.

    Attributes:
        view: the model.
        prompts: the prompt list (for a stacked pass, its copies).
        tokens: every prompt tokenized once, before anything runs (a bad prompt fails first).
        plan: the prompt indices of each batch, in the order they run.
        settings: the run settings (``fwd_hooks`` checked).
        recorder: the reductions' recorder.
        hidden: the hooks already on the model, detected before any hook of ours is registered.
        internal_hooks: thermo-lens' own intervention hooks (after the user's, not wrapped).
        user_index: for a list that repeats the caller's prompts, the caller's index of each prompt
            (``None``: the list is the caller's).
        row_order: record the caller's index of every row (batches may run in length order).
        origin, cache_match: how the activations were obtained (a forward pass, an ``ActivationCache``).
    """

    view: ModelView
    prompts: PromptList
    tokens: TokenBatch
    plan: list[list[int]]
    settings: RunSettings
    recorder: Recorder
    hidden: tuple[HookRecord, ...] = ()
    internal_hooks: list[tuple[Any, Callable]] = field(default_factory=list)
    user_index: Tensor | None = None
    row_order: bool = True
    origin: str = "forward pass"
    cache_match: str = ""

    @classmethod
    def build(cls, model: TransformerLensModel | ModelView, prompts: Any, reductions: Sequence[Reduction], settings: Any = None, *,
              min_tokens: int = 1, internal_hooks: Hooks = (), row_prompt: Sequence[int] | None = None,
              **options: Any) -> "Pass":
        """Resolve the settings, check the user's hooks, tokenize, plan the batches, detect the hooks
        already on the model, and register the reductions (see :func:`collect`)."""
        view = as_view(model)
        settings = RunSettings.resolve(settings, **options)
        attached.check_hook_names(view.model, [name for name, _ in settings.fwd_hooks], view.name)
        ps = as_model_prompts(view, prompts)
        if row_prompt is not None and len(row_prompt) != len(ps):
            raise ValueError("row_prompt needs one entry per prompt")
        # Tokenize everything once, first, so a bad prompt fails before any compute.
        everything = token_batch(view, ps, range(len(ps)), prepend_bos=settings.prepend_bos,
                                 truncate=settings.truncate, min_tokens=min_tokens)
        for _, fn in settings.fwd_hooks:  # hooks that know what they were built for (a patch: its model, its BOS)
            check = getattr(fn, "thermo_lens_check", None)
            if callable(check):
                check(view=view, prepend_bos=everything.prepend_bos, settings=settings)
        # The plan depends on the lengths and settings only, never on the user's hooks: two runs that
        # differ by their hooks batch identically (a paired difference is then exactly the hooks'
        # effect). thermo-lens' own intervention passes stack copies of each prompt: caller's order.
        plan = plan_batches(everything.lengths, settings.batch_size,
                            sort_by_length=False if internal_hooks else settings.sort_by_length,
                            max_padding=None if internal_hooks else MAX_PADDING)
        hidden = attached_records(attached.attached_hooks(view.model))  # before any hook of ours is registered
        rec = Recorder()
        # Nothing but the reductions' own hooks runs in this pass: no activation changes between two of
        # their reads (the attribution then needs no copy of a block's output to find a splice).
        rec.foreign_hooks = bool(settings.fwd_hooks or internal_hooks or hidden)
        for r in reductions:
            r(view, rec)
        user_index = None if row_prompt is None else torch.as_tensor(list(row_prompt), dtype=torch.long)
        return cls(view=view, prompts=ps, tokens=everything, plan=[list(map(int, rows)) for rows in plan],
                   settings=settings, recorder=rec, hidden=tuple(hidden), internal_hooks=list(internal_hooks),
                   user_index=user_index)

    def run(self, runner: Runner | None = None, *, on_batch: Callable[[TokenBatch | None], None] | None = None,
            on_logits: Callable[[Tensor, TokenBatch], None] | None = None) -> Collected:
        """Run every batch of the plan with ``runner`` (default :class:`Forward`), check the pass (every
        hook ran, no real token NaN/inf) and return what it recorded. ``on_batch``: called with each
        batch before it runs (``None`` after); ``on_logits``: every batch runs to the logits and gets
        them (``[batch, pos, d_vocab]``)."""
        from tqdm.auto import tqdm  # imported on first use: a notebook's progress bar

        runner = Forward() if runner is None else runner
        view, rec, settings, plan = self.view, self.recorder, self.settings, self.plan
        n_batches = len(plan)
        current = Current()
        hooks = wrap_user_hooks(settings.fwd_hooks, current) + list(self.internal_hooks) + rec.fwd_hooks()
        # Every state measured is a block's: when no hook is registered past the blocks, the pass ends
        # after the last block (the final norm and the unembedding, whose logits nothing reads, are skipped).
        # Hooks already on the model do not extend the pass: past the last block read they cannot change
        # a measured state (they are recorded all the same).
        stop_after = None if on_logits is not None else view.last_hook_needed([name for name, _ in hooks])
        show = settings.progress if settings.progress is not None else n_batches > 1
        # Counted in prompts, not batches: the bar's rate is prompts/s and its ETA holds for length-bucketed
        # batches of different sizes (a long run of thousands of prompts).
        # The device is looked up once for the pass: finding a dispatched model's execution device walks every module.
        with tqdm(total=sum(len(rows) for rows in plan), desc=f"thermo-lens {view.name}", unit="prompt",
                  disable=not show, leave=False, smoothing=0.05) as bar, view.pinned_device() as device:
            for k, rows in enumerate(plan):
                batch = self.tokens.select(rows)
                user_rows = batch.prompt_index if self.user_index is None else self.user_index[batch.prompt_index]
                current.info = BatchInfo.of(batch, k, n_batches, None if self.user_index is None else user_rows)
                try:
                    if on_batch is not None:
                        on_batch(batch)
                    with rec.batch(batch):
                        logits = runner.run_batch(view, batch, user_rows, hooks, stop_after=stop_after,
                                                  return_logits=on_logits is not None)
                    if on_logits is not None:
                        assert logits is not None, "the runner returned no logits (return_logits=True)"
                        on_logits(logits, batch)
                finally:
                    current.info = None
                    if on_batch is not None:
                        on_batch(None)
                if k % memory.TRIM_EVERY == memory.TRIM_EVERY - 1 and device.type == "cpu":
                    memory.release_freed_memory()
                check_silent(view, rec)
                bar.update(len(batch.prompt_index))
        rec._per_pass.clear()  # e.g. a copy of W_O: not kept with the results
        check_finite(view, rec)  # the results reach the host here, once for the pass
        never = [i for i in range(len(settings.fwd_hooks)) if i not in current.fired]
        if never:
            name, fn = settings.fwd_hooks[never[0]]
            raise ThermoLensHookError(
                f"{hook_site(name, fn, None)} never ran in {n_batches} batch(es): {view.name} "
                f"({view.host.describe()}) does not fire that hook point in a forward pass (e.g. hook_result needs "
                "model.set_use_attn_result(True), hook_attn_in model.set_use_attn_in(True)), so the result would "
                "record an intervention that did not happen. Enable the hook point or hook another one.")
        return self.collected()

    def collected(self) -> Collected:
        """What the pass recorded, with its provenance (the one place a pass's provenance is made)."""
        ps, everything, plan = self.prompts, self.tokens, self.plan
        order = [i for rows in plan for i in rows]
        return Collected(
            recorder=self.recorder,
            lengths=everything.lengths,
            prompts=tuple(ps.texts),
            prepend_bos=everything.prepend_bos,  # what "host" resolved to (True/False/"host:...")
            truncated=everything.truncated,
            view=self.view,
            row_prompt=(everything.prompt_index[torch.as_tensor(order, dtype=torch.long)] if self.row_order
                        else None),
            hooks=tuple(describe_hook(n, f) for n, f in self.settings.fwd_hooks) + tuple(self.hidden),
            prompt_set=ps.name,
            categories=tuple(ps.categories),
            settings=self.settings,
            padding=ps.padding,
            batch_plan=tuple(tuple(int(i) for i in rows) for rows in plan),
            origin=self.origin,
            cache_match=self.cache_match,
        )


def collect(
    model: TransformerLensModel | ModelView,
    prompts: Any,
    reductions: Sequence[Reduction],
    settings: Any = None,
    *,
    min_tokens: int = 1,
    internal_hooks: Hooks = (),
    row_prompt: Sequence[int] | None = None,
    on_batch: Callable[[TokenBatch | None], None] | None = None,
    on_logits: Callable[[Tensor, TokenBatch], None] | None = None,
    runner: Runner | None = None,
    **options: Any,
) -> Collected:
    """Run ``prompts`` through the model in padded batches with the given reductions.

    Args:
        model: a TransformerLens model or :class:`ModelView`.
        prompts: anything :func:`thermo_lens.core.inputs.as_prompts` takes (strings, a set name,
            ``{category: [...]}``, token ids).
        reductions: functions like :func:`residual_norms` that register hooks on a Recorder.
        settings: a :class:`thermo_lens.core.settings.RunSettings`; ``**options`` (``prepend_bos``,
            ``batch_size``, ``truncate``, ``fwd_hooks``, ``progress``, ``sort_by_length``)
            override its fields.
        min_tokens: minimum real tokens per prompt.
        internal_hooks: thermo-lens' own intervention hooks (run after the user's, not wrapped).
        row_prompt: for a prompt list that repeats the user's prompts (internal use), the user's
            index of each prompt, shown to user hooks as ``hook.ctx["batch"].prompt_index``.
        on_batch: called with each batch before it runs (``None`` after it ran), for internal hooks
            that act per row (``batch.prompt_index``: rows of ``prompts``).
        on_logits: when given, every pass runs to the logits and ``on_logits(logits, batch)`` gets
            them (``[batch, pos, d_vocab]``) after each batch.
        runner: how each batch runs (default :class:`Forward`, the full forward pass;
            :class:`thermo_lens.core.passes.from_layer.FromLayer`: from a layer's given residuals).

    Before anything runs, every ``fwd_hooks`` name is checked against the model's hook points
    (:func:`thermo_lens.core.attached.check_hook_names`: a misspelt or out-of-range name is an error
    naming the closest valid ones), and the hooks already on the model (``model.add_hook``,
    ``with model.hooks(...)``, SAEs, PyTorch module hooks) are detected and recorded with the
    ``fwd_hooks`` (:func:`thermo_lens.core.attached.attached_hooks`). User hooks run in the same pass
    *before* the reductions, wrapped so that they can read ``hook.ctx["batch"]``
    (:class:`thermo_lens.core.tokens.BatchInfo`) and fail with an error naming the hook and batch (also
    for a return value the host cannot use); a ``fwd_hooks`` entry that never ran (a hook point the
    host does not fire) is an error. Prompts that fit one batch run as one batch in the caller's
    order; more run in length buckets of up to ``batch_size`` prompts that pad at most 10% of
    their positions (:func:`plan_batches`); the plan never depends on the hooks, and results come
    back in the caller's order either way.

    Every state measured is a block's, so unless a hook is registered past the blocks (e.g. at
    ``ln_final.*``, or a name filter), the pass ends after the last block's ``hook_resid_post``:
    the final norm and the unembedding (``d_model x d_vocab`` per token) never run
    (:meth:`ModelView.run`'s ``stop_after``; the numbers are those of a full forward).

    Raises:
        ThermoLensInputError: a hook name the model has no hook point for.
        ThermoLensNumericsError: a real token's residual norm or attention was NaN/inf; the
            message names the first hook point (layer) where it happened.
        thermo_lens.core.errors.ThermoLensHookError: a user hook failed, or never ran.
    """
    one = Pass.build(model, prompts, reductions, settings, min_tokens=min_tokens, internal_hooks=internal_hooks,
                     row_prompt=row_prompt, **options)
    return one.run(runner, on_batch=on_batch, on_logits=on_logits)
