"""Head ablation: how a layer's block gain changes when each of its heads is zero-ablated.

For block ``layer`` (0-based, ``blocks.{layer}``) and head ``h``, the ablated run zeroes the head's
output ``z_h`` (``blocks.{layer}.attn.hook_z[:, :, h] = 0``, every position) and measures the block
gain ``||resid_post_layer|| / ||resid_pre_layer||`` (``thermo_lens.definitions`` §1, in the run's
token scope) and the last block's gain ``G_L``. The effect is the per-prompt paired difference
``G(ablated) - G(clean)``, with its mean, t-CI and paired t-test per head.

The baseline and the ablated copies run as rows of the same batches (the prompts repeated once per
head, each copy ablating its own head), so all heads cost ``ceil(P (H + 1) / max_batch)`` forward
passes instead of ``H + 1``; right padding keeps every row equal to its own unbatched run.

Not the attribution: :func:`thermo_lens.gain_attribution`'s head term is the head's Shapley-style
share of the squared-norm change (cross terms split half and half), while an ablation effect also
counts everything downstream that depends on the head. The two can disagree in sign.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, Unpack

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from thermo_lens._lazy import pandas as pd
from thermo_lens._lazy import scipy_stats
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.measures.gain import DEFAULT_SCOPE, GainResult, residual_norms
from thermo_lens.core.inputs import Prompts, as_prompts
from thermo_lens.core.model import as_view
from thermo_lens.core.passes.stacked import StackedRows, run_stacked
from thermo_lens.core.provenance import Provenance, ProvenanceFields
from thermo_lens.core.registry import Metric, register_metric
from thermo_lens.core.result import Result
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.stats import SummaryStats, summarize
from thermo_lens.core.tokens import TokenScope
from thermo_lens.core.validate import validates_own_inputs

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel
    from thermo_lens.core.model import ModelView

__all__ = ["HeadAblation", "head_ablation"]

register_metric(Metric(
    "delta_block_gain", symbol="Delta G", formula="change in block layer's gain ||resid_post_layer|| / "
    "||resid_pre_layer|| when the head's output z is zero-ablated (blocks.{layer}.attn.hook_z[:, :, h] = 0), "
    "per prompt (ablated minus clean)", shape="prompt head", result="HeadAblation", section="gain", unit="ratio",
    attr="delta", panel=True))
register_metric(Metric(
    "delta_last_block_gain", symbol="Delta G_L", formula="change in the last block's gain G_L when the head of "
    "block layer is zero-ablated, per prompt (ablated minus clean)", shape="prompt head", result="HeadAblation",
    section="gain", unit="ratio", attr="delta_last"))


@dataclass(frozen=True, repr=False, eq=False)
class HeadAblation(ProvenanceFields, Result):
    """Block gains with each head of one layer zero-ablated, against the clean run.

    Attributes:
        layer: the block whose heads are ablated (0-based).
        heads: ``[head]`` the ablated heads, in the order of the columns below.
        block_gain: ``Float[Tensor, "prompt head"]`` block ``layer``'s gain with head ``heads[j]``
            ablated (float64).
        baseline: ``Float[Tensor, " prompt"]`` its clean gain.
        last_block_gain: ``Float[Tensor, "prompt head"]`` the last block's gain ``G_L`` with the
            head ablated; ``baseline_last`` ``[prompt]`` clean.
        token_scope: the gains' token scope.
        provenance: prompts, lengths, BOS mode, model metadata and the user hooks of the run (they
            run in every copy, before the ablation).
        level: confidence level of the CIs.
    """

    layer: int
    heads: tuple[int, ...]
    block_gain: Float[Tensor, "prompt head"]
    baseline: Float[Tensor, " prompt"]
    last_block_gain: Float[Tensor, "prompt head"]
    baseline_last: Float[Tensor, " prompt"]
    token_scope: str
    provenance: Provenance
    level: float = 0.95

    def __post_init__(self) -> None:
        P, H = self.block_gain.shape
        if tuple(self.last_block_gain.shape) != (P, H) or self.baseline.shape[0] != P or len(self.heads) != H:
            raise ValueError("HeadAblation: block_gain, last_block_gain, baseline and heads disagree in shape")

    @property
    def delta(self) -> Float[Tensor, "prompt head"]:
        """Ablated minus clean block gain, per prompt and head."""
        return self.block_gain - self.baseline[:, None]

    @property
    def delta_last(self) -> Float[Tensor, "prompt head"]:
        """Ablated minus clean last-block gain ``G_L``, per prompt and head."""
        return self.last_block_gain - self.baseline_last[:, None]

    def stats(self, which: str = "block") -> SummaryStats:
        """Per head: mean, SD (ddof=1), SE and t-CI of the paired difference (``which``: ``"block"``
        for block ``layer``'s gain, ``"last"`` for ``G_L``)."""
        d = self.delta if which == "block" else self.delta_last
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return summarize(d, level=self.level)

    def pvalue(self, which: str = "block") -> np.ndarray:
        """Two-sided paired t-test per head (NaN with fewer than 2 prompts or no variance)."""
        d = (self.delta if which == "block" else self.delta_last).double().numpy()
        n = d.shape[0]
        if n < 2:
            return np.full(d.shape[1], np.nan)
        sd = d.std(axis=0, ddof=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = d.mean(axis=0) / (sd / np.sqrt(n))
        p = 2 * scipy_stats.t.sf(np.abs(t), df=n - 1)
        return np.where(sd > 0, p, np.nan)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``head, block_gain`` (ablated, mean over prompts), ``baseline``,
        ``delta_block_gain`` with ``ci_low, ci_high, pvalue``, ``delta_last_block_gain``, ``n_prompts``
        and the definition columns (``layer, token_scope``, model, BOS, hooks ...)."""
        s, s_last = self.stats("block"), self.stats("last")
        df = pd.DataFrame({
            "head": list(self.heads),
            "block_gain": self.block_gain.mean(0).numpy(),
            "baseline": np.full(len(self.heads), float(self.baseline.mean())),
            "delta_block_gain": np.asarray(s.mean, dtype=np.float64),
            "ci_low": np.asarray(s.ci_low, dtype=np.float64), "ci_high": np.asarray(s.ci_high, dtype=np.float64),
            "pvalue": self.pvalue("block"),
            "delta_last_block_gain": np.asarray(s_last.mean, dtype=np.float64),
            "n_prompts": int(self.block_gain.shape[0]),
        })
        df["layer"], df["token_scope"] = int(self.layer), self.token_scope
        for k, v in self.provenance.columns().items():
            df[k] = v
        return df

    def __repr__(self) -> str:
        s = self.stats("block")
        lines = [f"HeadAblation({self.model.get('name')}: block {self.layer}, zero-ablating hook_z of heads "
                 f"{list(self.heads)}; {self.block_gain.shape[0]} prompts, token_scope={self.token_scope!r}, "
                 f"prepend_bos={self.prepend_bos!r})",
                 f"  clean block gain {float(self.baseline.mean()):.4g}; per head: ablated - clean, "
                 f"{100 * self.level:g}% t-CI, paired t-test p"]
        p = self.pvalue("block")
        for j, h in enumerate(self.heads):
            lines.append(f"  head {h}: {float(np.asarray(s.mean)[j]):+.4g} [{float(np.asarray(s.ci_low)[j]):+.4g}, "
                         f"{float(np.asarray(s.ci_high)[j]):+.4g}] "
                         f"p={p[j]:.3g}")
        lines.append(f"  hooks: {self.provenance.hooks_text}")
        return "\n".join(lines)


def _zero_head(head: int | None, copy: int, n_heads: int):
    """Edit zeroing head ``head`` (every position) in the rows of stacked copy ``copy``."""
    def edit(z: Tensor, rows: StackedRows) -> None:
        if z.ndim == 3:  # [batch, pos, head * d_head]
            z4 = z.view(z.shape[0], z.shape[1], n_heads, -1)
        elif z.ndim == 4:  # [batch, pos, head, d_head]
            z4 = z
        else:
            raise RuntimeError(f"unexpected hook_z shape {tuple(z.shape)}")
        mine = rows.of_copy(copy)
        if head is not None and mine:
            z4[mine[0]:mine[-1] + 1, :, head] = 0.0  # (a copy's rows are contiguous: whole copies per pass)
    return edit


@validates_own_inputs
def head_ablation(
    model: TransformerLensModel | ModelView,
    prompts: Prompts,
    layer: int,
    *,
    heads: Sequence[int] | None = None,
    token_scope: TokenScope = DEFAULT_SCOPE,
    max_batch: int = 64,
    level: float = 0.95,
    settings: RunSettings | None = None,
    **run: Unpack[RunOptions],
) -> HeadAblation:
    """Zero-ablate each head of block ``layer`` in turn and measure the change in its gain.

    Args:
        model, prompts: as for :func:`thermo_lens.residual_gain`.
        layer: the block whose heads are ablated (0-based; negative from the end).
        heads: heads to ablate (default all; negative from the end).
        token_scope: the gains' token scope (default ``"all_but_first"``).
        max_batch: rows per forward pass (default ``64``): the clean copy and one copy per head are
            stacked along the batch.
        level: confidence level of the CIs (default ``0.95``).
        settings, **run: run options (``prepend_bos``, ``truncate``, ``fwd_hooks``: your hooks run
            first in every copy and see ``hook.ctx["batch"].prompt_index`` as indices into *your*
            prompt list).

    Returns:
        :class:`HeadAblation` (``.to_frame()``: one row per head).
    """
    from thermo_lens.core import validate

    view = as_view(model)
    settings = RunSettings.resolve(settings, **run)
    validate.token_scope(token_scope)
    max_batch = validate.positive_int("max_batch", max_batch)
    ps = as_prompts(prompts, tokenizer=view.tokenizer, vocab_size=view.d_vocab)
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not -view.n_layers <= layer < view.n_layers:
        raise ThermoLensInputError(f"layer must be an int in 0..{view.n_layers - 1} (negative from the end), got {layer!r}")
    layer = int(layer) % view.n_layers
    chosen = list(range(view.n_heads)) if heads is None else list(heads)
    bad = [h for h in chosen if isinstance(h, bool) or not isinstance(h, (int, np.integer))
           or not -view.n_heads <= h < view.n_heads]
    if bad or not chosen:
        raise ThermoLensInputError(f"heads must be ints in 0..{view.n_heads - 1} (negative from the end), got {heads!r}")
    chosen = [int(h) % view.n_heads for h in chosen]
    P = len(ps)
    copies: list[int | None] = [None] + chosen  # None = the clean baseline
    hook_name = f"blocks.{layer}.attn.hook_z"
    need = 2 if token_scope == "all_but_first" else 1
    # the clean copy and one copy per head, stacked along the batch (whole copies per pass)
    got = run_stacked(view, ps, len(copies), [(hook_name, _zero_head(h, c, view.n_heads)) for c, h in enumerate(copies)],
                      [residual_norms], settings, max_batch, min_tokens=need)
    g = GainResult.from_collected(got, token_scope)
    bg = g.block_gain[:, layer].double()
    lg = torch.as_tensor(np.asarray(g.last_block_gain.values, dtype=np.float64))
    block: dict[int | None, Tensor] = {}
    last: dict[int | None, Tensor] = {}
    for j, h in enumerate(copies):
        block[h], last[h] = bg[j * P:(j + 1) * P], lg[j * P:(j + 1) * P]
    provenance = g.provenance.select(torch.arange(P))
    return HeadAblation(
        layer=layer, heads=tuple(chosen),
        block_gain=torch.stack([block[h] for h in chosen], dim=1), baseline=block[None],
        last_block_gain=torch.stack([last[h] for h in chosen], dim=1), baseline_last=last[None],
        token_scope=token_scope, provenance=provenance, level=float(level))
