"""Patching and ablation sweeps: every head's (or position's) effect on a measure, with paired CIs.

::

    import thermo_lens as tl

    s = tl.patch_sweep(model, clean, corrupted, "attn.hook_z", over="head", measure="last_block_gain")
    s.effect            # [layer, head] mean over prompts of m(corrupted | head patched) - m(corrupted)
    s.to_frame()        # one row per cell: effect, CI, p, Holm-adjusted p, fraction restored ...
    a = tl.ablation_sweep(model, prompts, "attn.hook_z", method="mean", measure=logit_diff)

The effect of a cell on prompt ``p`` is ``m(p | condition) - m(p)``: the measure under the
condition minus the measure of the same prompt without it (:mod:`thermo_lens.experiments.sweeps.result`).
Conditions are stacked along the batch, many per forward pass (:mod:`thermo_lens.experiments.sweeps.engine`).

Prompts of different token lengths (the embedded models' tokenizer is nearly character level, so
most clean/corrupted pairs differ): a position is aligned in each prompt at its own length, a
negative one from the prompt's own end (``-1``: its last token), a non-negative one from its start::

    s = tl.patch_sweep(model, clean, corrupted, "attn.hook_z", positions=[-1], measure=tl.sweeps.LogitDifference(a, b))
    m = tl.ablation_sweep(model, prompts, "hook_resid_pre", over="pos", positions=[-3, -2, -1], method="mean")

patches clean token ``-1`` into corrupted token ``-1`` of each pair, and writes at each prompt's
last three tokens the mean over the prompts that have that aligned position. Every position of a
ragged pair (``positions=None``) cannot align and is refused for patching; ``over="pos"`` on
ragged prompts needs ``positions=``. The result's ``alignment`` records which rule applied.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np
import torch
from torch import Tensor

from thermo_lens.core import attached, validate
from thermo_lens.core.errors import ThermoLensInputError, ThermoLensNumericsError, ThermoLensWarning
from thermo_lens.measures.gain import DEFAULT_SCOPE
from thermo_lens.core.inputs import PromptList, Prompts, as_model_prompts
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.experiments.sweeps.engine import Condition, HookLayout, Measure, Sources, hook_layout, parse_measure
from thermo_lens.experiments.sweeps.engine import capture as _capture
from thermo_lens.experiments.sweeps.engine import run_conditions as _run_conditions
from thermo_lens.experiments.sweeps.rows import CPU_ROWS, halving_on_oom, rows_per_pass
from thermo_lens.experiments.sweeps.features import feature_layout, feature_list
from thermo_lens.experiments.sweeps.logits import LogitDifference
from thermo_lens.experiments.sweeps.result import SweepResult, build_result
from thermo_lens.core.tokens import TokenScope, token_batch
from thermo_lens.core.validate import excerpt, validates_own_inputs

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["patch_sweep", "ablation_sweep", "METHODS", "OVER"]

#: Ablation methods: what replaces the activation.
METHODS = ("zero", "mean", "resample")
#: The cell axes a sweep runs over (after ``layer``).
OVER = ("head", "pos", ("head", "pos"))
_DEFAULT_ROWS = CPU_ROWS  # rows per forward pass on the CPU when no batch_size is given ("auto")
# The passes of a sweep, each run again with half its rows on an out-of-memory error (thermo_lens.experiments.sweeps.rows).
capture = halving_on_oom(_capture, keyword="rows_per_pass")
run_conditions = halving_on_oom(_run_conditions, position=6)


def _over(over: object) -> tuple[str, ...]:
    if isinstance(over, str) and over in ("head", "pos", "feature"):
        return (over,)
    if isinstance(over, (tuple, list)) and tuple(over) in (("head", "pos"), ("head",), ("pos",), ("feature",)):
        return tuple(over)
    raise ThermoLensInputError(f"over must be 'head', 'pos', ('head', 'pos') or 'feature' (an SAE's latents), "
                               f"got {excerpt(over)}")


def _index_list(name: str, value: object, n: int) -> list[int]:
    if value is None:
        return list(range(n))
    given = [value] if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise ThermoLensInputError(f"{name} must be an int or a list of ints, got {excerpt(value)}")
    try:
        items = list(given)
    except TypeError:
        raise ThermoLensInputError(f"{name} must be an int or a list of ints, got {excerpt(value)}") from None
    bad = [v for v in items if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -n <= v < n]
    if bad or not items:
        raise ThermoLensInputError(f"{name} must be ints in 0..{n - 1} (negative from the end), got {excerpt(value)}")
    return list(dict.fromkeys(int(v) % n for v in items))


def _labels(positions: object) -> list[int]:
    """``positions`` as a list of ints, as given (checked: ints, not bools, not empty)."""
    given = [positions] if isinstance(positions, (int, np.integer)) and not isinstance(positions, bool) else positions
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise ThermoLensInputError(f"positions must be an int or a list of ints (negative from each prompt's end), "
                                   f"got {excerpt(positions)}")
    try:
        items = list(given)
    except TypeError:
        raise ThermoLensInputError(f"positions must be an int or a list of ints (negative from each prompt's end), "
                                   f"got {excerpt(positions)}") from None
    bad = [q for q in items if isinstance(q, bool) or not isinstance(q, (int, np.integer))]
    if bad or not items:
        raise ThermoLensInputError(f"positions must be ints (negative from each prompt's end), got {excerpt(positions)}")
    return [int(q) for q in items]


def _lengths(view: ModelView, ps: PromptList, settings: RunSettings, min_tokens: int) -> list[int]:
    """Token lengths of each prompt (fails here, before any compute, on a bad prompt)."""
    tb = token_batch(view, ps, range(len(ps)), prepend_bos=settings.prepend_bos, truncate=settings.truncate,
                     min_tokens=min_tokens)
    return [int(n) for n in tb.lengths]


def _at(q: int, n: int) -> int | None:
    """Aligned position ``q`` in a prompt of ``n`` tokens: from its start (``q >= 0``) or its own
    end (``q < 0``), or None where the prompt has no such token."""
    r = q + n if q < 0 else q
    return r if 0 <= r < n else None


def _resolve(labels: list[int] | None, lengths: Sequence[int], what: str) -> list[tuple[int, ...]]:
    """Per prompt, the aligned positions ``labels`` as indices of its real tokens (``None``: every
    token). Two labels naming one token of a prompt are refused: on prompts of different lengths
    they would write two different values there."""
    if labels is None:
        return [tuple(range(n)) for n in lengths]
    out = []
    for i, n in enumerate(lengths):
        idx = []
        for q in labels:
            r = _at(q, n)
            if r is None:
                raise ThermoLensInputError(
                    f"position {q} is beyond {what} prompt {i} ({n} tokens); positions index real tokens, "
                    "non-negative ones from each prompt's start, negative ones from its own end (-1 = last token)")
            idx.append(r)
        if len(set(idx)) < len(idx):
            dup = [q for q, r in zip(labels, idx) if idx.count(r) > 1]
            raise ThermoLensInputError(
                f"positions {dup} name the same token of {what} prompt {i} ({n} tokens): a non-negative position "
                "counts from each prompt's start, a negative one from its own end; pass each token once")
        out.append(tuple(idx))
    return out


def _gather(act: Tensor, idx: Sequence[int], layout: HookLayout) -> Tensor:
    """One prompt's activation (its real tokens) at ``idx``, in that order: ``[k, ...]``, or
    ``[head, k, key]`` for a square hook (the activation itself where ``idx`` is every token)."""
    d = layout.pos_dim - 1
    if list(idx) == list(range(act.shape[d])):
        return act
    return act.index_select(d, torch.as_tensor(list(idx), dtype=torch.long))


def _equal(lengths: Sequence[int], why: str) -> int:
    if len(set(lengths)) != 1:
        raise ThermoLensInputError(
            f"{why} needs every prompt to have the same token length (positions must align), got lengths "
            f"{sorted(set(lengths))}: pass prompts of one length, or positions=[...] (non-negative from each "
            "prompt's start, negative from its own end: positions=[-3, -2, -1] sweeps the last three tokens)")
    return lengths[0]


def _alignment(slots: list[list[int] | None], *length_sets: Sequence[int]) -> str:
    """How positions align across the prompts (recorded in the result)."""
    ns = sorted({n for ls in length_sets for n in ls})
    if len(ns) == 1:
        return f"every prompt has {ns[0]} tokens: position q is token q (negative: {ns[0]} + q)"
    every = any(sl is None for sl in slots)
    return (f"prompts of {ns[0]} to {ns[-1]} tokens: "
            + ("every token of each prompt, aligned from its start" if every else
               "a non-negative position is the prompt's token q from its start, a negative one counts from the "
               "prompt's own end (-1 = its last token)"))


def _check_logit_function_lengths(m: Measure, lengths: Sequence[int], what: str) -> None:
    """A function of the logits gets a condition's prompts right-padded to one length, and cannot
    tell padding from tokens: with prompts of several lengths, ``logits[:, -1]`` (the usual metric)
    would read a pad of every shorter prompt. Refused instead of computed."""
    if m.kind == "logits" and len(set(lengths)) > 1:
        raise ThermoLensInputError(
            f"{what} have different token lengths ({min(lengths)} to {max(lengths)}): a function of the logits "
            "gets them right-padded to one length [prompt, pos, d_vocab] without the padding mask, so "
            "logits[:, -1] would read padding for the shorter prompts. Use thermo_lens.experiments.sweeps.LogitDifference("
            "answer, wrong, pos=-1), which reads each prompt's own token at pos, or prompts of one token length")


def _check_options(*, over: object, level: object, start_at_layer: object, token_scope: object) -> tuple[str, ...]:
    """The scalar options, checked before anything is converted or run."""
    ov = _over(over)
    validate.confidence_level("level", level)
    validate.boolean("start_at_layer", start_at_layer)
    validate.token_scope(token_scope)
    return ov


#: What a sweep's sources give back: the values of each (layer, slot) per prompt (None: zeros), the
#: clean prompts' measure (patching), where the values come from, and how positions align.
SourceFn = Callable[[HookLayout, list[int], int, list[int], list[list[int] | None]],
                    tuple[Sources, Tensor | None, str, str]]


def _sweep(view: ModelView, ps: PromptList, hook: object, over: tuple[str, ...], measure: object, *, layers: object,
           heads: object, features: object, positions: object, token_scope: str, level: float, settings: RunSettings, rows: int,
           sources_for: SourceFn, kind: str, method: str, start_at_layer: bool) -> SweepResult:
    """Shared body: cells, conditions, one multi-condition run, the result (an SAE's latents:
    :func:`_feature_sweep`)."""
    ov = _over(over)
    if features is not None and ov != ("feature",):
        raise ThermoLensInputError("features= selects SAE latents to sweep: pass over='feature' and "
                                   "hook='<SAE hook>.hook_sae_acts_post'")
    if ov == ("feature",):
        return _feature_sweep(view, ps, hook, features, measure, positions=positions, token_scope=token_scope,
                              level=level, settings=settings, rows=rows, sources_for=sources_for, kind=kind,
                              method=method)
    lays = _index_list("layers", layers, view.n_layers)
    # Every swept hook point exists (a misspelt hook is named as such, with the closest names) before
    # the head-axis check, which would call it a hook without heads.
    attached.check_hook_names(view.model, [hook_layout(hook, ("pos",)).name(l) for l in lays], view.name)
    layout = hook_layout(hook, ov)
    m = parse_measure(measure, view.n_layers, view.n_heads)
    scope = m.scope(token_scope)
    min_tokens = m.min_tokens(token_scope)
    lengths = _lengths(view, ps, settings, min_tokens)
    _check_logit_function_lengths(m, lengths, "the prompts")
    if isinstance(m.source, LogitDifference):
        m.source.check(len(ps), lengths, view.d_vocab)
        if any(not isinstance(n, str) or not n.startswith("blocks.") for n, _ in settings.fwd_hooks):
            raise ThermoLensInputError(
                "LogitDifference reads the final residual and applies the model's final norm itself, so user hooks "
                "past the blocks would not see the pass; with such hooks use a function of the logits as the measure")
    n_heads = layout.n_heads(view)
    hs: list[int | None] = list(_index_list("heads", heads, n_heads)) if "head" in ov else [None]
    if heads is not None and "head" not in ov:
        raise ThermoLensInputError("heads= selects the swept heads; this sweep is over='pos' (pass over='head' or "
                                   "('head', 'pos'))")
    given = None if positions is None else _labels(positions)
    if "pos" in ov:
        labels = list(range(_equal(lengths, "over='pos' without positions="))) if given is None else given
        slots: list[list[int] | None] = [[q] for q in labels]
    else:
        labels, slots = [], [given]
    per_slot = [_resolve(sl, lengths, "the") for sl in slots]  # [slot][prompt] -> indices of its tokens
    sources, clean_values, reference, alignment = sources_for(layout, lays, min_tokens, lengths, slots)
    conditions = [Condition(l, h, tuple(per_slot[k]), slot=k) for l in lays for h in hs for k in range(len(slots))]
    values, provenance, passes = run_conditions(view, ps, layout, conditions, sources, settings, rows, measure=m,
                                                token_scope=token_scope, min_tokens=min_tokens,
                                                start_at_layer=start_at_layer)
    P = len(ps)
    shape = [len(lays)] + ([len(hs)] if "head" in ov else []) + ([len(labels)] if "pos" in ov else [])
    notes = _undefined(values, clean_values, conditions, hs, labels, ov, m.label)
    per_prompt = (values[1:] - values[0]).reshape(*shape, P).movedim(-1, 0)
    return build_result(
        per_prompt=per_prompt, baseline=values[0], clean=clean_values, level=float(level), kind=kind, method=method,
        hook=layout.suffix, over=ov, measure=m.label, layers=tuple(lays),
        heads=tuple(int(h) for h in hs if h is not None) if "head" in ov else (),
        positions=tuple(int(q) for q in labels), token_scope=scope, measure_definition=m.definition,
        patched_positions="the swept position" if "pos" in ov else ("all" if given is None else str(given)),
        reference=reference, provenance=provenance, passes=passes, alignment=alignment,
        head_kind="kv_head" if layout.kv else "head", notes=tuple(notes))


def _undefined(values: Tensor, clean: Tensor | None, conditions: Sequence[Condition], hs: Sequence[int | None],
               labels: Sequence[int], ov: tuple[str, ...], label: str) -> list[str]:
    """Notes naming where the measure is not a finite number (kept as NaN, with a warning), or an
    error where the prompts' own measure, without any condition, is undefined."""
    base = values[0]
    if not bool(torch.isfinite(base).all()):
        bad = torch.nonzero(~torch.isfinite(base)).flatten().tolist()
        raise ThermoLensNumericsError(
            f"measure {label} is not a finite number for prompt(s) {bad[:8]} without any condition (the prompts "
            "as given): a gain measure divides by a residual norm that is zero there (e.g. a zero BOS embedding), "
            "or a function of the logits returned NaN/inf. Use another measure, token_scope or prompts")
    notes = []
    if clean is not None and not bool(torch.isfinite(clean).all()):
        bad = torch.nonzero(~torch.isfinite(clean)).flatten().tolist()
        notes.append(f"the clean prompts' {label} is not finite for pair(s) {bad[:8]}: their fraction restored is NaN")
    cells = ~torch.isfinite(values[1:])  # [condition, prompt]
    values[1:][cells] = float("nan")
    if bool(cells.any()):
        named = []
        for i in torch.nonzero(cells.any(1)).flatten().tolist()[:6]:
            c = conditions[i]
            where = [f"layer {c.layer}"] + ([f"head {c.head}"] if "head" in ov else []) + (
                [f"pos {labels[c.slot]}"] if "pos" in ov else [])
            named.append(f"({', '.join(where)}: prompts {torch.nonzero(cells[i]).flatten().tolist()[:8]})")
        n_cells = int(cells.any(1).sum())
        notes.append(f"{n_cells} cell(s) have no finite {label} under their condition for some prompts, kept as "
                     f"NaN (so the cell's effect, CI and p are NaN, and Holm leaves it out): {'; '.join(named)}"
                     + (" ..." if n_cells > 6 else "")
                     + ". A gain's ratio divides by a residual norm the condition made zero (zero-ablating "
                       "hook_resid_pre at a token in scope), or a function of the logits returned NaN/inf")
    for n in notes:
        warnings.warn(n, ThermoLensWarning, stacklevel=3)
    return notes


