"""The sweep's passes: hook layouts, measures, captured activations, and many conditions per pass.

Every condition (a cell: layer, and head and/or position) is one copy of the prompts; copies are
stacked along the batch, ``max(1, batch_size // n_prompts)`` copies per forward pass (one copy
without any condition first: the baseline), and a hook at each swept layer edits only the rows
of the conditions at that layer. The rows of a pass are in caller order and right-padded, so each
row equals its own single-condition run up to float rounding. Passes end after the last block
unless the measure reads the logits.

Where the host supports it (:mod:`thermo_lens.experiments.sweeps.start`), the conditions run grouped by the
layer their pass starts at: one unpatched pass keeps ``x_l`` of every start layer ``l`` (and the
residual norms of every state), then each group's stacked passes start at block ``l`` from it, since
blocks below a cell's layer compute what they compute without the cell. A gain measure reads the
norms of the states before ``l`` from the unpatched pass; cells after the last block a measure reads
(:meth:`Measure.last_layer_read`) take the unpatched value without a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from thermo_lens.core import registry
from thermo_lens.core.errors import ThermoLensError, ThermoLensInputError, ThermoLensNumericsError
from thermo_lens.core.inputs import PromptList
from thermo_lens.core.model import ModelView
from thermo_lens.core.passes import Collected, Recorder, Reduction
from thermo_lens.core.passes.recorder import Reduce
from thermo_lens.core.passes.capture import capture as capture_points
from thermo_lens.core.passes.one_pass import Runner
from thermo_lens.core.passes.stacked import StackedRows, run_stacked
from thermo_lens.core.settings import RunSettings
from thermo_lens.experiments.sweeps.feature_measure import (FEATURE_MEASURE_DEFINITION, feature_measure_layer, feature_readout,
                                                parse_feature_measure)
from thermo_lens.experiments.sweeps.logits import LogitDifference
from thermo_lens.experiments.sweeps.start import BLOCK_HOOK, FromLayer, start_support
from thermo_lens.core.tokens import TokenBatch
from thermo_lens.core.validate import excerpt

__all__ = ["HookLayout", "hook_layout", "Measure", "parse_measure", "measure_values", "measure_definitions", "capture",
           "run_conditions", "Condition", "Sources"]

#: The values conditions write: ``sources[(layer, slot)][prompt]`` (see :func:`run_conditions`);
#: ``None``: zeros.
Sources = dict[tuple[int, int], list[Tensor]] | None

#: The definitions of the sweep's own measures (the registry's readouts are the others).
_SWEEP_MEASURES: dict[str, str] = {
    "sae_feature:<hook>.<i>": FEATURE_MEASURE_DEFINITION,
    "LogitDifference(answer, wrong, pos)": "logits[p, pos, answer_p] - logits[p, pos, wrong_p] at a position of each "
                                           "prompt's real tokens, from the final residual: the model's head (final norm; "
                                           "an LM-head transform or project_out where it has one), the two "
                                           "unembedding columns, then its logit scaling and soft cap, checked against "
                                           "its own logits (thermo_lens.experiments.sweeps.LogitDifference)",
}


def measure_definitions() -> dict[str, str]:
    """Every per-prompt measure a sweep takes by name, with its definition (``<layer>`` 0-based,
    negative from the end; ``<head>`` a query head): the readouts of every registered measurement
    (:func:`thermo_lens.core.registry.readouts`: ``block_gain:<layer>``, ``write_norm:<layer>.<head>``
    ...), each a number of one prompt computed in the same stacked passes as the sweep's conditions,
    normalised as the library's own result of that name; then an SAE latent and the logit difference."""
    return {pattern: r.definition for pattern, (_, r) in registry.readouts().items()} | _SWEEP_MEASURES


if TYPE_CHECKING:
    MEASURE_DEFINITIONS: dict[str, str]
    GAIN_MEASURES: tuple[str, ...]


def __getattr__(name: str) -> object:
    # The vocabulary these names held now comes from the registry's readouts (measure_definitions()).
    if name == "MEASURE_DEFINITIONS":
        return measure_definitions()
    if name == "GAIN_MEASURES":
        return tuple(r.pattern for r in registry.measurement("gain").readouts)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")



