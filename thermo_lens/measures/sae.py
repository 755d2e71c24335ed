"""How much attached SAEs change the residual gain, layer by layer, with paired CIs across prompts.

An SAE spliced into the residual stream (SAELens' ``HookedSAETransformer.add_sae``) replaces the
activation ``x`` at its hook by its reconstruction ``SAE(x)`` (or, with ``use_error_term=True``, by
``SAE(x) + (x - SAE(x))``, which is ``x`` up to rounding). Every thermo-lens metric measures the
residual stream the model actually carries downstream of the SAE (``ModelView.resolve_hook``).
:func:`sae_gain_change` runs the same prompts, tokenized identically, once with the SAEs and once
without, and reports per block ``l`` (0-based) the paired difference

    delta_l(p) = G_l(p | SAEs) - G_l(p | no SAEs)

with its mean, SD (ddof=1), SE, Student-t CI and two-sided paired t-test across prompts ``p``
(paired: both runs see the same prompts, tokens, batches and hooks, so between-prompt variation
cancels): a :class:`~thermo_lens.stats.paired.PairedDifference`. ``G_l = ||x_{l+1}|| / ||x_l||`` under
the chosen token scope (``thermo_lens.measures.gain``), with ``x_l`` read where block ``l`` reads it: an SAE
between blocks ``l-1`` and ``l`` counts in block ``l-1``'s gain (``ModelView.resid_hook_names``).

SAEs are never downloaded here; build one with SAELens (``StandardSAE(StandardSAEConfig(...))``) or
load your own. SAE support needs SAELens, i.e. TransformerLens 2.16.x or 3.x.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Unpack

import pandas as pd
from jaxtyping import Float
from torch import Tensor

from thermo_lens.measures.gain import DEFAULT_SCOPE, GainResult, residual_gain
from thermo_lens.core import attached
from thermo_lens.core.inputs import Prompts
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.stats.paired import PairedDifference, paired_t
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.stats import SummaryStats

if TYPE_CHECKING:
    from sae_lens import SAE

    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["SAEGainChange", "sae_gain_change", "sae_position"]

_RESID_HOOK = re.compile(r"^blocks\.(\d+)\.hook_resid_(pre|mid|post)$")


def sae_position(hook: str) -> float | None:
    """Where an SAE at ``hook`` sits on the block axis (block ``l`` at ``l``): ``l - 0.5`` before
    block ``l`` (``hook_resid_pre``), ``l`` inside it (``hook_resid_mid``), ``l + 0.5`` after it
    (``hook_resid_post``); None for a hook off the residual stream."""
    m = _RESID_HOOK.match(hook)
    if not m:
        return None
    layer, where = int(m.group(1)), m.group(2)
    return layer + {"pre": -0.5, "mid": 0.0, "post": 0.5}[where]


@dataclass(frozen=True, repr=False, eq=False)
class SAEGainChange(PairedDifference):
    """Residual gain with and without attached SAEs: a :class:`~thermo_lens.stats.paired.PairedDifference`
    of ``block_gain`` (``b`` with the SAEs, ``a`` without), with the two runs and the SAEs.

    Attributes (besides :class:`~thermo_lens.stats.paired.PairedDifference`'s ``difference``,
    ``summary``, ``statistic``, ``pvalue``, ``t_test``, ``notes`` ...):
        with_saes, without_saes: the two :class:`~thermo_lens.measures.gain.GainResult` (same prompts, same
            tokens, same token scope, same run options and ``fwd_hooks``); their provenance
            records the SAEs among the hooks.
        saes: one record per SAE compared (``hook``, ``d_in``, ``d_sae``, ``use_error_term``,
            ``architecture``).

    ``delta`` (``[prompt, layer]`` float32, ``G_l(p | SAEs) - G_l(p | no SAEs)``) and
    ``delta_summary`` (its per-layer summary) read the same numbers.
    """

    with_saes: GainResult | None = None
    without_saes: GainResult | None = None
    saes: tuple[dict[str, Any], ...] = ()

    # 3: the t statistic is stored as ``statistic`` (``t_statistic`` before; PairedDifference.migrate)
    schema_version: ClassVar[int] = 3

    @classmethod
    def migrate(cls, fields: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 1 stored ``delta`` and ``delta_summary`` beside the two runs; rebuild the paired
        difference (with its tests) from the runs."""
        fields = super().migrate(fields, version)
        if version < 2 and "with_saes" in fields:
            fields.pop("delta", None)
            fields.pop("delta_summary", None)
            w, wo = fields["with_saes"], fields["without_saes"]
            a, b = wo.block_gain.double(), w.block_gain.double()
            summary, t, p = paired_t(b - a, float(fields.get("level", 0.95)))
            fields.update(quantity="block_gain", result_type="GainResult", dims=("layer",), difference=b - a,
                          a=a, b=b, summary=summary, statistic=t, pvalue=p, provenance_a=wo.provenance,
                          provenance_b=w.provenance)
        return fields

    @property
    def delta(self) -> Float[Tensor, "prompt layer"]:
        """``G_l(p | SAEs) - G_l(p | no SAEs)`` (float32)."""
        return self.difference.float()

    @property
    def delta_summary(self) -> SummaryStats:
        return self.summary

    @property
    def definition(self) -> str:
        g = self.with_saes
        scope = g.token_scope if g is not None else "?"
        bos = g.prepend_bos if g is not None else "?"
        return (f"delta_l = G_l(with SAEs) - G_l(without), paired over {self.n_prompts} prompts; "
                f"G_l = ||x_(l+1)|| / ||x_l||, token scope {scope}, prepend_bos={bos}, "
                f"{100 * self.level:g}% paired t-CI, two-sided paired t-test")

    def to_frame(self) -> pd.DataFrame:
        """:meth:`PairedDifference.to_frame` (one row per block ``layer``: ``mean_difference, sd, se,
        ci_low, ci_high, t, pvalue, t_test, n, mean_a`` (without), ``mean_b`` (with), hooks, notes)
        plus ``saes_at_layer`` (the SAEs just before / in / after the block), ``token_scope`` and
        ``prepend_bos``."""
        df = super().to_frame()
        df["saes_at_layer"] = [", ".join(r["hook"] for r in self.saes
                                         if (pos := sae_position(r["hook"])) is not None and l - 0.5 <= pos <= l + 0.5)
                               for l in df["layer"]]
        if self.with_saes is not None:
            df["token_scope"] = self.with_saes.token_scope
            df["prepend_bos"] = str(self.with_saes.prepend_bos)
        return df

    def __repr__(self) -> str:
        saes = "; ".join(f"{r['hook']} (d_sae={r['d_sae']}, error term {'on' if r['use_error_term'] else 'off'})"
                         for r in self.saes)
        body = PairedDifference.__repr__(self).splitlines()[1:]  # a:, b: (the hooks, SAEs included), per layer
        return "\n".join([f"SAEGainChange({self.provenance_b.model.get('name')}: {saes})", f"  {self.definition}"]
                         + body)

    def _repr_html_(self) -> str:
        return self.to_frame().to_html(index=False, float_format=lambda v: f"{v:.4g}")