def _rows(view: ModelView, settings: RunSettings, given: RunSettings | Mapping[str, Any] | None,
          run: Mapping[str, object], auto: bool, prompts: object) -> int:
    """Rows per forward pass: the given batch size (checked by ``settings``), else ``"auto"``
    (:func:`thermo_lens.experiments.sweeps.rows.rows_per_pass`: from the free device memory on CUDA,
    ``_DEFAULT_ROWS`` elsewhere)."""
    named = not auto and ("batch_size" in run or isinstance(given, RunSettings) or (
        isinstance(given, Mapping) and "batch_size" in given))
    if named:
        return settings.batch_size
    width = max(_lengths(view, as_model_prompts(view, prompts), settings, 1)) if view.device.type == "cuda" else 0
    return rows_per_pass(view, None, {}, width)[0]


def _auto(run: dict[str, Any]) -> bool:
    """Whether ``batch_size="auto"`` was given (taken out of ``run``: the settings hold ints only)."""
    if isinstance(run.get("batch_size"), str) and run["batch_size"] == "auto":
        del run["batch_size"]
        return True
    return False


def _feature_sweep(view: ModelView, ps: PromptList, hook: object, features: object, measure: object, *,
                   positions: object,
                   token_scope: str, level: float, settings: RunSettings, rows: int, sources_for: SourceFn,
                   kind: str, method: str) -> SweepResult:
    """:func:`_sweep` over the latents of one SAE (``over="feature"``, :mod:`thermo_lens.experiments.sweeps.features`):
    one cell per listed feature, every pass from the embedding."""
    layout, layer, d_sae = feature_layout(view, hook)
    feats = feature_list(features, d_sae)
    m = parse_measure(measure, view.n_layers, view.n_heads)
    min_tokens = m.min_tokens(token_scope)
    lengths = _lengths(view, ps, settings, min_tokens)
    _check_logit_function_lengths(m, lengths, "the prompts")
    if isinstance(m.source, LogitDifference):
        m.source.check(len(ps), lengths, view.d_vocab)
    given = None if positions is None else _labels(positions)
    slots: list[list[int] | None] = [given]
    per_slot = [_resolve(sl, lengths, "the") for sl in slots]
    sources, clean_values, reference, alignment = sources_for(layout, [layer], min_tokens, lengths, slots)
    conditions = [Condition(layer, f, tuple(per_slot[0]), slot=0) for f in feats]
    # Every pass from the embedding: a pass started at the SAE's block would read the stream downstream of
    # the SAE for an SAE at hook_resid_pre, and never run it.
    values, provenance, passes = run_conditions(view, ps, layout, conditions, sources, settings, rows,
                                                measure=m, token_scope=token_scope, min_tokens=min_tokens,
                                                start_at_layer=False)
    notes = _undefined(values, clean_values, conditions, feats, [], ("feature",), m.label)
    per_prompt = (values[1:] - values[0]).reshape(1, len(feats), len(ps)).movedim(-1, 0)
    return build_result(
        per_prompt=per_prompt, baseline=values[0], clean=clean_values, level=float(level), kind=kind, method=method,
        hook=hook, over=("feature",), measure=m.label, layers=(layer,), heads=tuple(feats), positions=(),
        token_scope=m.scope(token_scope), measure_definition=m.definition,
        patched_positions="all" if given is None else str(given),
        reference=reference, provenance=provenance, passes=passes, alignment=alignment, notes=tuple(notes))




