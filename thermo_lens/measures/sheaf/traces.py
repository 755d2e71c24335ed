"""Sheaf Laplacian traces of every head on every prompt, from one forward pass."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Unpack

import numpy as np
from thermo_lens._lazy import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from thermo_lens.core import measure
from thermo_lens.core.inputs import Prompts
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.core.passes import Collected, Recorder
from thermo_lens.core.passes.cached import documents_cache
from thermo_lens.core.products import PerLayer, as_float32
from thermo_lens.core.tokens import TokenBatch
from thermo_lens.core.model import ModelView, as_view, kv_head_map
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.registry import (BuildContext, Measurement, Metric, Options, Probe, Readout, option,
                                  register_measurement, register_metric)
from thermo_lens.stats.paired import PairedMixin
from thermo_lens.core.provenance import Provenance, ProvenanceFields, fold_legacy_fields
from thermo_lens.core.result import Result
from thermo_lens.measures.sheaf.validation import _check_formula, _check_W_V
from thermo_lens.core.validate import validates_own_inputs

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

TRACE_DEFINITIONS = {
    "off_diagonal_mass": "Tr L = (n - sum_i A_ii) * ||W_V^h||_F^2  (sum over real tokens; "
                         "= Tr(delta^T delta), both conventions; with attention sinks, whose share of a row "
                         "goes to no token, (sum_ij A_ij - sum_i A_ii) * ||W_V^h||_F^2)",
    "paper_printed": "(sum_ij A_ij - n) * ||W_V^h||_F^2  (the paper's printed eq. 4; identically 0 "
                     "for softmax attention, up to float rounding)",
}
for _name, _symbol, _formula, _shape, _unit in (
    ("trace", "Tr L^(l,h)", "sheaf Laplacian trace of the head on the prompt under the traces' formula "
     "(default off_diagonal_mass: (n - sum_i A_ii) ||W_V^h||_F^2; paper_printed: (sum_ij A_ij - n) "
     "||W_V^h||_F^2, identically 0)", "prompt layer head", "squared weight norm x tokens"),
    ("off_diagonal_mass", "sum_i (1 - A_ii)", "off-diagonal attention mass sum_{i != j} A_ij over the real "
     "tokens of the prompt (= Tr M; = sum_i (1 - A_ii) for softmax rows, less with attention sinks, whose "
     "share of a row goes to no token)", "prompt layer head", "tokens"),
    ("attention_mass", "sum_ij A_ij", "total attention mass sum_{i,j} A_ij over the real tokens (= n for "
     "softmax attention)", "prompt layer head", "tokens"),
    ("W_V_frob_sq", "||W_V||_F^2", "squared Frobenius norm of the query head's value matrix (its KV head "
     "under GQA), float64", "layer head", "squared weight norm"),
):
    register_metric(Metric(_name, symbol=_symbol, formula=_formula, shape=_shape, result="SheafTraces",
                           section="sheaf", paper="D'Elia (2026), sec. 5" if _name == "trace" else "",
                           unit=_unit, row="mean_trace" if _name == "trace" else None,
                           # the mean over layers of the layer trace (sum over heads, mean over prompts)
                           row_reduce=(lambda t: float(t.double().sum(-1).mean())) if _name == "trace" else None,
                           summary_table=_name == "trace"))

_TOKEN_SCOPE = "all real tokens (every query position 0..n-1 of each prompt; padding excluded)"


def _diagonal(a: Tensor) -> Tensor:
    """``[batch, head, pos]`` float32 ``A_ii``, a new tensor (one op: the pattern is not kept alive);
    :func:`_diagonals` marks the padded query positions NaN for every layer at once."""
    return as_float32(torch.diagonal_copy(a, dim1=-2, dim2=-1))


def _diagonals(rec: Recorder, key: str, names: list[str], finish: Callable[[list[int], Tensor], None]) -> PerLayer:
    """Each layer's :func:`_diagonal`, kept for the batch; at the last layer the padded query positions
    are set to NaN and the real queries' finite entries counted for every layer at once
    (:meth:`Recorder.expect_finite_rows`: a real query's NaN/inf ``A_ii`` fails the pass when it ends),
    and ``finish(layers, diagonals)`` records them (``diagonals`` ``[layer, batch, head, pos]``, NaN on
    padded query positions)."""
    def done(layers: list[int], stacks: list[Tensor]) -> None:
        pad = rec.per_batch(("attn_pad", str(stacks[0].device)), lambda batch: rec.pad_mask(stacks[0].device)[:, None, :])
        d = stacks[0].masked_fill_(pad, float("nan"))  # (the stack is this function's own)
        rec.expect_finite_rows([names[l] for l in layers], d, rec.n_real() * d.shape[2])
        finish(layers, d)
    return PerLayer(rec, key, done)


def _masses(rec: Recorder) -> tuple[PerLayer, Any]:
    """Each layer's total attention mass over the real tokens: the per-layer hook's part and, at the
    last layer, the rest for every layer at once, recorded as ``("attn_mass", l)`` ``[batch, head]``."""
    def views(device: torch.device, dtype: torch.dtype, batch: TokenBatch) -> tuple[Tensor, Tensor, Tensor | None]:
        mask = rec.mask(device).to(dtype)  # once per batch, shared by every layer
        half = dtype not in (torch.float32, torch.float64)
        return mask[:, None, :, None], mask[:, None, :], mask[:, None, :, None] * mask[:, None, None, :] if half else None

    def finish(layers: list[int], stacks: list[Tensor]) -> None:
        mass = stacks[0]
        if mass.ndim == 5:  # [layer, batch, head, pos, 1] float32/64 row sums: sum_i m_i (row_i)
            row = rec.per_batch(("attn_mass", str(mass.device), mass.dtype),
                                functools.partial(views, mass.device, mass.dtype))[1]
            mass = (mass.squeeze(-1) * row).sum(dim=-1, dtype=torch.float32)
        rec.put_rows([("attn_mass", l) for l in layers], mass)

    per_layer = PerLayer(rec, "attn_mass", finish)

    def mass(a: Tensor, layer: int) -> None:
        col, row, pair = rec.per_batch(("attn_mass", str(a.device), a.dtype), functools.partial(views, a.device, a.dtype))
        if a.dtype in (torch.float32, torch.float64):
            # sum_i m_i sum_j A_ij m_j: a matrix-vector product per head, no [pos, pos] mask; the
            # masked sum over the rows is taken for every layer at once.
            per_layer.add(layer, torch.matmul(a, col))  # [batch, head, pos, 1]
        else:  # half precision: mask and reduce in float32 (a product would round each row sum)
            assert pair is not None
            per_layer.add(layer, (a * pair).sum(dim=(-1, -2), dtype=torch.float32))
    return per_layer, mass


def _pattern_hooks(view: ModelView, rec: Recorder, key: str, finish: Callable[[list[int], Tensor], None]) -> None:
    """At every layer's attention pattern hook: its diagonal (:func:`_diagonals`; ``finish`` records
    what the traces keep of it under ``key``) and its attention mass (:func:`_masses`)."""
    names = [view.pattern_hook_name(l) for l in range(view.n_layers)]
    diagonals = _diagonals(rec, key, names, finish)
    masses, mass = _masses(rec)
    for l, name in enumerate(names):
        def diag(a: Tensor, batch: TokenBatch, _l: int = l) -> None:
            diagonals.add(_l, _diagonal(a))

        def mass_of(a: Tensor, batch: TokenBatch, _l: int = l) -> None:
            mass(a, _l)

        rec.add(name, (key, l), diag)
        rec.add(name, ("attn_mass", l), mass_of)
    diagonals.close()
    masses.close()


def attention_diagonal(view: ModelView, rec: Recorder) -> None:
    """Per layer, the attention pattern's diagonal ``A_ii`` and each head's total mass.

    The sheaf Laplacian trace needs only ``sum_i (1 - A_ii)`` per head (``thermo_lens.definitions`` §3),
    so the ``pos x pos`` pattern is reduced to its diagonal inside the hook. Records
    ``("attn_diag", l)``: ``[batch, head, pos]`` float32 (NaN on padded query positions) and
    ``("attn_mass", l)``: ``[batch, head]``, ``sum_{i,j real} A_ij`` (equals the number of real
    tokens for softmax attention: the reason the paper's printed trace formula is zero).
    :func:`sheaf_traces` runs :func:`attention_diagonal_sums`, which keeps only the sums.
    """
    _pattern_hooks(view, rec, "attn_diag", lambda layers, d: rec.put_rows([("attn_diag", l) for l in layers], d))


def attention_diagonal_sums(view: ModelView, rec: Recorder) -> None:
    """What the sheaf traces need of each attention pattern, reduced over the positions inside the
    hook: no per-token array is kept (a pass over many prompts keeps a few numbers per prompt and
    head). Records ``("attn_off_diag", l)``: ``[batch, head]`` float64, ``sum_i (1 - A_ii)`` over the
    real query positions (with attention sinks, ``("attn_diag_sum", l)``, ``sum_i A_ii``, instead),
    and ``("attn_mass", l)`` as :func:`attention_diagonal` does. The sums are those
    :func:`traces_from_collected` forms from :func:`attention_diagonal`'s diagonal (float64, the
    same order), taken for every layer at once at the last layer's hook.
    """
    sinks = bool(getattr(view.layout, "attention_sinks", False))
    key = "attn_diag_sum" if sinks else "attn_off_diag"

    def sums(layers: list[int], d: Tensor) -> None:
        d = d.double()
        rec.put_rows([(key, l) for l in layers], torch.nansum(d if sinks else 1.0 - d, dim=-1))

    _pattern_hooks(view, rec, key, sums)


@dataclass(frozen=True, eq=False)
class SheafTraces(PairedMixin, ProvenanceFields, Result):
    """Sheaf Laplacian traces of every head on every prompt, from one forward pass.

    ``trace[p, l, h] = (n_p - sum_i A^{l,h}_ii) * ||W_V^{l,h}||_F^2`` (``formula="off_diagonal_mass"``,
    the trace of ``delta^T delta`` under either convention; ``thermo_lens.definitions`` §3), or the paper's
    printed ``(sum_ij A_ij - n_p) ||W_V||_F^2`` (``formula="paper_printed"``, identically 0 for
    softmax attention). Under GQA ``W_V^{l,h}`` is the KV head ``kv_head_of[h]`` of query head ``h``.

    Attributes:
        trace: ``[prompt, layer, head]`` float64, under ``formula``.
        off_diagonal_mass: ``[prompt, layer, head]`` ``sum_i (1 - A_ii)`` over real tokens.
        attention_mass: ``[prompt, layer, head]`` ``sum_{i,j} A_ij`` over real tokens (``= n``).
        W_V_frob_sq: ``[layer, head]`` ``||W_V||_F^2`` per query head (float64 from the weights).
        formula, definition: the formula's name and its text.
        token_scope: which positions enter the sums.
        provenance: :class:`~thermo_lens.core.provenance.Provenance`: prompts, real token counts
            (``.lengths``, also ``.n_tokens``; BOS included when prepended), truncation, BOS
            mode, :meth:`ModelView.metadata` (``.model``: name, dtype, weights raw/processed,
            post-LN, ...) and the user hooks of the run (``.hooks``).
    """

    trace: Float[Tensor, "prompt layer head"]
    off_diagonal_mass: Float[Tensor, "prompt layer head"]
    attention_mass: Float[Tensor, "prompt layer head"]
    W_V_frob_sq: Float[Tensor, "layer head"]
    formula: str
    definition: str
    token_scope: str
    provenance: Provenance

    @classmethod
    def from_collected(cls, collected: Collected, *, formula: str = "off_diagonal_mass",
                       W_V: Float[Tensor, "layer kv_head d_model d_head"] | None = None) -> "SheafTraces":
        """The traces of a :func:`thermo_lens.core.passes.collect` pass that ran
        :func:`attention_diagonal` (pure: no forward pass)."""
        return _traces_from_collected(collected, formula=formula, W_V=W_V)

    @property
    def n_tokens(self) -> Int[Tensor, " prompt"]:
        """``[prompt]`` real tokens (BOS included when prepended)."""
        return self.provenance.lengths

    @classmethod
    def _upgrade_fields(cls, fields: dict) -> dict:
        return fold_legacy_fields(fields, lengths_key="n_tokens")

    @property
    def layer_trace(self) -> Float[Tensor, "prompt layer"]:
        """Per prompt and layer, the sum over heads (the block-diagonal layer Laplacian's trace)."""
        return self.trace.sum(dim=-1)

    @property
    def mean_layer_trace(self) -> Float[Tensor, " layer"]:
        """``T_l``: layer trace averaged over prompts (the input of L*, ``thermo_lens.definitions`` §4)."""
        return self.layer_trace.mean(dim=0)

    @property
    def mean_trace(self) -> float:
        """Mean over layers of :attr:`mean_layer_trace`: the paper's "mean trace" per model
        (its "GPT-2 62,696 vs OPT-125m 2,368", over 4 prompts in float32)."""
        return float(self.mean_layer_trace.mean())

    def l_star(self, variant: str = "steepest_step") -> Any:
        """L* from these traces (:func:`thermo_lens.measures.depth.l_star_from_traces`; the default rule
        ``steepest_step``, with the paper's ``argmax_abs_gradient`` beside it)."""
        from thermo_lens.measures.depth import l_star_from_traces

        return l_star_from_traces(self, variant=variant)

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame: one row per (prompt, layer, head). ``prompt`` is the index in your prompt list
        and ``text`` the prompt, as in every per-prompt frame of the package (``prompt_index``, the
        same index, is kept for earlier code)."""
        P, L, H = self.trace.shape
        grid = np.meshgrid(np.arange(P), np.arange(L), np.arange(H), indexing="ij")
        p, l, h = (g.ravel() for g in grid)
        kv = kv_head_map(H, self.model.get("n_kv_heads")).numpy()
        return pd.DataFrame({
            "model": self.model.get("name"),
            "prompt": p,
            "text": np.asarray(self.prompts, dtype=object)[p],
            "prompt_index": p,
            "layer": l,
            "head": h,
            "kv_head": kv[h],
            "trace": self.trace.numpy().ravel(),
            "off_diagonal_mass": self.off_diagonal_mass.numpy().ravel(),
            "attention_mass": self.attention_mass.numpy().ravel(),
            "W_V_frob_sq": self.W_V_frob_sq.numpy()[l, h],
            "n_tokens": self.n_tokens.numpy()[p],
            "formula": self.formula,
            "token_scope": "all",
            "prepend_bos": self.prepend_bos,
            "weights": self.model.get("weights"),
            "dtype": self.model.get("dtype"),
            "post_ln": self.model.get("post_ln"),
            "hooks": self.provenance.hooks_text,
        })

    def __repr__(self) -> str:
        m = self.model
        lt = self.mean_layer_trace.tolist()
        shown = ", ".join(f"{v:.4g}" for v in lt[:12]) + (", ..." if len(lt) > 12 else "")
        flags = " post-LN" if m.get("post_ln") else ""
        return (
            f"SheafTraces({m.get('name')}: {self.n_prompts} prompts x {self.n_layers} layers x "
            f"{self.n_heads} heads; formula {self.formula!r}: {self.definition}; BOS={self.prepend_bos!r}, "
            f"weights {m.get('weights')}, {m.get('dtype')}{flags})\n"
            f"  mean layer trace T_l (sum over heads, mean over prompts): [{shown}]\n"
            f"  mean trace (mean over layers): {self.mean_trace:.6g}\n"
            f"  hooks: {self.provenance.hooks_text}"
        )


def _w_v_frob_sq(W_V: Tensor, view: ModelView) -> Tensor:
    """``[layer, head]`` ``||W_V||_F^2`` per query head, float64, one layer at a time."""
    W_V = _check_W_V(W_V, view)
    per_kv = torch.stack([W_V[l].double().pow(2).sum(dim=(-1, -2)) for l in range(W_V.shape[0])])
    return per_kv[:, view.kv_head_of]


def _traces_from_collected(
    collected: Collected,
    *,
    formula: str = "off_diagonal_mass",
    W_V: Float[Tensor, "layer kv_head d_model d_head"] | None = None,
) -> SheafTraces:
    """Pure part of :func:`sheaf_traces`: the traces from a pass that ran ``attention_diagonal``.

    Args:
        collected: from :func:`thermo_lens.core.passes.collect` with
            :func:`thermo_lens.measures.sheaf.traces.attention_diagonal` among its reductions (a profile runs one
            pass with every reduction and derives every metric from it).
        formula: ``"off_diagonal_mass"`` (default) or ``"paper_printed"`` (warns; see
            :func:`sheaf_traces`).
        W_V: ``[layer, kv_head, d_model, d_head]`` (default: ``collected.view.W_V()``).
    """
    return _traces(collected, _check_formula(formula, stacklevel=4), W_V=W_V)


#: The same as :meth:`SheafTraces.from_collected` (deprecated name, kept for one release; silent:
#: callers that treat every warning as an error keep working).
traces_from_collected = SheafTraces.from_collected


def _traces(collected: Collected, formula: str, W_V: Tensor | None) -> SheafTraces:
    view = collected.view
    view.warn_if_processed("||W_V||_F^2 and every sheaf trace differ from the raw model's", stacklevel=3)
    names = collected.recorder.names
    sinks = bool(getattr(view.layout, "attention_sinks", False))
    if "attn_mass" not in names or not names & {"attn_diag", "attn_off_diag", "attn_diag_sum"}:
        raise ThermoLensInputError(
            "this collection has no attention diagonal; run collect(...) with "
            "thermo_lens.measures.sheaf.traces.attention_diagonal_sums (or attention_diagonal) among the reductions"
        )
    mass = collected.stack("attn_mass").double()  # [L, P, H]
    n = collected.lengths.to(torch.float64)
    # sum_i (1 - A_ii) per prompt ([L, P, H]; exact 0 for a one-hot row): reduced in the hook
    # (attention_diagonal_sums), or here batch by batch from the per-token diagonal (never padded to
    # the longest prompt of the run, only within its batch).
    if sinks:
        # Attention sinks (GPT-OSS) take part of each row's mass to a key that is no token: the
        # rows over the tokens sum to less than 1, so sum_{i != j} A_ij = sum_ij A_ij - sum_i A_ii.
        off = mass - (collected.stack("attn_diag_sum") if "attn_diag_sum" in names
                      else collected.reduce("attn_diag", lambda d: torch.nansum(d.double(), dim=-1)))
    elif "attn_off_diag" in names:
        off = collected.stack("attn_off_diag")
    else:
        off = collected.reduce("attn_diag", lambda d: torch.nansum(1.0 - d.double(), dim=-1))
    wv2 = _w_v_frob_sq(view.W_V() if W_V is None else W_V, view)  # [L, H]
    if formula == "off_diagonal_mass":
        trace = off * wv2[:, None, :]
    else:
        trace = (mass - n[None, :, None]) * wv2[:, None, :]
    return SheafTraces(
        trace=trace.permute(1, 0, 2).contiguous(),
        off_diagonal_mass=off.permute(1, 0, 2).contiguous(),
        attention_mass=mass.permute(1, 0, 2).contiguous(),
        W_V_frob_sq=wv2,
        formula=formula,
        definition=TRACE_DEFINITIONS[formula],
        token_scope=_TOKEN_SCOPE,
        provenance=collected.provenance(),
    )


@dataclass(frozen=True)
class SheafOptions(Options):
    """The options of the sheaf traces (checked when made)."""

    formula: str = option("off_diagonal_mass", "'off_diagonal_mass' (the trace) or 'paper_printed' (the paper's eq. 4, "
                          "identically 0)", lambda v: _check_formula(v, stacklevel=6))


_SWEEP_SCOPE = "all real tokens (sheaf trace: every query position of each prompt)"


@dataclass(frozen=True)
class SheafTraceReadout(Readout):
    """Block ``<layer>``'s sheaf trace per prompt (formula ``off_diagonal_mass``), of one head or
    summed over heads, from one block's attention diagonal."""

    def reductions(self, m: Measurement) -> list[Any]:
        return [attention_diagonal]

    def values(self, collected: Any, probe: Probe, m: Measurement, row_name: Any) -> Tensor:
        view = collected.view
        mass = collected.stack("attn_mass")[0].double()  # [row, head]
        if getattr(view.layout, "attention_sinks", False):  # as sheaf_traces: sum_ij A_ij - sum_i A_ii
            off = mass - collected.reduce("attn_diag", lambda d: torch.nansum(d.double(), dim=-1))[0]
        else:
            off = collected.reduce("attn_diag", lambda d: torch.nansum(1.0 - d.double(), dim=-1))[0]
        trace = off * _w_v_frob_sq(view.W_V(), view)[probe.layer][None, :]
        return trace[:, probe.index[0]] if probe.index else trace.sum(-1)


@register_measurement
class Sheaf(Measurement[SheafOptions]):
    """The sheaf Laplacian traces (:class:`SheafTraces`)."""

    name = "sheaf"
    title = "Sheaf Laplacian traces"
    summary = ("the trace of each head's sheaf Laplacian (restriction maps sqrt(A_ij) W_V) on each prompt: the "
               "off-diagonal attention mass times ||W_V||_F^2")
    result = SheafTraces
    section = "sheaf"
    Options = SheafOptions
    readouts = (
        SheafTraceReadout("sheaf_trace:<layer>", "sheaf_traces' layer_trace[:, layer]: sum over heads of (n - sum_i "
                          "A_ii) ||W_V^h||_F^2 (formula 'off_diagonal_mass'), over all real tokens whatever the "
                          "token_scope", scope=_SWEEP_SCOPE),
        SheafTraceReadout("sheaf_trace:<layer>.<head>", "sheaf_traces' trace[:, layer, head]: (n - sum_i A_ii) "
                          "||W_V^h||_F^2 (formula 'off_diagonal_mass'; under GQA the head's KV head's W_V), over all "
                          "real tokens", scope=_SWEEP_SCOPE),
    )

    def reductions(self) -> list[Any]:
        return [attention_diagonal_sums]

    def build(self, ctx: BuildContext) -> SheafTraces:
        return _traces(ctx.collected, self.options.formula, W_V=None)


@documents_cache
@validates_own_inputs
def sheaf_traces(
    model: TransformerLensModel | ModelView,
    prompts: Prompts,
    *,
    formula: str = "off_diagonal_mass",
    settings: RunSettings | None = None,
    cache: Any = None,
    **run: Unpack[RunOptions],
) -> SheafTraces:
    """Sheaf Laplacian trace of every head, layer and prompt in one forward pass.

    ``Tr L^{(l,h)} = (n - sum_i A_ii) ||W_V^{(l,h)}||_F^2``: the off-diagonal attention mass times
    the squared Frobenius norm of the head's value matrix (``thermo_lens.definitions`` §3; the trace of
    ``delta^T delta`` for either convention). With attention sinks (GPT-OSS), whose share of each
    row goes to no token, it is ``(sum_ij A_ij - sum_i A_ii) ||W_V||_F^2``, still
    ``sum_{i != j} A_ij ||W_V||_F^2``. The pattern is reduced to its diagonal and row mass inside
    the hook; no ``n x n`` pattern is stored.

    ``formula="paper_printed"`` gives the paper's printed eq. 4, ``(sum_ij A_ij - n) ||W_V||_F^2``,
    for reproduction only: softmax rows sum to 1, so it is identically 0 up to float rounding
    (a ``UserWarning`` says so). The paper's notebooks (and its "GPT-2 62,696 vs OPT-125m 2,368")
    computed the off-diagonal-mass version.

    Args:
        model: a TransformerLens model or :class:`ModelView`.
        prompts: a string, a list of strings, a prompt set name, ``{category: [...]}`` or token
            ids (:func:`thermo_lens.core.inputs.as_prompts`).
        formula: ``"off_diagonal_mass"`` (default) or ``"paper_printed"``.
        settings, **run: run options (:class:`thermo_lens.RunSettings`): ``prepend_bos``,
            ``batch_size``, ``truncate``, ``fwd_hooks`` (ablations, patching; run in the same
            pass first, in your prompt order, recorded in the result), ``progress``.
        cache: <CACHE_DOC>
    """
    # The option's check fails (or warns, for "paper_printed") before any compute.
    return measure.run(as_view(model), prompts, {"sheaf": {"formula": formula}}, settings=settings, cache=cache,
                       **run).sheaf