# per-layer hook -> (head dim, position dim) of its activation [batch, ...]; head dim None: no head axis
_HEAD_HOOKS = {"attn.hook_z": (2, 1), "attn.hook_q": (2, 1), "attn.hook_result": (2, 1), "attn.hook_rot_q": (2, 1),
               "attn.hook_k": (2, 1), "attn.hook_v": (2, 1), "attn.hook_rot_k": (2, 1),
               "attn.hook_pattern": (1, 2), "attn.hook_attn_scores": (1, 2)}
# hooks whose head axis holds the key/value heads (n_kv_heads under grouped-query attention)
_KV_HOOKS = frozenset({"attn.hook_k", "attn.hook_v", "attn.hook_rot_k"})
_BARE = {h.split(".", 1)[1]: h for h in _HEAD_HOOKS}


@dataclass(frozen=True)
class HookLayout:
    """A per-layer hook point and where its activation keeps heads and positions (``kv``: its
    head axis holds the key/value heads, ``n_kv_heads`` of them under grouped-query attention)."""

    suffix: str
    head_dim: int | None
    pos_dim: int
    kv: bool = False

    def name(self, layer: int) -> str:
        return f"blocks.{layer}.{self.suffix}"

    def n_heads(self, view: ModelView) -> int:
        """The size of the head axis: the query heads, or the KV heads of a key/value hook."""
        return view.n_kv_heads if self.kv else view.n_heads

    @property
    def square(self) -> bool:
        """``[batch, head, query, key]``: a position is a query row over the prompt's keys."""
        return self.pos_dim != 1


def hook_layout(hook: object, over: tuple[str, ...]) -> HookLayout:
    """The layout of per-layer hook ``hook`` (``"attn.hook_z"``, ``"hook_pattern"``, ``"hook_resid_pre"``)."""
    if not isinstance(hook, str) or not hook:
        raise ThermoLensInputError(f"hook must be a per-layer hook name such as 'attn.hook_z' or 'hook_resid_pre', "
                                   f"got {hook!r}")
    if hook.startswith("blocks."):
        raise ThermoLensInputError(
            f"hook={hook!r} names one layer; a sweep takes the per-layer name ({hook.split('.', 2)[-1]!r}) and runs "
            "every layer: pass layers=[...] to sweep some")
    suffix = _BARE.get(hook, hook)
    if suffix in _HEAD_HOOKS:
        hd, pd_ = _HEAD_HOOKS[suffix]
        return HookLayout(suffix, hd, pd_, kv=suffix in _KV_HOOKS)
    if "head" in over:
        raise ThermoLensInputError(
            f"hook {hook!r} has no head axis, so over={over if len(over) > 1 else over[0]!r} cannot sweep heads; "
            f"use a per-head hook ({', '.join(sorted(_HEAD_HOOKS))}) or over='pos'")
    return HookLayout(suffix, None, 1)


