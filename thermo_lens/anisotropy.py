"""Anisotropy profile: how aligned the token states of the residual stream are, layer by layer.

Definition (D'Elia 2026, "Thermodynamic Constraints in Transformer Architectures", appendix C,
no code released; METHODS.md section 1): for residual state ``x_l`` (``l = 0..L``, the same hook
states as the gain, final norm excluded) of one prompt with real tokens ``t = 1..n-1`` (position 0,
the BOS/first token, excluded; padding excluded), the **mean pairwise cosine similarity**

    ``a_l = mean_{i != j} cos(x_l[i], x_l[j])``

over the ``m = n - 1`` remaining tokens. It is computed inside the forward hook from unit vectors
``u_t`` as ``(||sum_t u_t||^2 - m) / (m (m - 1))``, in float32, without a ``pos x pos`` matrix
(:func:`thermo_lens.hooks.anisotropy`). 1 means all tokens point the same way; about 0 means
isotropic.

A prompt needs at least 3 real tokens (2 after position 0) for a pair; shorter prompts give NaN for
that prompt (documented, not an error) and are left out of the across-prompt mean, whose ``n``
then says how many prompts it holds.

Use :func:`anisotropy_profile` in a notebook, or :func:`anisotropy_from_collected` to derive it from
the same :func:`thermo_lens.hooks.collect` pass as the gain (``collect(..., [residual_norms,
anisotropy])``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens.hooks import Collected, anisotropy, collect
from thermo_lens.model import ModelView, ThermoLensInputError, as_view
from thermo_lens.result import Result
from thermo_lens.stats import SummaryStats, summarize

__all__ = ["AnisotropyResult", "anisotropy_profile", "anisotropy_from_collected", "DEFINITION"]

DEFINITION = (
    "mean pairwise cosine similarity of the token states x_l[t], t = 1..n-1 (position 0 and padding "
    "excluded), per residual state x_0..x_L (final norm excluded); NaN for prompts with < 3 tokens"
)


@dataclass(frozen=True, repr=False, eq=False)
class AnisotropyResult(Result):
    """Anisotropy per prompt and residual state, and its across-prompt summary.

    Attributes:
        values: ``Float[Tensor, "prompt state"]`` float32, ``a_l`` for ``x_0..x_L`` (``L + 1``
            states); NaN for a prompt with fewer than 3 real tokens.
        summary: per state across prompts (NaN prompts omitted): ``mean``, ``sd`` (ddof=1),
            ``se``, CI, ``n`` as arrays of length ``L + 1``.
        prompts, lengths, truncated, prepend_bos: what was measured (lengths include BOS).
        dtype, weights, post_ln, model: the model's compute dtype (reduction in float32), raw or
            processed weights, post-LN flag, metadata.
        definition: the definition above.
    """

    values: Tensor
    summary: SummaryStats
    prompts: tuple[str, ...]
    lengths: Tensor
    truncated: tuple[bool, ...]
    prepend_bos: Any
    dtype: str
    weights: str
    post_ln: bool
    model: dict[str, Any]
    definition: str = DEFINITION

    @property
    def mean(self) -> Float[Tensor, "state"]:
        """Across-prompt mean per residual state ``x_0..x_L`` (NaN prompts omitted)."""
        return torch.as_tensor(np.asarray(self.summary.mean), dtype=torch.float32)

    @property
    def n_prompts(self) -> int:
        return int(self.values.shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.values.shape[1]) - 1

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame, one row per (prompt, state): ``prompt, state`` (0..L, ``x_state``),
        ``hook``, ``anisotropy``, ``n_tokens`` and the definition columns."""
        P, S = self.values.shape
        hooks = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.hook_resid_post" for l in range(S - 1)]
        df = pd.DataFrame({
            "prompt": np.repeat(np.arange(P), S),
            "state": np.tile(np.arange(S), P),
            "hook": hooks * P,
            "anisotropy": self.values.numpy().astype(np.float64).reshape(-1),
            "n_tokens": np.repeat(self.lengths.numpy(), S),
        })
        for k, v in {"model": self.model.get("name"), "prepend_bos": str(self.prepend_bos),
                     "dtype": self.dtype, "weights": self.weights, "post_ln": self.post_ln}.items():
            df[k] = v
        return df

    def summary_frame(self) -> pd.DataFrame:
        """One row per state: ``state, mean, sd (ddof=1), se, ci_low, ci_high, n``."""
        s = self.summary
        return pd.DataFrame({"state": np.arange(self.n_layers + 1), "mean": s.mean, "sd": s.sd,
                             "se": s.se, "ci_low": s.ci_low, "ci_high": s.ci_high, "n": s.n})

    def __repr__(self) -> str:
        m = np.asarray(self.summary.mean)
        shown = " ".join(f"{v:.3g}" for v in m[:13]) + (" ..." if m.size > 13 else "")
        nan_prompts = int(torch.isnan(self.values).any(dim=1).sum())
        lines = [
            f"AnisotropyResult({self.model.get('name')}: L={self.n_layers}, {self.n_prompts} prompt(s), "
            f"prepend_bos={self.prepend_bos!r}, {self.dtype}, {self.weights} weights"
            f"{', post-LN' if self.post_ln else ''})",
            f"  definition: {self.definition}",
            f"  mean a_l, l=0..{self.n_layers}: {shown}",
        ]
        if nan_prompts:
            lines.append(f"  note: {nan_prompts} prompt(s) too short (< 3 tokens) are NaN and left out")
        return "\n".join(lines)


