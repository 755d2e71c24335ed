"""Patching and ablation sweeps: every head's (or position's) effect on a measure, with paired CIs.

::

    import thermo_lens as tl

    s = tl.patch_sweep(model, clean, corrupted, "attn.hook_z", over="head", measure="last_block_gain")
    s.effect            # [layer, head] mean over prompts of m(corrupted | head patched) - m(corrupted)
    s.to_frame()        # one row per cell: effect, CI, p, Holm-adjusted p, fraction restored ...
    a = tl.ablation_sweep(model, prompts, "attn.hook_z", method="mean", measure=logit_diff)

The effect of a cell on prompt ``p`` is ``m(p | condition) - m(p)``: the measure under the
condition minus the measure of the same prompt without it (:mod:`thermo_lens.sweeps.result`).
Conditions are stacked along the batch, many per forward pass (:mod:`thermo_lens.sweeps.engine`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Unpack

import numpy as np
import torch
from torch import Tensor

from thermo_lens import attached, validate
from thermo_lens.errors import ThermoLensInputError
from thermo_lens.gain import DEFAULT_SCOPE
from thermo_lens.inputs import Prompts, as_model_prompts
from thermo_lens.model import ModelView, as_view
from thermo_lens.settings import RunOptions, RunSettings
from thermo_lens.sweeps.engine import Condition, HookLayout, capture, hook_layout, parse_measure, run_conditions
from thermo_lens.sweeps.features import feature_layout, feature_list
from thermo_lens.sweeps.result import SweepResult, build_result
from thermo_lens.tokens import TokenScope, token_batch
from thermo_lens.validate import validates_own_inputs

__all__ = ["patch_sweep", "ablation_sweep", "METHODS", "OVER"]

#: Ablation methods: what replaces the activation.
METHODS = ("zero", "mean", "resample")
#: The cell axes a sweep runs over (after ``layer``).
OVER = ("head", "pos", ("head", "pos"))
_DEFAULT_ROWS = 64  # rows per forward pass when no batch_size is given


def _over(over: Any) -> tuple[str, ...]:
    if over == "head" or over == "pos":
        return (over,)
    if isinstance(over, (tuple, list)) and tuple(over) == ("head", "pos"):
        return ("head", "pos")
    raise ThermoLensInputError(f"over must be 'head', 'pos' or ('head', 'pos'), got {over!r}")


def _index_list(name: str, value: Any, n: int) -> list[int]:
    if value is None:
        return list(range(n))
    items = [value] if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    try:
        items = list(items)
    except TypeError:
        raise ThermoLensInputError(f"{name} must be an int or a list of ints, got {value!r}") from None
    bad = [v for v in items if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not -n <= v < n]
    if bad or not items:
        raise ThermoLensInputError(f"{name} must be ints in 0..{n - 1} (negative from the end), got {value!r}")
    return list(dict.fromkeys(int(v) % n for v in items))


def _lengths(view: ModelView, ps: Any, settings: RunSettings, min_tokens: int) -> list[int]:
    """Token lengths of each prompt (fails here, before any compute, on a bad prompt)."""
    tb = token_batch(view, ps, range(len(ps)), prepend_bos=settings.prepend_bos, truncate=settings.truncate,
                     min_tokens=min_tokens)
    return [int(n) for n in tb.lengths]


def _resolve(positions: Any, lengths: Sequence[int], what: str) -> list[tuple[int, ...]]:
    """Per prompt, ``positions`` (negative from each prompt's end) as indices of its real tokens."""
    if positions is None:
        return [tuple(range(n)) for n in lengths]
    ps = [positions] if isinstance(positions, (int, np.integer)) else list(positions)
    out = []
    for i, n in enumerate(lengths):
        idx = []
        for q in ps:
            if isinstance(q, bool) or not isinstance(q, (int, np.integer)):
                raise ThermoLensInputError(f"positions must be ints (negative from each prompt's end), got {q!r}")
            r = int(q) + n if q < 0 else int(q)
            if not 0 <= r < n:
                raise ThermoLensInputError(
                    f"position {q} is beyond {what} prompt {i} ({n} tokens); positions index real tokens, "
                    "negative ones from each prompt's end (-1 = last token)")
            idx.append(r)
        out.append(tuple(idx))
    return out


def _equal(lengths: Sequence[int], why: str) -> int:
    if len(set(lengths)) != 1:
        raise ThermoLensInputError(
            f"{why} needs every prompt to have the same token length (positions must align), got lengths "
            f"{sorted(set(lengths))}: pass prompts of one length, or positions=[...] (negative from each prompt's end)")
    return lengths[0]


def _check_logit_function_lengths(m: Any, lengths: Sequence[int], what: str) -> None:
    """A function of the logits gets a condition's prompts right-padded to one length, and cannot
    tell padding from tokens: with prompts of several lengths, ``logits[:, -1]`` (the usual metric)
    would read a pad of every shorter prompt. Refused instead of computed."""
    if m.kind == "logits" and len(set(lengths)) > 1:
        raise ThermoLensInputError(
            f"{what} have different token lengths ({min(lengths)} to {max(lengths)}): a function of the logits "
            "gets them right-padded to one length [prompt, pos, d_vocab] without the padding mask, so "
            "logits[:, -1] would read padding for the shorter prompts. Use thermo_lens.sweeps.LogitDifference("
            "answer, wrong, pos=-1), which reads each prompt's own token at pos, or prompts of one token length")


def _sweep(view: ModelView, ps: Any, hook: Any, over: Any, measure: Any, *, layers: Any, heads: Any,
           positions: Any, token_scope: str, level: float, settings: RunSettings, rows: int,
           sources_for: Callable[[HookLayout, list[int], int, list[int]], tuple[Any, Tensor | None, str]],
           kind: str, method: str, start_at_layer: bool) -> SweepResult:
    """Shared body: cells, conditions, one multi-condition run, the result."""
    ov = _over(over)
    lays = _index_list("layers", layers, view.n_layers)
    # Every swept hook point exists (a misspelt hook is named as such, with the closest names) before
    # the head-axis check, which would call it a hook without heads.
    attached.check_hook_names(view.model, [hook_layout(hook, ("pos",)).name(l) for l in lays], view.name)
    layout = hook_layout(hook, ov)
    m = parse_measure(measure, view.n_layers, view.n_heads)
    validate.token_scope(token_scope)
    scope = m.scope(token_scope)
    if not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ThermoLensInputError(f"level must be a confidence level in (0, 1), got {level!r}")
    min_tokens = m.min_tokens(token_scope)
    lengths = _lengths(view, ps, settings, min_tokens)
    _check_logit_function_lengths(m, lengths, "the prompts")
    if m.kind == "logit_difference":
        m.source.check(len(ps), lengths, view.d_vocab)
        if any(not isinstance(n, str) or not n.startswith("blocks.") for n, _ in settings.fwd_hooks):
            raise ThermoLensInputError(
                "LogitDifference reads the final residual and applies the model's final norm itself, so user hooks "
                "past the blocks would not see the pass; with such hooks use a function of the logits as the measure")
    hs: list[int | None] = list(_index_list("heads", heads, view.n_heads)) if "head" in ov else [None]
    if heads is not None and "head" not in ov:
        raise ThermoLensInputError("heads= selects the swept heads; this sweep is over='pos' (pass over='head' or "
                                   "('head', 'pos'))")
    if "pos" in ov:
        labels = list(range(_equal(lengths, "over='pos' without positions="))) if positions is None else (
            [positions] if isinstance(positions, (int, np.integer)) else list(positions))
        per_pos = [_resolve([q], lengths, "the") for q in labels]  # [label][prompt] -> (index,)
    else:
        labels, per_pos = [], [_resolve(positions, lengths, "the")]
    sources, clean_values, reference = sources_for(layout, lays, min_tokens, lengths)
    conditions = [Condition(l, h, tuple(pp)) for l in lays for h in hs for pp in per_pos]
    values, provenance, passes = run_conditions(view, ps, layout, conditions, sources, settings, rows, measure=m,
                                                token_scope=token_scope, min_tokens=min_tokens,
                                                start_at_layer=start_at_layer)
    P = len(ps)
    shape = [len(lays)] + ([len(hs)] if "head" in ov else []) + ([len(labels)] if "pos" in ov else [])
    per_prompt = (values[1:] - values[0]).reshape(*shape, P).movedim(-1, 0)
    return build_result(
        per_prompt=per_prompt, baseline=values[0], clean=clean_values, level=float(level), kind=kind, method=method,
        hook=layout.suffix, over=ov, measure=m.label, layers=tuple(lays),
        heads=tuple(int(h) for h in hs if h is not None) if "head" in ov else (),
        positions=tuple(int(q) for q in labels), token_scope=scope, measure_definition=m.definition,
        patched_positions="the swept position" if "pos" in ov else ("all" if positions is None else str(list(
            [positions] if isinstance(positions, (int, np.integer)) else positions))),
        reference=reference, provenance=provenance, passes=passes)


def _feature_sweep(view: ModelView, ps: Any, hook: Any, features: Any, measure: Any, *, positions: Any,
                   token_scope: str, level: float, settings: RunSettings, rows: int, sources_for: Callable[..., Any],
                   kind: str, method: str) -> SweepResult:
    """:func:`_sweep` over the latents of one SAE (``over="feature"``, :mod:`thermo_lens.sweeps.features`):
    one cell per listed feature, every pass from the embedding."""
    layout, layer, d_sae = feature_layout(view, hook)
    feats = feature_list(features, d_sae)
    m = parse_measure(measure, view.n_layers, view.n_heads)
    validate.token_scope(token_scope)
    if not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ThermoLensInputError(f"level must be a confidence level in (0, 1), got {level!r}")
    min_tokens = m.min_tokens(token_scope)
    lengths = _lengths(view, ps, settings, min_tokens)
    _check_logit_function_lengths(m, lengths, "the prompts")
    if m.kind == "logit_difference":
        m.source.check(len(ps), lengths, view.d_vocab)
    at = [_resolve(positions, lengths, "the")]
    sources, clean_values, reference = sources_for(layout, [layer], min_tokens, lengths)
    conditions = [Condition(layer, f, tuple(at[0])) for f in feats]
    # Every pass from the embedding: a pass started at the SAE's block would read the stream downstream of
    # the SAE for an SAE at hook_resid_pre, and never run it.
    values, provenance, passes = run_conditions(view, ps, layout, conditions, sources, settings, rows,
                                                measure=m, token_scope=token_scope, min_tokens=min_tokens,
                                                start_at_layer=False)
    per_prompt = (values[1:] - values[0]).reshape(1, len(feats), len(ps)).movedim(-1, 0)
    return build_result(
        per_prompt=per_prompt, baseline=values[0], clean=clean_values, level=float(level), kind=kind, method=method,
        hook=hook, over=("feature",), measure=m.label, layers=(layer,), heads=tuple(feats), positions=(),
        token_scope=m.scope(token_scope), measure_definition=m.definition,
        patched_positions="all" if positions is None else str(list(
            [positions] if isinstance(positions, (int, np.integer)) else positions)),
        reference=reference, provenance=provenance, passes=passes)


def _rows(settings: RunSettings | None, run: dict[str, Any]) -> int:
    return int(run["batch_size"]) if "batch_size" in run else (settings.batch_size if settings is not None
                                                                 else _DEFAULT_ROWS)


@validates_own_inputs
def patch_sweep(
    model: Any,
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
            ``q``, negative ones from each prompt's end; not for ``hook_pattern``).
        hook: the per-layer hook point: ``"attn.hook_z"`` (or ``"hook_z"``), ``"hook_pattern"``,
            ``"attn.hook_q"``, ``"attn.hook_result"`` (heads), ``"hook_resid_pre"``,
            ``"hook_resid_post"`` ... (positions).
        over: the cell axes after ``layer``: ``"head"`` (the default), ``"pos"`` or ``("head", "pos")``.
        measure: the per-prompt scalar (:data:`thermo_lens.sweeps.MEASURE_DEFINITIONS`):
            ``"total_amplification"`` (the default), ``"last_block_gain"``, ``"block_gain:<layer>"`` (in
            ``token_scope``, as :func:`thermo_lens.residual_gain`), ``"attribution_total:<layer>"``,
            ``"attribution_head:<layer>"`` (sum over heads), ``"attribution_head:<layer>.<head>"`` (the
            terms of :func:`thermo_lens.gain_attribution`, in ``token_scope``), ``"sheaf_trace:<layer>"``
            (sum over heads), ``"sheaf_trace:<layer>.<head>"`` (:func:`thermo_lens.sheaf_traces`, all real
            tokens), a :class:`thermo_lens.sweeps.LogitDifference` (a logit difference from the final
            residual: two unembedding columns, the passes end after the last block), or a function of the
            logits ``[prompt, pos, d_vocab] -> [prompt]`` (called once per condition with all prompts in
            your order, e.g. a logit difference; the passes then run to the logits).
        layers: layers to sweep (default ``None``: all).
        heads: heads to sweep (default ``None``: all).
        features: with ``over="feature"`` and ``hook="<SAE hook>.hook_sae_acts_post"``, the SAE latents
            to sweep, one cell each (:mod:`thermo_lens.sweeps.features`; every pass from the embedding;
            default ``None``: required with ``over="feature"``).
        positions: with ``"pos"`` in ``over``, the swept positions (default ``None``: every position,
            which needs prompts of one length); otherwise the patched positions of each cell (default
            ``None``: every token). Negative from each prompt's end.
        token_scope: the gain measures' token scope (default ``"all_but_first"``).
        level: confidence level of the CIs (default ``0.95``).
        start_at_layer: where the host supports it (default ``True``), each cell's pass starts at its
            layer from the corrupted run's residual there (blocks below it are the same with or without
            the patch; :mod:`thermo_lens.sweeps.start`); the result's ``passes`` says how they ran.
        settings, **run: run options (:class:`thermo_lens.settings.RunOptions`); ``batch_size`` bounds
            the rows per forward pass (default here ``64``; at least one copy of the prompts runs per pass).

    Returns:
        :class:`thermo_lens.sweeps.SweepResult`.

    Raises:
        ThermoLensInputError: clean and corrupted sets of different sizes or a pair of different token
            lengths, a hook without a head axis with ``over="head"``, a position beyond a prompt, an
            unknown measure or ``over``.
    """
    view = as_view(model)
    rows = _rows(settings, dict(run))
    settings = RunSettings.resolve(settings, **run)
    cps, ps = as_model_prompts(view, clean), as_model_prompts(view, corrupted)
    if len(cps) != len(ps):
        raise ThermoLensInputError(f"clean and corrupted must be pairs: got {len(cps)} clean and {len(ps)} corrupted "
                                   "prompts (pass one clean prompt per corrupted prompt, in the same order)")

    m = parse_measure(measure, view.n_layers, view.n_heads)

    def sources(layout: HookLayout, lays: list[int], min_tokens: int, lengths: list[int]) -> tuple[Any, Tensor | None, str]:
        cl = _lengths(view, cps, settings, min_tokens)
        _check_logit_function_lengths(m, cl, "the clean prompts")
        if m.kind == "logit_difference":
            m.source.check(len(cps), cl, view.d_vocab)
        bad = [i for i, (a, b) in enumerate(zip(cl, lengths)) if a != b]
        square = layout.pos_dim != 1  # [head, query, key]: the keys must align too
        if bad and (positions is None or square):
            i = bad[0]
            raise ThermoLensInputError(
                f"patching needs each clean/corrupted pair to have the same token length (positions must align): "
                f"pair {i} has {cl[i]} clean and {lengths[i]} corrupted tokens ({len(bad)} pair(s) differ). "
                + ("Rephrase the prompts so each pair tokenizes to the same length" if square else
                   "Rephrase the prompts so each pair tokenizes to the same length, or pass positions=[...] "
                   "(negative from each prompt's end: -1 patches the clean last token into the corrupted last token)"))
        acts, clean_values = capture(view, cps, layout, lays, settings, measure=m,
                                     token_scope=token_scope, min_tokens=min_tokens, rows_per_pass=rows)
        if bad:  # pairs of different lengths: clean position q goes to corrupted position q (each from its end)
            at_clean, at_corr = _resolve(positions, cl, "clean"), _resolve(positions, lengths, "corrupted")
            for l in lays:
                for i in bad:
                    src = acts[l][i]
                    moved = src.new_zeros((lengths[i],) + tuple(src.shape[1:]))
                    moved[list(at_corr[i])] = src[list(at_clean[i])]
                    acts[l][i] = moved
        first = f"; first {cps.texts[0][:40]!r}" if cps.token_ids is None else f"; {len(cps)} token-id rows"
        return acts, clean_values, f"clean prompts ({cps.name}{first})"

    if features is not None and over != "feature":
        raise ThermoLensInputError("features= selects SAE latents to sweep: pass over='feature' and "
                                   "hook='<SAE hook>.hook_sae_acts_post'")
    if over == "feature":
        return _feature_sweep(view, ps, hook, features, measure, positions=positions, token_scope=token_scope,
                              level=level, settings=settings, rows=rows, sources_for=sources, kind="patch",
                              method="patch")
    return _sweep(view, ps, hook, over, measure, layers=layers, heads=heads, positions=positions,
                  token_scope=token_scope, level=level, settings=settings, rows=rows, sources_for=sources,
                  kind="patch", method="patch", start_at_layer=start_at_layer)


@validates_own_inputs
def ablation_sweep(
    model: Any,
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

    Args:
        model: the TransformerLens model (or ModelView).
        prompts: the prompts (anything :func:`thermo_lens.residual_gain` takes).
        hook: the per-layer hook point, as for :func:`patch_sweep`.
        over: ``"head"`` (the default), ``"pos"``, ``("head", "pos")``, or ``"feature"`` (an SAE's latents:
            ``hook="<SAE hook>.hook_sae_acts_post"`` and ``features=[...]``).
        method: ``"zero"`` (the default), ``"mean"`` or ``"resample"``.
        measure: as for :func:`patch_sweep` (default ``"total_amplification"``).
        reference: the prompts whose per-position mean ``"mean"`` writes (default ``None``: the prompts
            themselves); every prompt and reference prompt must then have one token length.
        seed: the resample draw's seed (default ``0``).
        layers, heads: layers and heads to sweep (default ``None``: all).
        features: with ``over="feature"``, the SAE latents to ablate, one cell each (default ``None``:
            required with ``over="feature"``).
        positions: as for :func:`patch_sweep` (default ``None``).
        token_scope: the gain measures' token scope (default ``"all_but_first"``).
        level: confidence level of the CIs (default ``0.95``).
        start_at_layer: as for :func:`patch_sweep` (default ``True``; the residual is the prompts' own).
        settings, **run: run options; ``batch_size`` bounds the rows per pass (default here ``64``).

    Returns:
        :class:`thermo_lens.sweeps.SweepResult`.

    Raises:
        ThermoLensInputError: an unknown method, measure or ``over``; a hook without a head axis with
            ``over="head"``; a position beyond a prompt; prompts of different token lengths where
            positions must align (``"mean"``, ``"resample"``); ``"resample"`` with one prompt.
    """
    view = as_view(model)
    rows = _rows(settings, dict(run))
    settings = RunSettings.resolve(settings, **run)
    if method not in METHODS:
        raise ThermoLensInputError(f"unknown method {method!r}; choose one of {', '.join(map(repr, METHODS))}")
    if reference is not None and method != "mean":
        raise ThermoLensInputError(f"reference= is the prompt set of method='mean'; method={method!r} does not use it")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ThermoLensInputError(f"seed must be an int, got {seed!r}")
    ps = as_model_prompts(view, prompts)

    def sources(layout: HookLayout, lays: list[int], min_tokens: int, lengths: list[int]) -> tuple[Any, Tensor | None, str]:
        if method == "zero":
            return None, None, ""
        n = _equal(lengths, f"method={method!r}")
        if method == "resample":
            if len(ps) < 2:
                raise ThermoLensInputError("method='resample' draws each prompt's values from another prompt: "
                                           "pass at least 2 prompts")
            rng = np.random.default_rng(int(seed))
            src = [int(rng.choice([j for j in range(len(ps)) if j != p])) for p in range(len(ps))]
            acts, _ = capture(view, ps, layout, lays, settings, measure=None, token_scope=token_scope,
                              min_tokens=min_tokens, rows_per_pass=rows)
            return ({l: [acts[l][j] for j in src] for l in lays}, None,
                    f"resample (seed {int(seed)}): prompt p takes prompt source[p]'s activation, source={src}")
        refs = ps if reference is None else as_model_prompts(view, reference)
        rl = _lengths(view, refs, settings, 1)
        if set(rl) != {n}:
            raise ThermoLensInputError(
                f"method='mean' writes the reference prompts' mean at each position, so the reference prompts need "
                f"the prompts' token length ({n}), got lengths {sorted(set(rl))}")
        acts, _ = capture(view, refs, layout, lays, settings, measure=None, token_scope=token_scope, min_tokens=1,
                          rows_per_pass=rows)
        means = {l: torch.stack(acts[l]).double().mean(0).to(acts[l][0].dtype) for l in lays}
        return ({l: [means[l]] * len(ps) for l in lays}, None,
                f"mean over {len(refs)} reference prompt(s) at each position "
                f"({'the prompts themselves' if reference is None else refs.name})")

    if features is not None and over != "feature":
        raise ThermoLensInputError("features= selects SAE latents to sweep: pass over='feature' and "
                                   "hook='<SAE hook>.hook_sae_acts_post'")
    if over == "feature":
        return _feature_sweep(view, ps, hook, features, measure, positions=positions, token_scope=token_scope,
                              level=level, settings=settings, rows=rows, sources_for=sources, kind="ablation",
                              method=method)
    return _sweep(view, ps, hook, over, measure, layers=layers, heads=heads, positions=positions,
                  token_scope=token_scope, level=level, settings=settings, rows=rows, sources_for=sources,
                  kind="ablation", method=method, start_at_layer=start_at_layer)