@dataclass(frozen=True)
class Measure:
    """A per-prompt scalar of a sweep (:func:`measure_definitions`): ``kind`` ``"readout"`` (a
    registered measurement's readout, ``source`` its :class:`~thermo_lens.core.registry.Probe`),
    ``"sae_feature"`` (an SAE latent), ``"logit_difference"`` (``source`` the LogitDifference) or
    ``"logits"`` (``fn`` of the logits)."""

    label: str
    layer: int | None = None
    fn: Callable[[Tensor], object] | None = None  # (its values are checked: _call_measure)
    kind: str = "readout"
    head: int | None = None
    definition: str = ""
    source: registry.Probe | LogitDifference | str | None = None  # (str: the SAE hook of an sae_feature)

    @property
    def needs_logits(self) -> bool:
        return self.fn is not None

    @property
    def probe(self) -> registry.Probe | None:
        return self.source if isinstance(self.source, registry.Probe) else None

    @property
    def carried(self) -> str | None:
        """Recorder entries (one per residual state) a pass starting later takes from the unpatched pass."""
        return self.probe.readout.carried if self.probe is not None else None

    def min_tokens(self, token_scope: str) -> int:
        """Real tokens each prompt needs (``all_but_first`` drops position 0 of the scoped means)."""
        if self.probe is not None:
            return self.probe.measurement(token_scope).min_tokens()
        return 2 if token_scope == "all_but_first" and self.kind == "sae_feature" else 1

    def scope(self, token_scope: str) -> str:
        """The token scope the numbers are in (checked by the measurement's options): the run's
        where the readout's measurement takes one, else the readout's own."""
        if self.probe is not None:
            m = self.probe.measurement(token_scope)
            return self.probe.readout.scope or str(getattr(m.options, "token_scope", token_scope))
        if isinstance(self.source, LogitDifference):
            return f"position {self.source.pos} of each prompt's real tokens"
        return "n/a" if self.kind == "logits" else token_scope

    def last_layer_read(self, n_layers: int) -> int:
        """The deepest block whose hook points the measure reads: a condition at a later layer
        leaves the measure as it was without it."""
        if self.probe is not None:
            return self.probe.readout.last_layer_read(self.probe, n_layers)
        if self.kind == "sae_feature":  # (an SAE's latents: the last block before them)
            return max(self.layer or 0, 0)
        return n_layers - 1

    def start_layer(self, layer: int) -> int:
        """Where the pass of a condition at ``layer`` starts (the readout's block, if it says so)."""
        return self.probe.readout.start_layer(self.probe, layer) if self.probe is not None else layer

    def reductions(self, token_scope: str, n_prompts: int = 1,
                   keep: Callable[[tuple[str, int]], bool] | None = None) -> list[Reduction]:
        """The in-pass reductions the measure reads (a readout's: only the entries it reads;
        ``keep``: fewer still; ``n_prompts``: the prompts whose copies a pass stacks)."""
        if isinstance(self.source, LogitDifference):
            return [self.source.reduction(n_prompts)]
        if isinstance(self.source, str):  # an sae_feature's hook
            return [feature_readout(self.source, int(self.head or 0), token_scope)]
        probe = self.probe
        if probe is None:
            return []
        readout = probe.readout

        def kept(key: tuple[str, int]) -> bool:
            return readout.keep(probe, key) and (keep is None or keep(key))
        return [_only(r, kept) for r in readout.reductions(probe.measurement(token_scope))]


def parse_measure(measure: object, n_layers: int, n_heads: int | None = None) -> Measure:
    """The :class:`Measure` named by ``measure`` (a readout of :func:`measure_definitions`), a
    LogitDifference, or a function of the logits."""
    if isinstance(measure, LogitDifference):
        return Measure(measure.label, kind="logit_difference", source=measure,
                       definition=_SWEEP_MEASURES["LogitDifference(answer, wrong, pos)"])
    if callable(measure):
        return Measure(f"logits:{getattr(measure, '__qualname__', None) or getattr(measure, '__name__', repr(measure))}",
                       fn=measure, kind="logits",
                       definition="a function of the logits [prompt, pos, d_vocab] -> [prompt], called once per "
                                  "condition with all prompts in the caller's order")
    if isinstance(measure, str) and measure.startswith("sae_feature:"):
        hook, feature = parse_feature_measure(measure)
        return Measure(f"sae_feature:{hook[:-len('.hook_sae_acts_post')]}.{feature}", kind="sae_feature", head=feature,
                       layer=feature_measure_layer(hook), source=hook,
                       definition=_SWEEP_MEASURES["sae_feature:<hook>.<i>"])
    probe = registry.readout(measure, n_layers, n_heads)
    if probe is None:
        names = list(measure_definitions())[:-1]
        raise ThermoLensInputError(
            f"unknown measure {measure!r}; choose one of {', '.join(map(repr, names))} (the registered measurements' "
            "readouts: thermo_lens.experiments.sweeps.measure_definitions()), a thermo_lens.experiments.sweeps.LogitDifference, or a function "
            "of the logits [batch, pos, d_vocab] -> [batch]")
    return Measure(probe.label, layer=probe.layer, head=probe.index[0] if probe.index else None, kind="readout",
                   definition=probe.definition, source=probe)


def _only(reduction: Reduction, keep: Callable[[tuple[str, int]], bool]) -> Reduction:
    """``reduction`` registering only the hooks whose key ``(name, layer)`` passes ``keep`` (e.g. one
    block's), on a view of the recorder that shares its state (its instance dict): what the kept
    hooks record is the recorder's."""
    class _Some(Recorder):
        def __init__(self) -> None:  # no Recorder.__init__: the state is the recorder's (shared below)
            pass

        def add(self, hook_name: str, key: tuple[str, int], fn: Reduce) -> None:
            if keep(key):
                super().add(hook_name, key, fn)

    def some(view: ModelView, rec: Recorder) -> None:
        sub = _Some()
        sub.__dict__ = rec.__dict__
        reduction(view, sub)
    return some


