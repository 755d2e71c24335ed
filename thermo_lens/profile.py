"""The whole battery in one pass: :func:`profile` -> :class:`ThermoProfile`.

One forward pass per prompt batch records every in-hook reduction at once (residual norms,
anisotropy sums, the attention diagonal); the gain, anisotropy, sheaf traces and L* are then
derived from that single pass, and the spectral signature from the weights. The profile carries
the model's metadata (name, lab / family if given, geometry, dtype, BOS mode, raw or processed
weights) and round-trips exactly through JSON, so a study can store one file per model.

Definitions: METHODS.md sections 1-4; D'Elia (2026), *Thermodynamic Constraints in Transformer
Architectures*.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from thermo_lens.anisotropy import AnisotropyResult, anisotropy_from_collected
from thermo_lens.depth import LStarResult, l_star_from_traces
from thermo_lens.gain import DEFAULT_REGIME_BY, GainResult, collect_for_scope, gain_from_collected
from thermo_lens.hooks import anisotropy, attention_diagonal, residual_norms
from thermo_lens.model import as_view
from thermo_lens.result import Result
from thermo_lens.sheaf import SheafTraces, traces_from_collected
from thermo_lens.spectral import SpectralSignature, spectral_signature

__all__ = ["ThermoProfile", "profile", "profiles_frame"]


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out = {"torch": torch.__version__}
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
            ``prepend_bos``, ``token_scope``, ``prompt_set``, ``n_prompts``, library versions,
            creation time.
        gain: :class:`~thermo_lens.gain.GainResult` (block gains, named summaries, regime).
        anisotropy: :class:`~thermo_lens.anisotropy.AnisotropyResult` per residual state.
        spectral: :class:`~thermo_lens.spectral.SpectralSignature` (``[layer, head]`` norms).
        sheaf: :class:`~thermo_lens.sheaf.SheafTraces` (``[prompt, layer, head]`` traces).
        l_star: :class:`~thermo_lens.depth.LStarResult` (empirical vs predicted L*).
    """

    meta: dict[str, Any]
    gain: GainResult
    anisotropy: AnisotropyResult
    spectral: SpectralSignature
    sheaf: SheafTraces
    l_star: LStarResult

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
        row.update({
            "W_V_norm": float(s.W_V_norm.mean()), "W_O_norm": float(s.W_O_norm.mean()),
            "ratio": float(s.ratio.mean()), "ov_norm": float(s.ov_norm.mean()),
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
        ])


def profile(
    model: Any,
    prompts: Any = "paper25",
    *,
    prepend_bos: bool | str = True,
    token_scope: str = "all_but_first",
    batch_size: int = 8,
    truncate: bool = False,
    regime_by: str = DEFAULT_REGIME_BY,
    l_star_variant: str = "argmax_abs_gradient",
    fwd_hooks: Sequence[tuple[str | Callable, Callable]] = (),
    progress: bool | None = None,
    name: str | None = None,
    lab: str | None = None,
    family: str | None = None,
    twin_of: str | None = None,
    source: str | None = None,
) -> ThermoProfile:
    """Profile ``model``: gain, anisotropy, spectral signature, sheaf traces and L*.

    One forward pass per batch of ``batch_size`` prompts feeds every activation-based metric.

    Args:
        model: a TransformerLens model (``TransformerBridge``; legacy ``HookedTransformer``) or a
            :class:`~thermo_lens.model.ModelView`.
        prompts: a prompt-set name (``thermo_lens.prompts.names()``), a
            :class:`~thermo_lens.prompts.PromptSet`, a list of strings, or ``{category: [...]}``.
        prepend_bos: ``True``, ``False`` or ``"tokenizer"`` (the paper's HF-tokenizer protocol).
        token_scope: the gain's token scope (``all_but_first``, ``last``, ``all``, ``frobenius``).
        batch_size: prompts per forward pass.
        truncate: cut prompts longer than the context instead of raising.
        regime_by: the gain summary whose 95% CI decides the regime.
        l_star_variant: empirical L* rule (:mod:`thermo_lens.depth`).
        fwd_hooks: your own hooks, run in the same pass (e.g. an ablation).
        progress: progress bar over batches (default: when more than one batch).
        name, lab, family, twin_of, source: metadata recorded in ``meta`` (name defaults to the
            model's ``cfg.model_name``).
    """
    from thermo_lens import prompts as prompt_sets

    view = as_view(model)
    prompt_set = prompt_sets.as_prompt_set(prompts)
    collected = collect_for_scope(
        view, list(prompt_set.prompts), [residual_norms, anisotropy, attention_diagonal], token_scope,
        prepend_bos=prepend_bos, batch_size=batch_size, truncate=truncate, fwd_hooks=fwd_hooks,
        progress=progress,
    )
    gain = gain_from_collected(collected, token_scope, regime_by=regime_by)
    aniso = anisotropy_from_collected(collected)
    spectral = spectral_signature(view)
    traces = traces_from_collected(collected, W_V=view.W_V())
    l_star = l_star_from_traces(traces, variant=l_star_variant)
    meta = dict(view.metadata())
    meta.update(
        name=name or view.name, lab=lab, family=family, twin_of=twin_of, source=source or view.name,
        prepend_bos=prepend_bos, token_scope=token_scope, prompt_set=prompt_set.name,
        n_prompts=len(prompt_set), categories=list(prompt_set.categories),
        versions=_versions(),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    return ThermoProfile(meta=meta, gain=gain, anisotropy=aniso, spectral=spectral, sheaf=traces, l_star=l_star)


def profiles_frame(profiles: Iterable[ThermoProfile]) -> pd.DataFrame:
    """One row per profile (:meth:`ThermoProfile.to_row`): the table :mod:`thermo_lens.laws` takes."""
    rows = [p.to_row() for p in profiles]
    if not rows:
        raise ValueError("no profiles given")
    return pd.DataFrame(rows)