@validates_own_inputs
def patch_sweep(
    model: TransformerLensModel | ModelView,
    clean: Prompts,
    corrupted: Prompts,
    hook: str,
    *,
    over: str | tuple[str, str] = "head",
    measure: str | Callable[[Tensor], Tensor] = "total_amplification",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    features: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    token_scope: TokenScope = DEFAULT_SCOPE,
    level: float = 0.95,
    start_at_layer: bool = True,
    settings: RunSettings | None = None,
    **run: Unpack[RunOptions],
) -> SweepResult:
    """Patch every cell's activation from the clean prompt into its corrupted prompt, one cell at a time.

    For each cell (a layer and head, a layer and position, or both) and each pair ``p``, the
    corrupted prompt runs with ``blocks.{layer}.{hook}`` at the cell replaced by the clean prompt's
    activation; the effect is ``m(corrupted_p | patched) - m(corrupted_p)``. Also reported: the
    fraction of ``m(clean_p) - m(corrupted_p)`` each cell restores, with a CI. Many cells run per
    forward pass (stacked along the batch); each number equals the single-condition run
    (``residual_gain(corrupted, fwd_hooks=tl.patch_from(...))``) up to float32 rounding.

    Args:
        model: the TransformerLens model (or ModelView).
        clean, corrupted: prompt pairs (as many clean as corrupted; each pair of equal token length, or
            any lengths with ``positions=`` given: clean position ``q`` is patched into corrupted position
            ``q``, each aligned in its own prompt, see ``positions``; not for ``hook_pattern`` /
            ``hook_attn_scores``, whose keys cannot align).
        hook: the per-layer hook point: ``"attn.hook_z"`` (or ``"hook_z"``), ``"hook_pattern"``,
            ``"hook_attn_scores"``, ``"attn.hook_q"``, ``"attn.hook_result"`` (heads), ``"attn.hook_k"``,
            ``"attn.hook_v"`` (key/value heads: ``n_kv_heads`` under grouped-query attention, the result's
            ``head_kind`` is ``"kv_head"``), ``"hook_resid_pre"``, ``"hook_resid_post"`` ... (positions).
        over: the cell axes after ``layer``: ``"head"`` (the default), ``"pos"`` or ``("head", "pos")``.
        measure: the per-prompt scalar (:func:`thermo_lens.experiments.sweeps.measure_definitions`):
            ``"total_amplification"`` (the default), ``"last_block_gain"``, ``"block_gain:<layer>"`` (in
            ``token_scope``, as :func:`thermo_lens.residual_gain`), ``"attribution_total:<layer>"``,
            ``"attribution_head:<layer>"`` (sum over heads), ``"attribution_head:<layer>.<head>"`` (the
            terms of :func:`thermo_lens.gain_attribution`, in ``token_scope``), ``"sheaf_trace:<layer>"``
            (sum over heads), ``"sheaf_trace:<layer>.<head>"`` (:func:`thermo_lens.sheaf_traces`, all real
            tokens), ``"write_norm:<layer>.<head>"``, ``"anisotropy:<state>"``, any other readout of a
            registered measurement (:func:`thermo_lens.core.registry.readouts`), a
            :class:`thermo_lens.experiments.sweeps.LogitDifference` (a logit difference from the final
            residual: two unembedding columns, the passes end after the last block), or a function of the
            logits ``[prompt, pos, d_vocab] -> [prompt]`` (called once per condition with all prompts in
            your order, e.g. a logit difference; the passes then run to the logits).
        layers: layers to sweep (default ``None``: all).
        heads: heads to sweep (default ``None``: all).
        features: with ``over="feature"`` and ``hook="<SAE hook>.hook_sae_acts_post"``, the SAE latents
            to sweep, one cell each (:mod:`thermo_lens.experiments.sweeps.features`; every pass from the embedding;
            default ``None``: required with ``over="feature"``).
        positions: with ``"pos"`` in ``over``, the swept positions (default ``None``: every position,
            which needs prompts of one length); otherwise the patched positions of each cell (default
            ``None``: every token, which needs each pair of one length). Each position is aligned in each
            prompt at its own length: a negative one counts from the prompt's own end (``-1``: its last
            token), a non-negative one from its start (``2``: its third token, the BOS included). A
            position beyond a prompt, or two naming one token of a prompt, are refused. The result's
            ``alignment`` says which applied.
        token_scope: the gain measures' token scope (default ``"all_but_first"``).
        level: confidence level of the CIs (default ``0.95``).
        start_at_layer: where the host supports it (default ``True``), each cell's pass starts at its
            layer from the corrupted run's residual there (blocks below it are the same with or without
            the patch; :mod:`thermo_lens.experiments.sweeps.start`); the result's ``passes`` says how they ran.
        settings, **run: run options (:class:`thermo_lens.core.settings.RunOptions`); ``batch_size`` bounds
            the rows per forward pass (default ``"auto"``: from the free device memory on CUDA, ``64`` on the CPU,
            :mod:`thermo_lens.experiments.sweeps.rows`; a pass that runs out of memory runs again with half the rows; at
            least one copy of the prompts runs per pass).

    Returns:
        :class:`thermo_lens.experiments.sweeps.SweepResult`. A cell whose measure is not a finite number for some
        prompt (a gain whose denominator the patch made zero) is NaN there, named in ``notes`` and
        warned about; so is the fraction restored where the clean and corrupted prompts' mean measures
        are equal (no difference to restore).

    Raises:
        ThermoLensInputError: an option of the wrong type or range (checked before any conversion or
            pass), clean and corrupted sets of different sizes, a pair of different token lengths
            without ``positions=`` (or on a square hook), a hook without a head axis with
            ``over="head"``, a position beyond a prompt, an unknown measure or ``over``.
        ThermoLensNumericsError: the measure of the corrupted prompts without any condition is not finite.
    """
    ov = _check_options(over=over, level=level, start_at_layer=start_at_layer, token_scope=token_scope)
    view = as_view(model)
    given_settings, opts = settings, dict(run)
    auto = _auto(opts)
    settings = RunSettings.resolve(settings, **opts)
    rows = _rows(view, settings, given_settings, opts, auto, corrupted)
    m = parse_measure(measure, view.n_layers, view.n_heads)
    cps, ps = as_model_prompts(view, clean), as_model_prompts(view, corrupted)
    if len(cps) != len(ps):
        raise ThermoLensInputError(f"clean and corrupted must be pairs: got {len(cps)} clean and {len(ps)} corrupted "
                                   "prompts (pass one clean prompt per corrupted prompt, in the same order)")

    def sources(layout: HookLayout, lays: list[int], min_tokens: int, lengths: list[int],
                slots: list[list[int] | None]) -> tuple[Sources, Tensor | None, str, str]:
        cl = _lengths(view, cps, settings, min_tokens)
        _check_logit_function_lengths(m, cl, "the clean prompts")
        if isinstance(m.source, LogitDifference):
            m.source.check(len(cps), cl, view.d_vocab)
        bad = [i for i, (a, b) in enumerate(zip(cl, lengths)) if a != b]
        every = any(sl is None for sl in slots)
        if bad and (every or layout.square):
            i = bad[0]
            raise ThermoLensInputError(
                f"patching needs each clean/corrupted pair to have the same token length (positions must align): "
                f"pair {i} has {cl[i]} clean and {lengths[i]} corrupted tokens ({len(bad)} pair(s) differ). "
                + (f"{layout.suffix} is [head, query, key]: the keys of the two prompts cannot align; rephrase the "
                   "prompts so each pair tokenizes to the same length" if layout.square else
                   "Rephrase the prompts so each pair tokenizes to the same length, or pass positions=[...] "
                   "(negative from each prompt's own end: -1 patches the clean last token into the corrupted last "
                   "token; non-negative from each prompt's start)"))
        at_clean = [_resolve(sl, cl, "clean") for sl in slots]
        acts, clean_values = capture(view, cps, layout, lays, settings, measure=m,
                                     token_scope=token_scope, min_tokens=min_tokens, rows_per_pass=rows)
        # clean position q goes to corrupted position q, each aligned in its own prompt
        out = {(l, k): [_gather(acts[l][i], at_clean[k][i], layout) for i in range(len(cps))]
               for l in lays for k in range(len(slots))}
        first = f"; first {cps.texts[0][:40]!r}" if cps.token_ids is None else f"; {len(cps)} token-id rows"
        return out, clean_values, f"clean prompts ({cps.name}{first})", _alignment(slots, cl, lengths)

    return _sweep(view, ps, hook, ov, measure, layers=layers, heads=heads, features=features, positions=positions,
                  token_scope=token_scope, level=level, settings=settings, rows=rows, sources_for=sources,
                  kind="patch", method="patch", start_at_layer=start_at_layer)