def _one_layer(reduction: Reduction, layer: int | None) -> Reduction:
    """``reduction`` registering only block ``layer``'s hooks."""
    assert layer is not None
    return _only(reduction, lambda key: key[1] == layer)


def _as_heads(x: Tensor, layout: HookLayout, view: ModelView) -> Tensor:
    """``x`` with its head axis split out (``[batch, pos, head * d]`` hosts give hook_z flat)."""
    if layout.head_dim == 2 and x.ndim == 3 and not getattr(layout, "features", False):  # (an SAE's latents: flat)
        return x.view(x.shape[0], x.shape[1], layout.n_heads(view), -1)
    return x


def measure_values(got: Collected, measure: Measure, token_scope: str,
                   row_name: Callable[[int], str] = lambda r: f"prompt {r}") -> Tensor:
    """``[row]`` float64: the measure of every row of a pass that ran ``measure.reductions``
    (``row_name``: how an error names a row; a readout checks what its measurement checks, e.g.
    the attribution its block's closure)."""
    if measure.kind == "logit_difference":
        return got.stack("logit_difference")[0].double()
    if measure.kind == "sae_feature":
        return got.stack("sae_feature")[0].double()
    probe = measure.probe
    assert probe is not None, measure
    return torch.as_tensor(probe.readout.values(got, probe, probe.measurement(token_scope), row_name)).double()


def capture(view: ModelView, ps: PromptList, layout: HookLayout, layers: Sequence[int], settings: RunSettings, *,
            measure: Measure | None, token_scope: str, min_tokens: int,
            rows_per_pass: int) -> tuple[dict[int, list[Tensor]], Tensor | None]:
    """One run of ``ps`` (under the user's hooks, ``rows_per_pass`` prompts per pass) keeping the
    activation at ``layout`` of each layer (per prompt, its real tokens:
    :func:`thermo_lens.core.passes.capture.capture`) and, if ``measure`` is given, the measure per prompt."""
    reductions: list[Any] = []
    logits_out: dict[int, Tensor] = {}
    on_logits = None
    if measure is not None and measure.needs_logits:
        def on_logits(logits: Tensor, batch: TokenBatch) -> None:
            vals = _call_measure(measure, logits, len(batch.prompt_index))
            for b, i in enumerate(batch.prompt_index.tolist()):
                logits_out[i] = vals[b]
    elif measure is not None:
        reductions += measure.reductions(token_scope, len(ps))
    # a logit measure sees all prompts at once (as in the sweep's passes): then one batch
    size = len(ps) if on_logits is not None else max(int(rows_per_pass), 1)
    run = RunSettings.resolve(settings, batch_size=size, sort_by_length=False, progress=False)
    square = layout.suffix in ("attn.hook_pattern", "attn.hook_attn_scores")
    dims = (layout.pos_dim, layout.pos_dim + 1) if square else (layout.pos_dim,)
    names = {l: layout.name(l) for l in sorted(layers)}
    kept, got = capture_points(view, ps, list(names.values()), run, position_dims=lambda name: dims,
                               shape=lambda x: _as_heads(x, layout, view), reductions=reductions,
                               min_tokens=min_tokens, on_logits=on_logits)
    acts = {l: kept[name] for l, name in names.items()}
    values = None
    if measure is not None:
        values = (torch.stack([logits_out[i] for i in range(len(ps))]) if measure.needs_logits
                  else measure_values(got, measure, token_scope))
    return acts, values


