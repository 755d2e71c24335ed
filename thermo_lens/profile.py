"""The whole battery in one pass: :func:`profile` -> :class:`ThermoProfile`.

One forward pass per prompt batch records every in-hook reduction at once (residual norms,
anisotropy sums, the attention diagonal); the gain, anisotropy, sheaf traces and L* are then
derived from that single pass, and the spectral signature from the weights. The profile carries
the model's metadata (name, lab / family if given, geometry, dtype, BOS mode, raw or processed
weights) and round-trips exactly through JSON, so a study can store one file per model.

Definitions: ``thermo_lens.definitions`` §1-4; D'Elia (2026), *Thermodynamic Constraints in Transformer
Architectures*.
"""

from __future__ import annotations

import datetime as _dt
import functools
import warnings
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
from thermo_lens._lazy import pandas as pd

from thermo_lens.anisotropy import AnisotropyResult, anisotropy_from_collected
from thermo_lens import registry
from thermo_lens.attribution import GainAttribution
from thermo_lens.depth import LStarResult, l_star_from_traces
from thermo_lens.gain import DEFAULT_REGIME_BY, GainResult, collect_for_scope, gain_from_collected
from thermo_lens.anisotropy import anisotropy
from thermo_lens.sheaf.traces import attention_diagonal
from thermo_lens.gain import residual_norms
from thermo_lens.model import as_view
from thermo_lens.errors import ThermoLensInputError
from thermo_lens.result import Result
from thermo_lens.sheaf import SheafTraces, traces_from_collected
from thermo_lens.spectral import SpectralSignature, spectral_signature

__all__ = ["ThermoProfile", "profile", "profiles_frame"]


@functools.lru_cache(maxsize=1)
def _versions_cached() -> tuple[tuple[str, str], ...]:
    return tuple(_versions_uncached().items())


def _versions() -> dict[str, str]:
    """Library versions (looked up once per process: package metadata reads cost ~10 ms)."""
    return dict(_versions_cached())