@validates_own_inputs
def ablation_sweep(
    model: TransformerLensModel | ModelView,
    prompts: Prompts,
    hook: str,
    *,
    over: str | tuple[str, str] = "head",
    method: str = "zero",
    measure: str | Callable[[Tensor], Tensor] = "total_amplification",
    reference: Prompts | None = None,
    seed: int = 0,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    features: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    token_scope: TokenScope = DEFAULT_SCOPE,
    level: float = 0.95,
    start_at_layer: bool = True,
    settings: RunSettings | None = None,
    **run: Unpack[RunOptions],
) -> SweepResult:
    """Ablate every cell's activation, one cell at a time, and measure the change.

    The effect of a cell on prompt ``p`` is ``m(p | cell ablated) - m(p)``. Ablation replaces the
    activation at ``blocks.{layer}.{hook}`` in the cell by zero (``"zero"``), by its mean over the
    ``reference`` prompts at each position (``"mean"``), or by the activation of another prompt
    drawn at random (``"resample"``; prompt ``p`` takes prompt ``source[p] != p``, seeded, recorded
    in ``reference``). Many cells run per forward pass; each number equals the single-condition
    run with the same hook as ``fwd_hooks`` up to float32 rounding.

    Prompts of different token lengths: positions align in each prompt at its own length (see
    ``positions``). ``"mean"`` writes, at each aligned position, the mean over the reference prompts
    that have that position (all of them where they share one length; ``reference`` says the fewest
    any position had); ``"resample"`` draws each prompt's source among the other prompts that have
    every position it needs (all others where lengths are equal, so the draw is unchanged), and
    takes the source's activation at the same aligned positions. ``positions=None`` (every token)
    aligns from each prompt's start. Square hooks (``hook_pattern``, ``hook_attn_scores``) are
    zero-ablated over each prompt's own keys (never its padding); ``"mean"`` and ``"resample"`` of
    them need one token length.

    Args:
        model: the TransformerLens model (or ModelView).
        prompts: the prompts (anything :func:`thermo_lens.residual_gain` takes).
        hook: the per-layer hook point, as for :func:`patch_sweep`.
        over: ``"head"`` (the default), ``"pos"``, ``("head", "pos")``, or ``"feature"`` (an SAE's latents:
            ``hook="<SAE hook>.hook_sae_acts_post"`` and ``features=[...]``).
        method: ``"zero"`` (the default), ``"mean"`` or ``"resample"``.
        measure: as for :func:`patch_sweep` (default ``"total_amplification"``).
        reference: the prompts whose per-position mean ``"mean"`` writes (default ``None``: the prompts
            themselves), averaged per aligned position over the reference prompts that have it.
        seed: the resample draw's seed, an int >= 0 (default ``0``).
        layers, heads: layers and heads to sweep (default ``None``: all).
        features: with ``over="feature"``, the SAE latents to ablate, one cell each (default ``None``:
            required with ``over="feature"``).
        positions: as for :func:`patch_sweep` (default ``None``: every token of each prompt; negative
            from each prompt's own end, non-negative from its start).
        token_scope: the gain measures' token scope (default ``"all_but_first"``).
        level: confidence level of the CIs (default ``0.95``).
        start_at_layer: as for :func:`patch_sweep` (default ``True``; the residual is the prompts' own).
        settings, **run: run options; ``batch_size`` bounds the rows per pass (default ``"auto"``, as for
            :func:`patch_sweep`).

    Returns:
        :class:`thermo_lens.experiments.sweeps.SweepResult` (``alignment``: how positions aligned; ``notes``: NaN
        cells, e.g. a zero-ablated residual whose zero norm leaves a gain undefined, named and warned).

    Raises:
        ThermoLensInputError: an option of the wrong type or range (checked before any conversion or
            pass); an unknown method, measure or ``over``; a hook without a head axis with
            ``over="head"``; a position beyond a prompt; a position no reference prompt has
            (``"mean"``); a prompt no other prompt covers (``"resample"``); ``"mean"`` or
            ``"resample"`` of a square hook on prompts of different lengths; ``"resample"`` with one prompt.
        ThermoLensNumericsError: the prompts' own measure, without any condition, is not finite.
    """
    ov = _check_options(over=over, level=level, start_at_layer=start_at_layer, token_scope=token_scope)
    if not isinstance(method, str) or method not in METHODS:
        raise ThermoLensInputError(f"unknown method {excerpt(method)}; choose one of {', '.join(map(repr, METHODS))}")
    if reference is not None and method != "mean":
        raise ThermoLensInputError(f"reference= is the prompt set of method='mean'; method={method!r} does not use it")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ThermoLensInputError(f"seed must be an int >= 0 (numpy's generator seed), got {excerpt(seed)}")
    view = as_view(model)
    given_settings, opts = settings, dict(run)
    auto = _auto(opts)
    settings = RunSettings.resolve(settings, **opts)
    rows = _rows(view, settings, given_settings, opts, auto, prompts)
    parse_measure(measure, view.n_layers, view.n_heads)
    ps = as_model_prompts(view, prompts)

    def sources(layout: HookLayout, lays: list[int], min_tokens: int, lengths: list[int],
                slots: list[list[int] | None]) -> tuple[Sources, Tensor | None, str, str]:
        if method == "zero":
            return None, None, "", _alignment(slots, lengths)
        refs = ps if method == "resample" or reference is None else as_model_prompts(view, reference)
        rl = lengths if refs is ps else _lengths(view, refs, settings, 1)
        if layout.square and len(set(lengths) | set(rl)) > 1:
            raise ThermoLensInputError(
                f"method={method!r} on {layout.suffix} ([head, query, key]) needs every prompt"
                f"{'' if refs is ps else ' and reference prompt'} to have one token length (the keys of prompts "
                f"of different lengths cannot align), got lengths {sorted(set(lengths) | set(rl))}")
        if method == "resample":
            return _resample(view, ps, layout, lays, settings, slots, lengths, min_tokens, rows, token_scope,
                             int(seed))
        acts, _ = capture(view, refs, layout, lays, settings, measure=None, token_scope=token_scope, min_tokens=1,
                          rows_per_pass=rows)
        out, coverage = _means(acts, layout, lays, slots, lengths, rl)
        return (out, None, f"mean over {len(refs)} reference prompt(s) at each aligned position"
                           f"{coverage} ({'the prompts themselves' if reference is None else refs.name})",
                _alignment(slots, lengths, rl))

    return _sweep(view, ps, hook, ov, measure, layers=layers, heads=heads, features=features, positions=positions,
                  token_scope=token_scope, level=level, settings=settings, rows=rows, sources_for=sources,
                  kind="ablation", method=method, start_at_layer=start_at_layer)