def _call_measure(measure: Measure, logits: Tensor, n: int) -> Tensor:
    """The function's ``[prompt]`` values as float64 (non-finite ones kept: the sweep names them),
    or a specific error for anything but one real number per prompt."""
    assert measure.fn is not None
    got = measure.fn(logits)
    want = f"measure {measure.label}: a logit measure must return one real number per prompt ([batch] = {n}, a " \
           "tensor, array or list of numbers)"
    if got is None or isinstance(got, (str, bytes)) or (isinstance(got, (list, tuple)) and any(
            isinstance(v, (str, bytes)) or v is None for v in got)):
        raise ThermoLensInputError(f"{want}, got {type(got).__name__} {excerpt(got)}")
    try:
        out = torch.as_tensor(got.detach() if isinstance(got, Tensor) else got)
    except (TypeError, ValueError, RuntimeError):
        raise ThermoLensInputError(f"{want}, got {type(got).__name__} {excerpt(got)}") from None
    if out.is_complex() or not (out.is_floating_point() or out.dtype in _INT_DTYPES):
        raise ThermoLensInputError(f"{want}, got values of dtype {out.dtype}")
    out = out.to("cpu").double().reshape(-1)
    if out.numel() != n:
        raise ThermoLensInputError(f"{want}, got {out.numel()} values")
    bad = ~torch.isfinite(out)
    if bool(bad.any()) and not bool(torch.isfinite(logits).all()):
        # NaN/inf logits come from a NaN/inf weight or activation upstream, not from the cell: no value of
        # this sweep can be trusted, so stop here. A measure that makes NaN from finite logits is kept
        # as NaN, and the sweep names those cells in its notes.
        rows = bad.nonzero().flatten().tolist()
        raise ThermoLensNumericsError(
            f"measure {measure.label} returned NaN/inf for batch row(s) {rows[:8]} of {n}: the logits themselves "
            "hold NaN/inf (a NaN/inf weight or activation upstream)")
    return out


_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


@dataclass(frozen=True)
class Condition:
    """One cell: the layer, the head (or None: every head), the positions of each prompt it edits,
    and the slot of the values it writes there (one per swept position label)."""

    layer: int
    head: int | None
    positions: tuple[tuple[int, ...], ...]  # per prompt, indices of its real tokens
    slot: int = 0  # which values it writes: sources[(layer, slot)]


def run_conditions(view: ModelView, ps: PromptList, layout: HookLayout, conditions: Sequence[Condition],
                   sources: Sources, settings: RunSettings, rows_per_pass: int, *,
                   measure: Measure, token_scope: str, min_tokens: int,
                   start_at_layer: bool = True) -> tuple[Tensor, Any, str]:
    """The measure of every prompt under every condition: ``[1 + n_conditions, prompt]`` (row 0:
    no condition), the provenance of the baseline copy, and how the passes ran.
    ``sources[(layer, slot)][p]``: the values a condition of that layer and slot writes into prompt
    ``p``, in the order of its positions (``[k, ...]``; ``[head, k, key]`` for a square hook);
    ``sources=None``: zeros.

    Where the host supports it (:func:`thermo_lens.experiments.sweeps.start.start_support`) and
    ``start_at_layer``, each cell's pass starts at its layer from the unpatched run's residual
    (:func:`_from_layers`); else every pass runs from the embedding, conditions stacked."""
    why = "start_at_layer=False" if not start_at_layer else start_support(view, settings.fwd_hooks)
    if why is None:
        done, why = _from_layers(view, ps, layout, conditions, sources, settings, rows_per_pass, measure=measure,
                                 token_scope=token_scope, min_tokens=min_tokens)
        if done is not None:
            return done
    values, got = _stacked(view, ps, layout, [None, *conditions], sources, settings, rows_per_pass,
                           measure.reductions(token_scope, len(ps)), measure=measure, token_scope=token_scope,
                           min_tokens=min_tokens)
    return values, got.provenance().select(torch.arange(len(ps))), f"every pass from the embedding ({why})"