def anisotropy_from_collected(collected: Collected, *, level: float = 0.95) -> AnisotropyResult:
    """The :class:`AnisotropyResult` of a :func:`~thermo_lens.hooks.collect` pass that included the
    :func:`~thermo_lens.hooks.anisotropy` reduction. Pure: no forward pass."""
    if not isinstance(collected, Collected):
        raise ThermoLensInputError(
            f"anisotropy_from_collected expects a thermo_lens.hooks.Collected, got "
            f"{type(collected).__name__}; use anisotropy_profile(model, prompts) to run the model"
        )
    try:
        vals = collected.stack("anisotropy")  # [L+1, prompt]
    except KeyError:
        raise ThermoLensInputError(
            "this Collected has no anisotropy: run collect(model, prompts, [anisotropy, ...])"
        ) from None
    values = vals.T.contiguous().float()
    view: ModelView = collected.view
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        summary = summarize(values, level=level, nan_policy="omit")
    return AnisotropyResult(
        values=values,
        summary=summary,
        prompts=tuple(collected.prompts),
        lengths=collected.lengths.to(torch.long).clone(),
        truncated=tuple(bool(t) for t in collected.truncated),
        prepend_bos=collected.prepend_bos,
        dtype=str(view.dtype).replace("torch.", ""),
        weights=view.weight_state,
        post_ln=bool(view.post_ln),
        model=view.metadata(),
    )


def anisotropy_profile(
    model: Any,
    prompts: Sequence[str],
    *,
    prepend_bos: bool | str = True,
    batch_size: int = 8,
    truncate: bool = False,
    level: float = 0.95,
    fwd_hooks: Sequence[tuple[str | Callable, Callable]] = (),
    progress: bool | None = None,
) -> AnisotropyResult:
    """Anisotropy of every residual state ``x_0..x_L`` of ``model`` on ``prompts`` (one pass).

    Args are as for :func:`thermo_lens.gain.residual_gain`. Prompts shorter than 3 tokens give
    NaN (see the module docstring); if every prompt is that short the result is all NaN and a
    warning says so.
    """
    view = as_view(model)
    collected = collect(view, prompts, [anisotropy], prepend_bos=prepend_bos, batch_size=batch_size,
                        truncate=truncate, fwd_hooks=fwd_hooks, progress=progress)
    res = anisotropy_from_collected(collected, level=level)
    if torch.isnan(res.values).all():
        warnings.warn("every prompt has fewer than 3 tokens: anisotropy (which excludes position 0 "
                      "and needs a pair of tokens) is NaN throughout", stacklevel=2)
    return res