def _require_sae_host(view: ModelView) -> None:
    model = view.model
    if not view.adapter.holds_saes:
        raise ThermoLensInputError(
            f"{view.name} is a {type(model).__name__}, which cannot hold SAEs; build the model as "
            "SAELens' HookedSAETransformer (`from sae_lens import HookedSAETransformer; "
            "HookedSAETransformer.from_pretrained_no_processing(name)`, TransformerLens 2.16.x or 3.x: "
            "pip install 'thermo-lens[sae]') and attach SAEs with model.add_sae(sae)."
        )


def _check_sae(view: ModelView, hook: str, d_in: int, what: str) -> None:
    """An SAE to compare must sit on a residual-stream hook thermo-lens reads, with width d_model."""
    m = _RESID_HOOK.match(hook)
    if not m or int(m.group(1)) >= view.n_layers:
        hint = (f"this model has no such hook point: its blocks are 0..{view.n_layers - 1}" if m
                else "it is not on the residual stream")
        raise ThermoLensInputError(
            f"{what} reads {hook!r}, a hook thermo-lens does not read as a residual state ({hint}). "
            "sae_gain_change compares residual gains around SAEs spliced into the residual stream: "
            f"use an SAE at blocks.<l>.hook_resid_pre / hook_resid_mid / hook_resid_post with "
            f"l in 0..{view.n_layers - 1}. (Any attached SAE, wherever it sits, is still measured "
            "downstream by residual_gain and recorded in its model metadata.)"
        )
    if d_in != view.d_model:
        raise ThermoLensInputError(
            f"{what} at {hook} has d_in={d_in}, but {view.name}'s residual stream has "
            f"d_model={view.d_model}: it was trained for another model. Use an SAE whose "
            f"cfg.d_in == {view.d_model} (e.g. one trained on this model at {hook})."
        )