def _means(acts: dict[int, list[Tensor]], layout: HookLayout, lays: list[int], slots: list[list[int] | None],
           lengths: list[int], rl: list[int]) -> tuple[dict[tuple[int, int], list[Tensor]], str]:
    """Per (layer, slot) and prompt, the reference prompts' mean at each of its aligned positions:
    the mean over the reference prompts that have that position (every one where all have one
    length). ``None`` slots (every token) align from each prompt's start."""
    d = layout.pos_dim - 1
    one = len(set(rl)) == 1
    full: dict[int, Tensor] = {}
    if one:  # one length: the mean at every position at once (as it always was)
        full = {l: torch.stack(acts[l]).double().mean(0).to(acts[l][0].dtype) for l in lays}
    cache: dict[tuple[int, int], Tensor] = {}
    fewest = len(rl)

    def mean_at(l: int, q: int) -> Tensor:
        nonlocal fewest
        if (l, q) not in cache:
            if one:
                r = _at(q, rl[0])
                if r is None:
                    raise ThermoLensInputError(f"method='mean': position {q} is beyond the reference prompts "
                                               f"({rl[0]} tokens)")
                cache[(l, q)] = full[l].select(d, r)
            else:
                have = [(j, r) for j, n in enumerate(rl) if (r := _at(q, n)) is not None]
                if not have:
                    raise ThermoLensInputError(
                        f"method='mean': no reference prompt has position {q} (reference lengths {min(rl)} to "
                        f"{max(rl)} tokens; non-negative positions from each prompt's start, negative from its end): "
                        "pass reference prompts at least as long as the prompts, or other positions")
                fewest = min(fewest, len(have))
                cache[(l, q)] = torch.stack([acts[l][j].select(d, r) for j, r in have]).double().mean(0).to(
                    acts[l][0].dtype)
        return cache[(l, q)]

    out: dict[tuple[int, int], list[Tensor]] = {}
    for l in lays:
        for k, sl in enumerate(slots):
            per = []
            for n in lengths:
                qs = list(range(n)) if sl is None else sl
                if one and sl is None and n == rl[0]:
                    per.append(full[l])
                else:
                    per.append(torch.stack([mean_at(l, q) for q in qs], dim=d))
            out[(l, k)] = per
    coverage = "" if one else f" (each position over the reference prompts that have it; at least {fewest} of {len(rl)})"
    return out, coverage