def _stacked(view: ModelView, ps: PromptList, layout: HookLayout, copies: Sequence[Condition | None],
             sources: Sources, settings: RunSettings, rows_per_pass: int,
             reductions: list[Any], *, measure: Measure, token_scope: str, min_tokens: int,
             runner: Runner | None = None) -> tuple[Tensor, Collected]:
    """One run of ``len(copies)`` copies of the prompts stacked along the batch
    (:func:`thermo_lens.core.passes.stacked.run_stacked`), copy ``c`` under condition ``copies[c]`` (None:
    none): the measure ``[copy, prompt]`` and the pass's :class:`Collected`. ``runner``: how the
    batches run (default: a full forward)."""
    P = len(ps)
    n = len(copies)

    def edit(layer: int) -> Callable:
        def write(x: Tensor, rows: StackedRows) -> None:
            x4 = _as_heads(x, layout, view)
            if layout.head_dim is not None and not getattr(layout, "features", False) and \
                    x4.shape[layout.head_dim] != layout.n_heads(view):  # (an SAE's latents: d_sae on that axis)
                raise ThermoLensInputError(
                    f"{layout.name(layer)} has {x4.shape[layout.head_dim]} heads on axis {layout.head_dim} "
                    f"(shape {tuple(x4.shape)}), but the model's config gives {layout.n_heads(view)} "
                    f"{'key/value ' if layout.kv else ''}heads: this host lays the hook out otherwise; sweep "
                    "attn.hook_z or a position hook")
            for b, (c, p) in enumerate(zip(rows.copy, rows.prompt)):
                cond = copies[c]
                if cond is None or cond.layer != layer:
                    continue
                src = None if sources is None else sources[(layer, cond.slot)][p]
                _write(x4, b, layout, cond.head, cond.positions[p], src, rows.length[b])
        return write

    values = torch.full((n, P), float("nan"), dtype=torch.float64)
    on_logits = None
    if measure.needs_logits:
        def on_logits(logits: Tensor, batch: TokenBatch) -> None:
            rows = batch.prompt_index.tolist()
            for start in range(0, len(rows), P):  # whole copies per pass: the function sees [prompt, ...]
                values[rows[start] // P] = _call_measure(measure, logits[start:start + P], P)
    layers = sorted({c.layer for c in copies if c is not None})
    got = run_stacked(view, ps, n, [(layout.name(l), edit(l)) for l in layers], reductions, settings, rows_per_pass,
                      min_tokens=min_tokens, runner=runner, on_logits=on_logits)
    if not measure.needs_logits:
        def row_name(r: int) -> str:
            c, p = divmod(r, P)
            return f"prompt {p} " + ("without a condition" if copies[c] is None else f"with condition {copies[c]}")
        values = measure_values(got, measure, token_scope, row_name).reshape(n, P)
    return values, got


#: The start-at-layer check: the unpatched prompts from each start layer must give the full
#: pass's measure to this relative tolerance (float32 rounding is ~1e-7; a wrong mask, position or
#: rotary embedding changes the numbers at the percent level).
_START_RTOL = 1e-4


def _from_layers(view: ModelView, ps: PromptList, layout: HookLayout, conditions: Sequence[Condition],
                 sources: Sources, settings: RunSettings, rows_per_pass: int, *,
                 measure: Measure, token_scope: str,
                 min_tokens: int) -> tuple[tuple[Tensor, Any, str] | None, str]:
    """:func:`run_conditions` with each cell's pass starting at its layer (or at the measure's block,
    if earlier) from the unpatched run's residual there; cells after the last block the measure reads
    take the unpatched value. ``(None, why)`` when the host's start-at-layer pass fails the check."""
    P, L = len(ps), view.n_layers
    last = measure.last_layer_read(L)
    start_of = {i: measure.start_layer(c.layer) for i, c in enumerate(conditions) if c.layer <= last}
    starts = sorted(set(start_of.values()))
    names = view.resid_hook_names
    kept: dict[int, Tensor] = {}

    def keep_starts(view_: ModelView, rec: Recorder) -> None:
        for s in starts:
            def fn(x: Tensor, batch: TokenBatch, _s: int = s) -> None:
                kept[_s] = x.detach().clone()  # one batch of every prompt, caller's order
            rec.add(names[s], ("sweep_start", s), fn)
    base, got = _stacked(view, ps, layout, [None], None, settings, max(rows_per_pass, P),
                         measure.reductions(token_scope, P) + [keep_starts], measure=measure, token_scope=token_scope,
                         min_tokens=min_tokens)
    values = base[0].repeat(1 + len(conditions), 1)
    carried = measure.carried
    base_norms = got.stack(carried) if carried else None  # [L+1, prompt, pos]: e.g. the residual norms
    user = [(name, fn) for name, fn in settings.fwd_hooks]
    for s in sorted(starts, reverse=True):
        group = [i for i, st in start_of.items() if st == s]
        # Every start layer carries the check (one unpatched copy of the prompts, ~1/n_heads of a
        # head sweep's rows): a host can be right from one block and wrong from another (a block
        # given another block's attention kind), so checking the deepest start alone is not enough.
        copies: list[Condition | None] = [None] + [conditions[i] for i in group]
        later = [(n, f) for n, f in user if _block_of(n) >= s]
        run = RunSettings.resolve(settings, fwd_hooks=later)
        try:
            vals, _ = _stacked(view, ps, layout, copies, sources, run, rows_per_pass,
                               _start_reductions(measure, token_scope, s, names, base_norms, P), measure=measure,
                               token_scope=token_scope, min_tokens=min_tokens, runner=FromLayer(view, s, kept[s]))
        except ThermoLensError:  # the user's hooks or the measure: the full passes would say the same
            raise
        except Exception as e:  # noqa: BLE001 - the host's start-at-layer pass failing in its own code
            # e.g. TransformerLens 3's bridge (start_at_layer "not supported"), or an HF model that maps
            # inputs_embeds before its first block (OPT's project_in: a shape error): full passes then
            return None, f"the host's start_at_layer raised {type(e).__name__}: {str(e)[:120]}"
        gap = float((vals[0] - base[0]).abs().max())
        size = float(base[0].abs().max())
        if not gap <= _START_RTOL * max(size, 1e-12):
            return None, (f"the check failed: the unpatched prompts from block {s} gave a measure {gap:.2e} away "
                          f"from the full pass's (scale {size:.2e})")
        vals = vals[1:]
        for k, i in enumerate(group):
            values[1 + i] = vals[k]
    host = view.adapter.start_method
    mean_start = sum(start_of.values()) / max(len(start_of), 1)
    how = (f"each cell's pass starts at its layer from the unpatched residual ({view.host.describe()}, {host}): "
           f"{len(start_of)} of {len(conditions)} cells ran, from block {mean_start:.2g} of {L} on average"
           + (f"; {len(conditions) - len(start_of)} after block {last} (the last the measure reads) take the "
              "unpatched value" if len(start_of) < len(conditions) else ""))
    return (values, got.provenance(), how), ""


def _block_of(name: object) -> int:
    """The block of a per-block hook name (start_support checked every user hook is one)."""
    m = BLOCK_HOOK.match(name) if isinstance(name, str) else None
    assert m is not None, name
    return int(m.group(1))


def _start_reductions(measure: Measure, token_scope: str, s: int, names: Sequence[str], base_norms: Tensor | None,
                      P: int) -> list[Any]:
    """The measure's reductions for passes starting at block ``s``: a readout that carries state
    entries (a gain: the residual norms) reads those of ``x_s .. x_L`` in the pass and those of
    ``x_0 .. x_{s-1}`` (the same as without the condition) from the unpatched pass, recorded at
    ``x_s``'s hook point."""
    carried = measure.carried
    if not carried:
        return measure.reductions(token_scope, P)
    assert base_norms is not None

    def earlier(view: ModelView, rec: Recorder) -> None:
        for k in range(s):
            def fn(x: Tensor, batch: TokenBatch, _k: int = k) -> Tensor:
                return base_norms[_k].index_select(0, batch.prompt_index % P)[:, :x.shape[1]]
            rec.add(names[s], (carried, k), fn)
    return measure.reductions(token_scope, P, keep=lambda key: key[1] >= s) + [earlier]


def _write(x: Tensor, b: int, layout: HookLayout, head: int | None, pos: tuple[int, ...], src: Tensor | None,
           n_real: int) -> None:
    """Row ``b`` of ``x`` at ``pos`` (and ``head``) := ``src`` (the values at those positions, in
    their order: ``[k, ...]``, or ``[head, k, key]`` for a square hook) or 0. A square hook's row is
    written over the prompt's ``n_real`` real keys only: a zeroed attention score of a padding key
    would let a shorter prompt attend to its padding."""
    p = torch.as_tensor(pos, dtype=torch.long, device=x.device)
    s = None if src is None else src.to(device=x.device, dtype=x.dtype)
    if not layout.square:  # [batch, pos, (head), ...]
        if head is None:
            x[b, p] = 0 if s is None else s
        else:
            x[b, p, head] = 0 if s is None else s[:, head]
    else:  # [batch, head, query, key]: a position is a query row, over the real keys
        keys = slice(0, n_real if s is None else int(s.shape[-1]))
        heads = slice(None) if head is None else head
        if s is None:
            x[b, heads, p, keys] = 0
        else:
            x[b, heads, p, keys] = s if head is None else s[head]
