"""A logit difference read from the final residual: the model's own head (final norm, LM-head
transform, ``project_out``), two unembedding columns at one position, then the model's logit
scaling and soft cap, instead of the ``[batch, pos, d_vocab]`` logits.

``logits[p, t, a] - logits[p, t, b] = post(<head(x_L[p, t]), W_U[:, a]> + b_U[a]) - post(... b ...)``
where ``head`` is what the model runs between its last block and the unembedding (the final
norm; BERT's masked-LM transform, dense + activation + LayerNorm; OPT-350m's ``project_out``) and
``post`` what it runs after (Granite's division by ``logits_scaling``, Cohere's ``logit_scale``,
Gemma-2's final soft cap). A sweep with this measure ends its passes after the last block, like a
gain measure: the unembedding (``d_model x d_vocab`` per token, about a third of GPT-2-small's
forward pass with its 50,257-token vocabulary) never runs, and the head runs on one position per
prompt.

The readout is checked once per model against the model's own logits (one forward pass of a
4-token probe, every logit of the first 64 vocabulary ids): a model whose head has a step this
module does not know is refused with the way out (``measure=ld.on_logits``, the same difference
read from the full logits), never measured wrong.

Answers may be token ids or strings. A string is tokenized as the model tokenizes a continuation:
``tokenizer.encode(text, add_special_tokens=False)``, exactly as given (``" Paris"`` with its
leading space is GPT-2's single token ``Ġ Paris``). It must be one token: a string of several
tokens is refused with its tokens named (comparing first tokens silently is how a measure ends up
comparing ``" Par"`` with ``" Par"``); pass the id you mean instead.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, SupportsIndex

import torch
from torch import Tensor

from thermo_lens.core import offload
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.model import ModelView
from thermo_lens.core.passes import Recorder, Reduction
from thermo_lens.core.tokens import TokenBatch

if TYPE_CHECKING:
    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["LogitDifference", "head_readout"]

Answer = int | str


def _ids(name: str, value: object) -> tuple[Answer, ...]:
    """The answers as given: token ids (``int``) or strings, one or one per prompt."""
    items = [value] if isinstance(value, str) or not isinstance(value, (Sequence, Tensor)) else list(value)
    out: list[Answer] = []
    for v in items:
        if isinstance(v, str):
            if not v:
                raise ThermoLensInputError(f"LogitDifference: {name} must be a token id or a one-token string, got ''")
            out.append(v)
            continue
        try:
            if not isinstance(v, SupportsIndex):
                raise TypeError
            i = operator.index(v)
        except (TypeError, ValueError):
            raise ThermoLensInputError(f"LogitDifference: {name} must be a token id, a one-token string, or one "
                                       f"of them per prompt, got {value!r}") from None
        if isinstance(v, bool) or i < 0:
            raise ThermoLensInputError(f"LogitDifference: {name} must be token ids >= 0 (or strings), got {value!r}")
        out.append(i)
    if not out:
        raise ThermoLensInputError(f"LogitDifference: {name} is empty; give a token id or a string, or one per prompt")
    return tuple(out)


def _token_of(view: ModelView, name: str, text: str) -> int:
    """The one token id of ``text`` as the model tokenizes a continuation (no BOS, no special
    tokens, the text exactly as given); several tokens are refused, naming them."""
    tok = getattr(view.model, "tokenizer", None)
    if tok is None:
        raise ThermoLensInputError(f"LogitDifference: {name} {text!r} is a string, but {view.name} has no tokenizer; "
                                   "pass token ids")
    ids = list(tok.encode(text, add_special_tokens=False))
    if len(ids) != 1:
        pieces = [tok.decode([i]) for i in ids]
        raise ThermoLensInputError(
            f"LogitDifference: {name} {text!r} is {len(ids)} tokens for {view.name}'s tokenizer "
            f"({', '.join(repr(p) for p in pieces)} = ids {ids}), not one; a logit difference compares one token "
            "per answer. Pass a string that is one token (mind the leading space: ' Paris' and 'Paris' differ), "
            "or the token id you mean (e.g. the first, ids[0]), explicitly")
    return int(ids[0])


# ---------------------------------------------------------------------------- the model's head
@dataclass(frozen=True)
class HeadReadout:
    """What a model runs after its final residual: ``pre`` (``[n, d_model] -> [n, d_in of W_U]``),
    the unembedding columns, then ``post`` on the logits; ``steps`` says which, in words."""

    pre: Callable[[Tensor], Tensor]
    post: Callable[[Tensor], Tensor]
    steps: str

    def logits(self, view: ModelView, h: Tensor, ids: Tensor) -> Tensor:
        """``[n, k]`` logits of ``ids`` (``[n, k]`` long) from final residuals ``h`` ``[n, d_model]``."""
        model = view.model
        y = self.pre(h)
        unembed = getattr(model, "unembed", None)
        if isinstance(unembed, torch.nn.Module):
            with offload.materialised(unembed, "the unembedding"):  # an offloaded model: loaded for this read
                W_U, b_U = offload.live_attr(unembed, "W_U"), offload.live_attr(unembed, "b_U")
                cols = W_U[:, ids.reshape(-1).to(W_U.device)].T.reshape(*ids.shape, -1).to(y.device, y.dtype)
                bias = None if b_U is None else b_U[ids.to(b_U.device)].to(y.device)
        else:
            W_U, b_U = model.W_U, getattr(model, "b_U", None)
            cols = W_U[:, ids.reshape(-1)].T.reshape(*ids.shape, -1).to(y.dtype)  # [n, k, d_in]
            bias = None if b_U is None else b_U[ids]
        out = torch.einsum("nd,nkd->nk", y, cols)
        if bias is not None:
            out = out + bias.to(out.dtype)
        return self.post(out)


def _soft_cap(x: Tensor, cap: float) -> Tensor:
    return cap * torch.tanh(x / cap)


def _build_head(view: ModelView) -> HeadReadout:
    model, hf = view.model, view.hf_config
    pre: list[tuple[str, Callable[[Tensor], Tensor]]] = []
    mlm_head = view.adapter.mlm_head(model)  # BERT-style: the head between the stream and W_U
    if mlm_head is not None:
        pre.append(mlm_head)
    else:
        ln_final = getattr(model, "ln_final", None)
        if ln_final is not None:
            pre.append(("the final norm", lambda h: ln_final(h[:, None, :])[:, 0]))
        project_out = getattr(model, "project_out", None)
        if project_out is not None and callable(project_out):
            pre.append(("project_out", project_out))
    post: list[tuple[str, Callable[[Tensor], Tensor]]] = []
    model_type = str(getattr(hf, "model_type", "") or "")
    scaling = getattr(hf, "logits_scaling", None)
    if model_type.startswith("granite") and isinstance(scaling, (int, float)) and scaling != 1:
        post.append((f"divided by logits_scaling={scaling:g}", functools.partial(torch.div, other=float(scaling))))
    scale = getattr(hf, "logit_scale", None)
    if model_type.startswith("cohere") and isinstance(scale, (int, float)) and scale != 1:
        post.append((f"times logit_scale={scale:g}", functools.partial(torch.mul, other=float(scale))))
    cap = float(getattr(getattr(model, "cfg", None), "output_logits_soft_cap", 0.0) or 0.0)
    if cap <= 0:
        cap = float(getattr(hf, "final_logit_softcapping", 0.0) or 0.0)
    if cap > 0:
        post.append((f"soft-capped at {cap:g} (cap * tanh(logit / cap))", functools.partial(_soft_cap, cap=cap)))

    def run(steps: list[tuple[str, Callable[[Tensor], Tensor]]], x: Tensor) -> Tensor:
        for _, fn in steps:
            x = fn(x)
        return x
    words = [w for w, _ in pre] + ["two unembedding columns (W_U, b_U)"] + [w for w, _ in post]
    return HeadReadout(pre=lambda h: run(pre, h), post=lambda x: run(post, x), steps=", ".join(words))


_CHECKED: "weakref.WeakKeyDictionary[Any, HeadReadout | str]" = weakref.WeakKeyDictionary()
_PROBE_IDS = 64


def head_readout(view: ModelView) -> HeadReadout:
    """The model's head as :class:`HeadReadout`, checked once per model against its own logits:
    one forward pass of a 4-token probe, the readout of its final residual against ``model(tokens)``
    on every position and the first 64 vocabulary ids.

    A probe whose logits are NaN/inf (NaN weights) is inconclusive: the readout is used unchecked
    for this pass (whose NaN is then flagged where it arises) and checked again next time.

    Raises:
        ThermoLensInputError: the readout differs from the model's logits (a head step this module
            does not know), or cannot be built; the message says how to read the full logits instead.
    """
    try:
        known = _CHECKED.get(view.model)
    except TypeError:  # not weak-referenceable: check every time
        known = None
    if known is None:
        known = _check_head(view)
        if known is None:  # inconclusive (NaN/inf logits on the probe): checked again next time
            return _build_head(view)
        try:
            _CHECKED[view.model] = known
        except TypeError:
            pass
    if isinstance(known, str):
        raise ThermoLensInputError(known)
    return known


def _check_head(view: ModelView) -> HeadReadout | str | None:
    way_out = ("Read the difference from the full logits instead: measure=ld.on_logits (the same difference as a "
               "function of the logits; every prompt of one token length), which runs the unembedding")
    try:
        head = _build_head(view)
        d_vocab = int(view.d_vocab or 0)
        n_ids = min(_PROBE_IDS, d_vocab)
        tokens = (torch.arange(4) % max(d_vocab - 1, 1) + 1)[None, :]  # ids 1..4: no pad id (often 0)
        final = view.resid_hook_names[view.n_layers]
        seen: dict[str, Tensor] = {}

        def keep(x: Tensor, hook: object = None) -> None:
            seen["x"] = x.detach().clone()
        logits = view.run(tokens, torch.ones_like(tokens, dtype=torch.bool), [(final, keep)], return_logits=True)
        assert logits is not None
        ids = torch.arange(n_ids, device=logits.device)
        want = logits[0, :, :n_ids].double()
        with torch.inference_mode():
            h = seen["x"][0]  # [pos, d_model]
            got = head.logits(view, h, ids[None, :].expand(h.shape[0], n_ids).to(h.device)).double().to(want.device)
    except ThermoLensInputError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to build or run the readout is reported as such
        return (f"LogitDifference cannot read {view.name}'s logits from its final residual: building its head failed "
                f"({type(e).__name__}: {str(e)[:200]}). {way_out}")
    if not (bool(torch.isfinite(want).all()) and bool(torch.isfinite(got).all())):
        # NaN/inf weights or activations: nothing to compare; the pass flags them where they arise
        return None
    scale = float(want.abs().max()) + 1.0
    eps = torch.finfo(view.dtype).eps if view.dtype.is_floating_point else 1e-6
    err = float((got - want).abs().max())
    if not err <= 64 * eps * scale:
        return (f"LogitDifference cannot read {view.name}'s logits exactly from its final residual: its readout "
                f"({head.steps}) differs from the model's own logits by up to {err:.3g} on a probe (the model's head "
                f"has a step thermo-lens does not know). {way_out}")
    return head


@dataclass(frozen=True)
class LogitDifference:
    """The per-prompt measure ``logits[p, pos, answer_p] - logits[p, pos, wrong_p]`` of a sweep,
    computed from the final residual through the model's own head (see the module docstring).

    Args:
        answer, wrong: a token id or a one-token string, or one of them per prompt (in the prompts'
            order). Strings are tokenized as the model tokenizes a continuation, exactly as given
            (``" Paris"`` with its space); a string of several tokens is refused, naming them.
        pos: the position, among each prompt's real tokens (default ``-1``: its last token; negative
            from each prompt's end).

    Calling it on logits ``[prompt, pos, d_vocab]`` (prompts of one length, as from ``model(tokens)``)
    gives the same numbers from the full logits, e.g. as the metric of ``transformer_lens.patching``
    (strings there need :meth:`resolve` first). :attr:`on_logits` is that function as a sweep measure
    of the logits, for a model whose head the final-residual readout cannot reproduce.
    """

    answer: Answer | Sequence[Answer]
    wrong: Answer | Sequence[Answer]
    pos: int = -1

    def __post_init__(self) -> None:
        a, b = _ids("answer", self.answer), _ids("wrong", self.wrong)
        if len(a) > 1 and len(b) > 1 and len(a) != len(b):
            raise ThermoLensInputError(f"LogitDifference: {len(a)} answer ids and {len(b)} wrong ids; give one "
                                       "id, or one per prompt, for each")
        if isinstance(self.pos, bool) or not isinstance(self.pos, int):
            raise ThermoLensInputError(f"LogitDifference: pos must be an int, got {self.pos!r}")
        object.__setattr__(self, "_a", a)
        object.__setattr__(self, "_b", b)

    @property
    def label(self) -> str:
        show = lambda ids: repr(ids[0]) if len(ids) == 1 else f"{len(ids)} ids"  # noqa: E731
        return f"logit_difference:{show(self._a)}-{show(self._b)}@{self.pos}"  # type: ignore[attr-defined]

    def resolve(self, model: TransformerLensModel | ModelView) -> "LogitDifference":
        """The same measure with every string answer replaced by its one token id for ``model``'s
        tokenizer (refused, naming the tokens, where a string is several)."""
        from thermo_lens.core.model import as_view

        view = as_view(model)
        a, b = (tuple(_token_of(view, name, v) if isinstance(v, str) else v for v in ids)
                for name, ids in (("answer", self._a), ("wrong", self._b)))  # type: ignore[attr-defined]
        return LogitDifference(list(a), list(b), self.pos)

    @property
    def on_logits(self) -> Callable[[Tensor], Tensor]:
        """This difference as a function of the full logits ``[prompt, pos, d_vocab] -> [prompt]``
        (a sweep then runs the model's unembedding; prompts of one token length)."""
        def logit_difference_from_logits(logits: Tensor) -> Tensor:
            return self(logits)
        logit_difference_from_logits.__qualname__ = f"{self.label}(full logits)"
        return logit_difference_from_logits

    def check(self, n_prompts: int, lengths: Sequence[int], d_vocab: int | None) -> None:
        """Fails, before any pass, on per-prompt ids of another count, a position beyond a prompt or
        an id beyond the vocabulary (strings are checked when the model's tokenizer reads them)."""
        for name, ids in (("answer", self._a), ("wrong", self._b)):  # type: ignore[attr-defined]
            if len(ids) not in (1, n_prompts):
                raise ThermoLensInputError(f"LogitDifference: {len(ids)} {name} ids for {n_prompts} prompts; give "
                                           "one id, or one per prompt")
            numbers = [i for i in ids if not isinstance(i, str)]
            if d_vocab is not None and numbers and max(numbers) >= d_vocab:
                raise ThermoLensInputError(f"LogitDifference: {name} id {max(numbers)} is beyond the vocabulary "
                                           f"({d_vocab} tokens)")
        for i, n in enumerate(lengths):
            if not -n <= self.pos < n:
                raise ThermoLensInputError(f"LogitDifference: pos={self.pos} is beyond prompt {i} ({n} tokens)")

    def _numbers(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        a, b = self._a, self._b  # type: ignore[attr-defined]
        if any(isinstance(v, str) for v in (*a, *b)):
            raise ThermoLensInputError("LogitDifference: string answers need the model's tokenizer: use "
                                       "ld.resolve(model)(logits) on logits, or pass the model's token ids")
        return a, b

    def _columns(self, prompts: Tensor, device: torch.device) -> tuple[Tensor, Tensor]:
        a, b = (torch.as_tensor(ids, dtype=torch.long) for ids in self._numbers())
        pick = lambda ids: ids.expand(len(prompts)) if len(ids) == 1 else ids[prompts]  # noqa: E731
        return pick(a).to(device), pick(b).to(device)

    def __call__(self, logits: Tensor) -> Tensor:
        """``[prompt]`` from full logits ``[prompt, pos, d_vocab]`` (prompts of one length)."""
        a, b = self._columns(torch.arange(logits.shape[0]), logits.device)
        at = logits[:, self.pos]
        return at.gather(1, a[:, None])[:, 0] - at.gather(1, b[:, None])[:, 0]

    def reduction(self, n_prompts: int) -> Reduction:
        """The in-pass reduction recording ``("logit_difference", 0)`` ``[batch]`` float64 at the final
        residual (batch rows are prompts ``row % n_prompts``: copies of the prompts, stacked). A
        NaN/inf difference marks the readout in ``rec.nonfinite`` (the pass is then refused,
        naming it)."""
        def reduction(view: ModelView, rec: Recorder) -> None:
            given = (*self._a, *self._b)  # type: ignore[attr-defined]
            me = self.resolve(view.model) if any(isinstance(v, str) for v in given) else self
            head = head_readout(view)
            where = view.resid_hook_names[view.n_layers]
            what = f"the logit difference read from {where} ({head.steps})"

            def fn(x: Tensor, batch: TokenBatch) -> Tensor:
                lengths = batch.lengths.to(x.device)
                at = torch.full_like(lengths, self.pos) if self.pos >= 0 else lengths + self.pos
                h = x[torch.arange(x.shape[0], device=x.device), at]  # [batch, d_model]
                a, b = me._columns(batch.prompt_index % n_prompts, x.device)
                both = head.logits(view, h, torch.stack([a, b], 1))  # [batch, 2]
                out = (both[:, 0] - both[:, 1]).double()
                if not bool(torch.isfinite(out).all()):
                    # the final residual itself (an upstream NaN/inf), or the readout (the head's weights)
                    named = where if not bool(torch.isfinite(h).all()) else what
                    if named not in rec.nonfinite:
                        rec.nonfinite.append(named)
                return out
            rec.add(where, ("logit_difference", 0), fn)
        return reduction
