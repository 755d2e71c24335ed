"""How much attached SAEs change the residual gain, layer by layer, with paired CIs across prompts.

An SAE spliced into the residual stream (SAELens' ``HookedSAETransformer.add_sae``) replaces the
activation ``x`` at its hook by its reconstruction ``SAE(x)`` (or, with ``use_error_term=True``, by
``SAE(x) + (x - SAE(x))``, which is ``x`` up to rounding). Every thermo-lens metric measures the
residual stream the model actually carries downstream of the SAE (``ModelView.resolve_hook``).
:func:`sae_gain_change` runs the same prompts, tokenized identically, once with the SAEs and once
without, and reports per block ``l`` (0-based) the paired difference

    delta_l(p) = G_l(p | SAEs) - G_l(p | no SAEs)

with its mean, SD (ddof=1), SE and Student-t CI across prompts ``p`` (paired: both runs see the
same prompts, so between-prompt variation cancels). ``G_l = ||x_{l+1}|| / ||x_l||`` under the
chosen token scope (``thermo_lens.gain``).

SAEs are never downloaded here; build one with SAELens (``StandardSAE(StandardSAEConfig(...))``) or
load your own. SAE support needs SAELens, i.e. TransformerLens 2.16.x or 3.x.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd
from jaxtyping import Float
from torch import Tensor

from thermo_lens.gain import DEFAULT_SCOPE, GainResult, residual_gain
from thermo_lens import attached
from thermo_lens.model import ModelView, as_view
from thermo_lens.errors import ThermoLensInputError
from thermo_lens.result import Result
from thermo_lens.stats import SummaryStats, summarize

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


@dataclass(frozen=True)
class SAEGainChange(Result):
    """Residual gain with and without attached SAEs, and their paired difference per block.

    Attributes:
        with_saes, without_saes: the two :class:`~thermo_lens.gain.GainResult` (same prompts, same
            tokens, same token scope); ``with_saes.model["saes"]`` lists the SAEs.
        delta: ``Float[Tensor, "prompt layer"]`` float32, ``G_l(p | SAEs) - G_l(p | no SAEs)``.
        delta_summary: per-layer :class:`~thermo_lens.stats.SummaryStats` of ``delta`` across
            prompts (arrays over ``layer``): mean, SD (ddof=1), SE, ``level`` t-CI.
        saes: one record per SAE compared (``hook``, ``d_in``, ``d_sae``, ``use_error_term``,
            ``architecture``).
        level: confidence level of the CIs.
    """

    with_saes: GainResult
    without_saes: GainResult
    delta: Tensor
    delta_summary: SummaryStats
    saes: tuple[dict[str, Any], ...]
    level: float = 0.95

    @property
    def n_layers(self) -> int:
        return int(self.delta.shape[1])

    @property
    def definition(self) -> str:
        return (f"delta_l = G_l(with SAEs) - G_l(without), paired over {self.delta.shape[0]} prompts; "
                f"G_l = ||x_(l+1)|| / ||x_l||, token scope {self.with_saes.token_scope}, "
                f"prepend_bos={self.with_saes.prepend_bos}, {100 * self.level:g}% t-CI")

    def to_frame(self) -> pd.DataFrame:
        """One row per block ``layer`` (0-based): mean gains with / without, the paired delta with
        SE and CI, whether the CI excludes 0, and which SAEs sit just before / in / after it."""
        s = self.delta_summary
        with_mean = self.with_saes.block_gain.double().mean(0).numpy()
        without_mean = self.without_saes.block_gain.double().mean(0).numpy()
        rows = []
        for l in range(self.n_layers):
            here = [r["hook"] for r in self.saes
                    if (pos := sae_position(r["hook"])) is not None and l - 0.5 <= pos <= l + 0.5]
            rows.append({
                "layer": l, "gain_with_saes": with_mean[l], "gain_without_saes": without_mean[l],
                "delta_mean": s.mean[l], "delta_se": s.se[l], "delta_ci_low": s.ci_low[l],
                "delta_ci_high": s.ci_high[l], "ci_excludes_0": bool(s.excludes(0.0)[l]),
                "n_prompts": int(s.n[l]), "saes_at_layer": ", ".join(here),
                "token_scope": self.with_saes.token_scope, "prepend_bos": str(self.with_saes.prepend_bos),
            })
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        s = self.delta_summary
        saes = "; ".join(f"{r['hook']} (d_sae={r['d_sae']}, error term {'on' if r['use_error_term'] else 'off'})"
                         for r in self.saes)
        lines = [f"SAEGainChange({self.with_saes.model.get('name')}: {saes})", f"  {self.definition}"]
        for l in range(self.n_layers):
            lines.append(f"  layer {l}: delta {s.mean[l]:+.4g} [{s.ci_low[l]:+.4g}, {s.ci_high[l]:+.4g}]")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return self.to_frame().to_html(index=False, float_format=lambda v: f"{v:.4g}")


def _require_sae_host(view: ModelView) -> None:
    model = view.model
    if not (hasattr(model, "add_sae") and hasattr(model, "_acts_to_saes")):
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
    model: Any,
    prompts: Sequence[str],
    *,
    saes: Any = None,
    use_error_term: bool | None = None,
    token_scope: str = DEFAULT_SCOPE,
    prepend_bos: bool | str = "host",
    batch_size: int = 8,
    level: float = 0.95,
    progress: bool | None = None,
) -> SAEGainChange:
    """How much SAEs spliced into the residual stream change the residual gain, per block.

    Args:
        model: SAELens ``HookedSAETransformer`` (TransformerLens 2.16.x / 3.x) or
            ``SAETransformerBridge`` (TransformerLens 3.x).
        prompts: list of prompt strings.
        saes: SAEs to compare (an SAE or a list), attached for the "with" run only and removed
            afterwards (SAEs already attached stay in both runs; HookedSAETransformer only); default
            ``None`` compares the SAEs attached now (``model.add_sae``) against the same SAEs with
            their error term added back (``SAE(x) + (x - SAE(x))``: the model's own stream up to
            float rounding, ~1e-7 relative), restoring each SAE's setting afterwards.
        use_error_term: for ``saes`` given here, attach them with this ``use_error_term`` (None: each
            SAE's own setting). With the error term the SAE's output equals its input up to
            rounding, so every delta is ~0: a check that nothing else changed.
        token_scope, prepend_bos, batch_size, level, progress: as in
            :func:`thermo_lens.gain.residual_gain` (both runs use the same settings and tokens).

    Returns:
        :class:`SAEGainChange` (``.to_frame()``, ``.plot()``).

    Raises:
        ThermoLensInputError: the model cannot hold SAEs; no SAE to compare; an SAE on a hook that
            is not a residual state of this model; an SAE whose ``d_in`` is not ``d_model``.
    """
    view = as_view(model)
    _require_sae_host(view)
    model = view.model
    kwargs = dict(token_scope=token_scope, prepend_bos=prepend_bos, batch_size=batch_size,
                  level=level, progress=progress)
    if saes is not None:
        if "Bridge" in type(model).__name__:
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
        without = residual_gain(view, prompts, **kwargs)  # type: ignore[arg-type]
        with model.saes(saes=sae_list, use_error_term=use_error_term):
            compared = [r for r in attached.sae_records(view.model)
                        if r["hook"] in {str(s.cfg.metadata.hook_name) for s in sae_list}]
            with_ = residual_gain(view, prompts, **kwargs)  # type: ignore[arg-type]
    else:
        records = attached.sae_records(view.model)
        if not records:
            raise ThermoLensInputError(
                f"no SAE is attached to {view.name}: attach one (model.add_sae(sae)) or pass saes=[...]")
        for r in records:
            _check_sae(view, r["hook"], r["d_in"], "the attached SAE")
        compared = records
        with_ = residual_gain(view, prompts, **kwargs)  # type: ignore[arg-type]
        # The baseline runs the same SAEs with their error term added back: SAE(x) + (x - SAE(x))
        # is the model's own stream up to float rounding (~1e-7 relative). Detaching and
        # re-attaching is avoided: on SAETransformerBridge a reset hook point stops firing.
        wrappers = [w for w in model._acts_to_saes.values() if hasattr(w, "use_error_term")]
        before = [w.use_error_term for w in wrappers]
        try:
            for w in wrappers:
                w.use_error_term = True
            without = residual_gain(view, prompts, **kwargs)  # type: ignore[arg-type]
        finally:
            for w, b in zip(wrappers, before):
                w.use_error_term = b
    delta: Float[Tensor, "prompt layer"] = (with_.block_gain.double() - without.block_gain.double()).float()
    return SAEGainChange(
        with_saes=with_, without_saes=without, delta=delta,
        delta_summary=summarize(delta, level=level), saes=tuple(compared), level=float(level),
    )
