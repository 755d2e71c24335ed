"""A logit difference read from the final residual: the model's final norm and two unembedding
columns at one position, instead of the ``[batch, pos, d_vocab]`` logits.

``logits[p, t, a] - logits[p, t, b] = <ln_final(x_L[p, t]), W_U[:, a] - W_U[:, b]> + b_U[a] - b_U[b]``
(with the model's logit soft cap, if it has one, applied to each logit first). A sweep with this
measure ends its passes after the last block, like a gain measure: the unembedding (``d_model x
d_vocab`` per token, about a third of GPT-2-small's forward pass with its 50,257-token vocabulary)
never runs, and the final norm runs on one position per prompt.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from thermo_lens.errors import ThermoLensInputError
from thermo_lens.model import ModelView
from thermo_lens.passes import Recorder
from thermo_lens.tokens import TokenBatch

__all__ = ["LogitDifference"]


def _ids(name: str, value: Any) -> tuple[int, ...]:
    try:
        items = [operator.index(value)] if not isinstance(value, (Sequence, Tensor)) else list(value)
        out = tuple(operator.index(v) for v in items)
    except (TypeError, ValueError):
        raise ThermoLensInputError(f"LogitDifference: {name} must be a token id or one token id per prompt, "
                                   f"got {value!r}") from None
    if not out or any(isinstance(v, bool) or v < 0 for v in items):
        raise ThermoLensInputError(f"LogitDifference: {name} must be token ids >= 0, got {value!r}")
    return out


@dataclass(frozen=True)
class LogitDifference:
    """The per-prompt measure ``logits[p, pos, answer_p] - logits[p, pos, wrong_p]`` of a sweep,
    computed from the final residual (see the module docstring).

    Args:
        answer, wrong: a token id, or one token id per prompt (in the prompts' order).
        pos: the position, among each prompt's real tokens (default ``-1``: its last token; negative
            from each prompt's end).

    Calling it on logits ``[prompt, pos, d_vocab]`` (prompts of one length, as from ``model(tokens)``)
    gives the same numbers from the full logits, e.g. as the metric of ``transformer_lens.patching``.
    """

    answer: int | Sequence[int]
    wrong: int | Sequence[int]
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
        show = lambda ids: str(ids[0]) if len(ids) == 1 else f"{len(ids)} ids"  # noqa: E731
        return f"logit_difference:{show(self._a)}-{show(self._b)}@{self.pos}"  # type: ignore[attr-defined]

    def check(self, n_prompts: int, lengths: Sequence[int], d_vocab: int | None) -> None:
        """Fails, before any pass, on per-prompt ids of another count, a position beyond a prompt or
        an id beyond the vocabulary."""
        for name, ids in (("answer", self._a), ("wrong", self._b)):  # type: ignore[attr-defined]
            if len(ids) not in (1, n_prompts):
                raise ThermoLensInputError(f"LogitDifference: {len(ids)} {name} ids for {n_prompts} prompts; give "
                                           "one id, or one per prompt")
            if d_vocab is not None and max(ids) >= d_vocab:
                raise ThermoLensInputError(f"LogitDifference: {name} id {max(ids)} is beyond the vocabulary "
                                           f"({d_vocab} tokens)")
        for i, n in enumerate(lengths):
            if not -n <= self.pos < n:
                raise ThermoLensInputError(f"LogitDifference: pos={self.pos} is beyond prompt {i} ({n} tokens)")

    def _columns(self, prompts: Tensor, device: torch.device) -> tuple[Tensor, Tensor]:
        a, b = (torch.as_tensor(ids, dtype=torch.long) for ids in (self._a, self._b))  # type: ignore[attr-defined]
        pick = lambda ids: ids.expand(len(prompts)) if len(ids) == 1 else ids[prompts]  # noqa: E731
        return pick(a).to(device), pick(b).to(device)

    def __call__(self, logits: Tensor) -> Tensor:
        """``[prompt]`` from full logits ``[prompt, pos, d_vocab]`` (prompts of one length)."""
        a, b = self._columns(torch.arange(logits.shape[0]), logits.device)
        at = logits[:, self.pos]
        return at.gather(1, a[:, None])[:, 0] - at.gather(1, b[:, None])[:, 0]

    def reduction(self, n_prompts: int) -> Any:
        """The in-pass reduction recording ``("logit_difference", 0)`` ``[batch]`` float64 at the final
        residual (batch rows are prompts ``row % n_prompts``: copies of the prompts, stacked)."""
        def reduction(view: ModelView, rec: Recorder) -> None:
            model = view.model
            cap = float(getattr(model.cfg, "output_logits_soft_cap", 0.0) or 0.0)

            def fn(x: Tensor, batch: TokenBatch) -> Tensor:
                lengths = batch.lengths.to(x.device)
                at = torch.full_like(lengths, self.pos) if self.pos >= 0 else lengths + self.pos
                h = x[torch.arange(x.shape[0], device=x.device), at]  # [batch, d_model]
                y = model.ln_final(h[:, None, :])[:, 0]
                a, b = self._columns(batch.prompt_index % n_prompts, x.device)
                W_U, b_U = model.W_U, getattr(model, "b_U", None)
                la = torch.linalg.vecdot(y, W_U[:, a].T)
                lb = torch.linalg.vecdot(y, W_U[:, b].T)
                if b_U is not None:
                    la, lb = la + b_U[a], lb + b_U[b]
                if cap > 0:
                    la, lb = cap * torch.tanh(la / cap), cap * torch.tanh(lb / cap)
                return (la - lb).double()
            rec.add(view.resid_hook_names[view.n_layers], ("logit_difference", 0), fn)
        return reduction