def sae_gain_change(
    model: TransformerLensModel | ModelView,
    prompts: Prompts,
    *,
    saes: SAE | list[SAE] | tuple[SAE, ...] | None = None,
    use_error_term: bool | None = None,
    token_scope: str = DEFAULT_SCOPE,
    level: float = 0.95,
    settings: RunSettings | None = None,
    **run: Unpack[RunOptions],
) -> SAEGainChange:
    """How much SAEs spliced into the residual stream change the residual gain, per block.

    Args:
        model: SAELens ``HookedSAETransformer`` (TransformerLens 2.16.x / 3.x) or
            ``SAETransformerBridge`` (TransformerLens 3.x).
        prompts: anything :data:`thermo_lens.core.inputs.Prompts` describes.
        saes: SAEs to compare (an SAE or a list), attached for the "with" run only and removed
            afterwards (SAEs already attached stay in both runs; HookedSAETransformer only); default
            ``None`` compares the SAEs attached now (``model.add_sae``) against the same SAEs with
            their error term added back (``SAE(x) + (x - SAE(x))``: the model's own stream up to
            float rounding, ~1e-7 relative), restoring each SAE's setting afterwards.
        use_error_term: for ``saes`` given here, attach them with this ``use_error_term`` (None: each
            SAE's own setting). With the error term the SAE's output equals its input up to
            rounding, so every delta is ~0: a check that nothing else changed.
        token_scope: as in :func:`thermo_lens.measures.gain.residual_gain` (default ``"all_but_first"``).
        level: confidence level of the CIs (default ``0.95``).
        settings, **run: run options (:class:`thermo_lens.core.settings.RunOptions`: ``prepend_bos``,
            ``batch_size``, ``truncate``, ``fwd_hooks``, ``progress``, ``sort_by_length``), the same
            for both runs (``fwd_hooks`` run in both: the SAEs' effect under your intervention).

    Returns:
        :class:`SAEGainChange`: a :class:`~thermo_lens.stats.paired.PairedDifference` (``.to_frame()``
        with ``t``, ``pvalue``, CIs; ``.select()``), with both runs and ``.plot()``.

    Raises:
        ThermoLensInputError: the model cannot hold SAEs; no SAE to compare; an SAE on a hook that
            is not a residual state of this model; an SAE whose ``d_in`` is not ``d_model``.
    """
    view = as_view(model)
    _require_sae_host(view)
    model = view.model
    run_settings = RunSettings.resolve(settings, **run)
    kwargs: dict[str, Any] = dict(token_scope=token_scope, level=level, settings=run_settings)
    if saes is not None:
        if not view.adapter.swaps_saes:
            raise ThermoLensInputError(
                f"on a {type(model).__name__}, attach the SAEs first (model.add_sae(sae)) and call "
                "sae_gain_change(model, prompts) without saes=: SAELens' reset_saes leaves the "
                "bridge's hook point silent, so thermo-lens does not attach and remove SAEs for you there."
            )
        sae_list = list(saes) if isinstance(saes, (list, tuple)) else [saes]
        if not sae_list:
            raise ThermoLensInputError("saes is empty; pass an SAE, a list of SAEs, or None for the attached ones")
        for i, sae in enumerate(sae_list):
            _check_sae(view, str(sae.cfg.metadata.hook_name), int(sae.cfg.d_in), f"SAE {i}")
        without = residual_gain(view, prompts, **kwargs)
        with model.saes(saes=sae_list, use_error_term=use_error_term):
            compared = [r for r in attached.sae_records(view.model)
                        if r["hook"] in {str(s.cfg.metadata.hook_name) for s in sae_list}]
            with_ = residual_gain(view, prompts, **kwargs)
    else:
        records = attached.sae_records(view.model)
        if not records:
            raise ThermoLensInputError(
                f"no SAE is attached to {view.name}: attach one (model.add_sae(sae)) or pass saes=[...]")
        for r in records:
            _check_sae(view, r["hook"], r["d_in"], "the attached SAE")
        compared = records
        with_ = residual_gain(view, prompts, **kwargs)
        # The baseline runs the same SAEs with their error term added back: SAE(x) + (x - SAE(x))
        # is the model's own stream up to float rounding (~1e-7 relative). Detaching and
        # re-attaching is avoided: on SAETransformerBridge a reset hook point stops firing.
        wrappers = [w for w in view.adapter.sae_wrappers(model).values() if hasattr(w, "use_error_term")]
        before = [w.use_error_term for w in wrappers]
        try:
            for w in wrappers:
                w.use_error_term = True
            without = residual_gain(view, prompts, **kwargs)
        finally:
            for w, b in zip(wrappers, before):
                w.use_error_term = b
    a, b = without.block_gain.double(), with_.block_gain.double()
    summary, t, p = paired_t(b - a, float(level))
    # The SAEs are what is compared (both runs record them among their hooks); say anything else that differs.
    notes = [n for n in without.provenance.pairing_notes(with_.provenance) if not n.startswith("the two runs ran")]
    other_a = [str(h) for h in without.provenance.hidden_hooks if h.attached != "sae"]
    other_b = [str(h) for h in with_.provenance.hidden_hooks if h.attached != "sae"]
    if other_a != other_b:
        notes.append(f"hooks already on the model differ between the runs: without: {'; '.join(other_a) or 'none'} "
                     f"/ with: {'; '.join(other_b) or 'none'}")
    return SAEGainChange(
        quantity="block_gain", result_type="GainResult", dims=("layer",), difference=b - a, a=a, b=b,
        summary=summary, statistic=t, pvalue=p, provenance_a=without.provenance, provenance_b=with_.provenance,
        level=float(level), notes=tuple(notes), with_saes=with_, without_saes=without, saes=tuple(compared),
    )