def _resample(view: ModelView, ps: PromptList, layout: HookLayout, lays: list[int], settings: RunSettings,
              slots: list[list[int] | None], lengths: list[int], min_tokens: int, rows: int, token_scope: str,
              seed: int) -> tuple[Sources, None, str, str]:
    """Prompt ``p`` takes another prompt ``source[p]``'s activation at its aligned positions, drawn
    (seeded) among the prompts that have every one of them (all but ``p`` where lengths are equal)."""
    if len(ps) < 2:
        raise ThermoLensInputError("method='resample' draws each prompt's values from another prompt: "
                                   "pass at least 2 prompts")

    def has_all(j: int, n_p: int) -> bool:
        return all((lengths[j] >= n_p) if sl is None else all(_at(q, lengths[j]) is not None for q in sl)
                   for sl in slots)
    rng = np.random.default_rng(seed)
    src = []
    for p in range(len(ps)):
        can = [j for j in range(len(ps)) if j != p and has_all(j, lengths[p])]
        if not can:
            raise ThermoLensInputError(
                f"method='resample': no other prompt has every position prompt {p} ({lengths[p]} tokens) needs"
                + (" (every token, aligned from the start: a prompt at least as long)" if any(
                    sl is None for sl in slots) else "")
                + ": pass positions=[...] (negative from each prompt's own end) or more prompts of its length")
        src.append(int(rng.choice(can)))
    # every prompt's own indices of each slot's positions (checked on all prompts before the sources)
    at = [_resolve(sl, lengths, "the") for sl in slots]
    acts, _ = capture(view, ps, layout, lays, settings, measure=None, token_scope=token_scope,
                      min_tokens=min_tokens, rows_per_pass=rows)
    out: dict[tuple[int, int], list[Tensor]] = {}
    for l in lays:
        for k, sl in enumerate(slots):
            out[(l, k)] = [_gather(acts[l][j], tuple(range(lengths[p])) if sl is None else at[k][j], layout)
                           for p, j in enumerate(src)]
    ragged = len(set(lengths)) > 1
    return (out, None, f"resample (seed {seed}): prompt p takes prompt source[p]'s activation"
                       + (" at the same aligned positions, among the prompts that have them" if ragged else "")
                       + f", source={src}", _alignment(slots, lengths))