def _versions_uncached() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out: dict[str, str] = {"torch": str(torch.__version__)}
    for pkg in ("transformer-lens", "transformers", "thermo-lens"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:  # pragma: no cover - running from a source tree
            out[pkg] = "unknown"
    return out


@dataclass(frozen=True, repr=False)
class ThermoProfile(Result):
    """Every thermo-lens measurement of one model on one prompt set.

    Attributes:
        meta: name, lab, family, twin_of, source, geometry (``n_layers``, ``n_heads``,
            ``n_kv_heads``, ``d_model``, ``d_head``, ``rho = n_heads / d_head``), norm placement,
            ``post_ln``, ``parallel_attn``, ``weights`` (raw / processed), ``dtype``,
            ``prepend_bos`` (the BOS mode used: ``"host"`` as it resolved) and
            ``prepend_bos_requested`` (the mode asked for), ``token_scope``, ``prompt_set``,
            ``n_prompts``, library versions, creation time.
        gain: :class:`~thermo_lens.gain.GainResult` (block gains, named summaries, regime).
        anisotropy: :class:`~thermo_lens.anisotropy.AnisotropyResult` per residual state.
        spectral: :class:`~thermo_lens.spectral.SpectralSignature` (``[layer, head]`` norms).
        sheaf: :class:`~thermo_lens.sheaf.SheafTraces` (``[prompt, layer, head]`` traces).
        l_star: :class:`~thermo_lens.depth.LStarResult` (empirical vs predicted L*).
        attribution: :class:`~thermo_lens.attribution.GainAttribution` (``[prompt, layer, head]``
            shares of each block's squared-norm change), None for post-LN models.
    """

    meta: dict[str, Any]
    gain: GainResult
    anisotropy: AnisotropyResult
    spectral: SpectralSignature
    sheaf: SheafTraces
    l_star: LStarResult
    attribution: GainAttribution | None = None

    @property
    def name(self) -> str:
        return str(self.meta.get("name"))

    def to_row(self) -> dict[str, Any]:
        """One summary row (the per-model table :mod:`thermo_lens.laws` takes).

        ``gain`` is the summary named by ``gain_by`` (the one that decided the regime), with its
        95% CI; the other named gain summaries are their own columns.
        """
        m, g, s = self.meta, self.gain, self.spectral
        head = g.summaries[g.regime_by]
        row: dict[str, Any] = {
            "model": m.get("name"), "lab": m.get("lab"), "family": m.get("family"),
            "twin_of": m.get("twin_of"), "source": m.get("source"),
            "n_layers": m["n_layers"], "n_heads": m["n_heads"], "n_kv_heads": m["n_kv_heads"],
            "d_model": m["d_model"], "d_head": m["d_head"], "rho": m["rho"],
            "gain": float(head.mean), "gain_sd": float(head.sd), "gain_se": float(head.se),
            "gain_ci_low": float(head.ci_low), "gain_ci_high": float(head.ci_high),
            "gain_by": g.regime_by, "regime": g.regime, "n_prompts": g.n_prompts,
        }
        for name, summ in g.summaries.items():
            row[name] = float(summ.mean)
        # Every spectral metric registered for the model row: its mean over layers (and heads).
        for metric in registry.metrics(result="SpectralSignature", load=False):
            t = metric.values(s) if metric.row and metric.name in s.definitions else None
            if metric.row:
                row[metric.row] = float(t.double().nanmean()) if t is not None else None
        row.update({
            "mean_trace": float(self.sheaf.mean_layer_trace.mean()),
            "l_star": float(self.l_star.empirical), "l_star_predicted": float(self.l_star.predicted),
            "anisotropy_last": float(np.nanmean(self.anisotropy.values[:, -1].numpy())),
            "post_ln": bool(m["post_ln"]), "parallel_attn": bool(m["parallel_attn"]),
            "weights": m["weights"], "dtype": m["dtype"], "prepend_bos": m["prepend_bos"],
            "token_scope": m["token_scope"], "prompt_set": m.get("prompt_set"),
        })
        return row

    def to_frame(self) -> pd.DataFrame:
        """The :meth:`to_row` summary as a one-row DataFrame."""
        return pd.DataFrame([self.to_row()])

    def __repr__(self) -> str:
        m, g = self.meta, self.gain
        head = g.summaries[g.regime_by]
        flags = [f"weights {m['weights']}", m["dtype"], f"BOS={m['prepend_bos']}"]
        if m["post_ln"]:
            flags.append("POST-LN: gain bounded by LayerNorm weights")
        lab = f" [{m['lab']}]" if m.get("lab") else ""
        return "\n".join([
            f"ThermoProfile {m.get('name')}{lab}: L={m['n_layers']}, H={m['n_heads']}, "
            f"d_head={m['d_head']}, rho={m['rho']:.4g}; {m['n_prompts']} prompts ({m.get('prompt_set')}), "
            f"token scope {m['token_scope']}; " + ", ".join(flags),
            f"  regime {g.regime} by {g.regime_by}: {head.mean:.4f} "
            f"[{head.ci_low:.4f}, {head.ci_high:.4f}] 95% CI",
            "  gains: " + ", ".join(f"{k} {v.mean:.4f}" for k, v in g.summaries.items()),
            f"  spectral: mean ||W_V||_2 {float(self.spectral.W_V_norm.mean()):.4g}, "
            f"||W_O||_2 {float(self.spectral.W_O_norm.mean()):.4g}, "
            f"ratio {float(self.spectral.ratio.mean()):.4g}, OV {float(self.spectral.ov_norm.mean()):.4g}",
            f"  sheaf: mean layer trace {float(self.sheaf.mean_layer_trace.mean()):.5g}; "
            f"L* {self.l_star.empirical:.3g} empirical ({self.l_star.variant}) vs {self.l_star.predicted:.3g} predicted",
            f"  hooks: {m.get('hooks') or 'none (clean run)'}",
        ])


def profile(
    model: Any,
    prompts: Any = "paper25",
    *,
    token_scope: str = "all_but_first",
    regime_by: str = DEFAULT_REGIME_BY,
    l_star_variant: str = "argmax_abs_gradient",
    attribution: bool = True,
    name: Any = None,
    lab: Any = None,
    family: Any = None,
    twin_of: Any = None,
    source: Any = None,
    settings: Any = None,
    **run: Any,
) -> ThermoProfile:
    """Profile ``model``: gain, anisotropy, spectral signature, sheaf traces, L* and the per-head
    gain attribution.

    One forward pass per batch of prompts feeds every activation-based metric. The pass ends
    after the last block (no final norm, no unembedding: nothing here reads the logits) unless a
    ``fwd_hooks`` entry targets a point past the blocks. Its cost, measured by
    ``benchmarks/profile.py``: below a bare ``run_with_hooks(return_type=None)`` of the same
    batches on ``TransformerBridge`` at GPT-2 / LLaMA vocabulary sizes (that bare pass computes the
    logits); against a bare pass that also ends at the last block, the reductions add 3-6%, and
    the attribution 8-12% more (``attribution=False`` skips it). The first profile of a model adds
    the spectral signature (cached per weights fingerprint afterwards).

    Args:
        model: a TransformerLens model (``TransformerBridge``; legacy ``HookedTransformer``) or a
            :class:`~thermo_lens.model.ModelView`.
        prompts: a prompt-set name (``thermo_lens.prompts.names()``), a
            :class:`~thermo_lens.prompts.PromptSet`, a list of strings, a string,
            ``{category: [...]}`` or token ids (:func:`thermo_lens.inputs.as_prompts`).
        token_scope: the gain's token scope (``all_but_first``, ``last``, ``all``, ``frobenius``);
            the attribution uses the same scope (``all`` for ``frobenius``).
        regime_by: the gain summary whose 95% CI decides the regime.
        l_star_variant: empirical L* rule (:mod:`thermo_lens.depth`).
        attribution: also compute :func:`thermo_lens.gain_attribution` in the same pass
            (``None``, with the reason in ``meta["attribution_skipped"]``, for post-LN models and
            blocks whose output is not the sum of their components; a warning says so).
        name, lab, family, twin_of, source: metadata recorded in ``meta`` (name defaults to the
            model's ``cfg.model_name``).
        settings, **run: run options (:class:`thermo_lens.RunSettings`): ``prepend_bos``,
            ``batch_size``, ``truncate``, ``fwd_hooks`` (e.g. an ablation; recorded in ``meta["hooks"]``
            and every sub-result), ``progress``, ``sort_by_length``.
    """
    from thermo_lens.attribution import attribution_from_collected, attribution_terms
    from thermo_lens.inputs import as_prompts
    from thermo_lens.settings import RunSettings

    from thermo_lens import validate

    for key, value in (("name", name), ("lab", lab), ("family", family), ("twin_of", twin_of), ("source", source)):
        validate.optional_text(key, value)
    validate.token_scope(token_scope)
    view = as_view(model)
    settings = RunSettings.resolve(settings, **run)
    ps = as_prompts(prompts, tokenizer=view.tokenizer, vocab_size=view.d_vocab)
    attr_scope = "all" if token_scope == "frobenius" else token_scope
    with_attr = bool(attribution) and not view.post_ln
    reductions = [residual_norms, anisotropy, attention_diagonal]
    if with_attr:
        reductions.append(attribution_terms(attr_scope))
    collected = collect_for_scope(view, ps, reductions, token_scope, settings)
    gain = gain_from_collected(collected, token_scope, regime_by=regime_by)
    aniso = anisotropy_from_collected(collected)
    spectral = spectral_signature(view)
    traces = traces_from_collected(collected, W_V=view.W_V())
    l_star = l_star_from_traces(traces, variant=l_star_variant)
    attr, attr_note = None, ("post-LN model: no exact per-head split" if view.post_ln else
                             "not requested" if not attribution else None)
    if with_attr:
        try:
            attr = attribution_from_collected(collected, attr_scope)
        except ThermoLensInputError as e:  # an optional metric must not cost the model's profile
            attr_note = str(e)
            warnings.warn(f"profile: gain attribution skipped: {e}", UserWarning, stacklevel=2)
    meta = dict(view.metadata())
    meta.update(
        name=name or view.name, lab=lab, family=family, twin_of=twin_of, source=source or view.name,
        prepend_bos=collected.prepend_bos, prepend_bos_requested=settings.prepend_bos,
        token_scope=token_scope, prompt_set=ps.name,
        n_prompts=len(ps), categories=list(ps.categories), hooks=gain.provenance.hooks_text,
        batch_size=settings.batch_size, attribution_skipped=attr_note, versions=_versions(),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    return ThermoProfile(meta=meta, gain=gain, anisotropy=aniso, spectral=spectral, sheaf=traces, l_star=l_star,
                         attribution=attr)


def profiles_frame(profiles: Iterable[ThermoProfile]) -> pd.DataFrame:
    """One row per profile (:meth:`ThermoProfile.to_row`): the table :mod:`thermo_lens.laws` takes."""
    rows = [p.to_row() for p in profiles]
    if not rows:
        raise ValueError("no profiles given")
    return pd.DataFrame(rows)
