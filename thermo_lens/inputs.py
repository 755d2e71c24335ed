"""One normalisation of the prompts every entry point accepts.

:func:`as_prompts` turns what a researcher passes (anything of type :data:`Prompts`) into a
:class:`PromptList`:

* a single string: one prompt (``"The capital of France is"``), unless it names a built-in prompt
  set (``"paper25"``, see :func:`thermo_lens.prompts.names`), which is used by name; a one-word
  string that nearly matches a set name (``"paper26"``) is refused as a likely typo;
* a list / tuple of strings, or a :class:`~thermo_lens.prompts.PromptSet`;
* ``{category: [prompt, ...]}``: the prompts of every category, in order, with their categories;
* token ids: a ``[batch, pos]`` integer tensor (every row fully real), or a mapping with
  ``input_ids`` and ``attention_mask`` (an HF ``BatchEncoding``, left or right padded) or
  ``input_ids`` and ``lengths`` (right padded). Token ids are used exactly as given (no BOS is
  added; ``prepend_bos`` is recorded as ``"tokens_as_given"``) and the prompt texts are their
  decodings. Ids must lie in the model's vocabulary; lengths are integers.

An unordered container (a ``set``) is refused: per-prompt results come back in the caller's
order, and a set has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TypeAlias, Union

import torch
from torch import Tensor

from thermo_lens.errors import ThermoLensInputError

if TYPE_CHECKING:  # for the alias only; the module itself is imported on use
    from thermo_lens.prompts import PromptSet

__all__ = ["Prompts", "PromptList", "as_prompts"]

#: What every entry point accepts as prompts: a string, a built-in set name, a list of strings,
#: ``{category: [strings]}``, a :class:`~thermo_lens.prompts.PromptSet`, a ``[batch, pos]`` token
#: tensor, or a mapping with ``input_ids`` and ``attention_mask`` / ``lengths``.
Prompts: TypeAlias = Union[str, Sequence[str], Mapping[str, Sequence[str]], "PromptSet", Tensor, Mapping[str, Any], "PromptList"]


@dataclass(frozen=True)
class PromptList:
    """Prompts as every entry point sees them, normalised (:func:`as_prompts`).

    Attributes:
        texts: the prompt strings (decoded token ids when ``token_ids`` is given).
        categories: one category per prompt (``"all"`` unless given).
        name: the prompt set's name (``"custom"`` for a list, ``"tokens"`` for token ids).
        token_ids: the real token ids of each prompt when the caller passed tokens, else None.
    """

    texts: tuple[str, ...]
    categories: tuple[str, ...]
    name: str = "custom"
    token_ids: tuple[tuple[int, ...], ...] | None = None

    def __len__(self) -> int:
        return len(self.texts)


def _rows_from_mask(ids: Tensor, mask: Any) -> list[tuple[int, ...]]:
    """The real tokens of each row under an attention mask (left or right padding)."""
    mask = torch.as_tensor(mask).to(torch.bool)
    if tuple(mask.shape) != tuple(ids.shape):
        raise ThermoLensInputError(f"attention_mask has shape {tuple(mask.shape)} but input_ids has {tuple(ids.shape)}")
    rows = []
    for b in range(ids.shape[0]):
        where = mask[b].nonzero().flatten()
        if where.numel() == 0:
            raise ThermoLensInputError(f"row {b} of the attention_mask has no real token")
        lo, hi = int(where[0]), int(where[-1]) + 1
        if where.numel() != hi - lo:
            raise ThermoLensInputError(
                f"row {b} of the attention_mask has holes; real tokens must be one contiguous run "
                "(left or right padding)")
        rows.append(tuple(int(t) for t in ids[b, lo:hi]))
    return rows


def _rows_from_lengths(ids: Tensor, lengths: Any) -> list[tuple[int, ...]]:
    """The first ``lengths[b]`` tokens of each row (right padding; all tokens when None)."""
    if lengths is None:
        lengths = torch.full((ids.shape[0],), ids.shape[1])
    lengths = torch.as_tensor(lengths).flatten()
    if lengths.is_floating_point() or lengths.dtype == torch.bool or lengths.is_complex():
        raise ThermoLensInputError(
            f"lengths must be integers (real tokens per row), got {lengths.dtype} {lengths.tolist()[:8]}")
    if lengths.numel() != ids.shape[0]:
        raise ThermoLensInputError(f"{lengths.numel()} lengths for {ids.shape[0]} rows of token ids")
    rows = []
    for b, n in enumerate(lengths.tolist()):
        if not 1 <= int(n) <= ids.shape[1]:
            raise ThermoLensInputError(f"lengths[{b}] = {n} is not in 1..{ids.shape[1]} (the token width)")
        rows.append(tuple(int(t) for t in ids[b, : int(n)]))
    return rows


def _from_tokens(ids: Any, mask: Any, lengths: Any, tokenizer: Any, vocab_size: int | None) -> PromptList:
    ids = torch.as_tensor(ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ThermoLensInputError(
            f"token ids must be an integer tensor [batch, pos], got {tuple(ids.shape)} {ids.dtype}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ThermoLensInputError("the token tensor is empty; pass at least one prompt with one token")
    if vocab_size is not None and bool(((ids < 0) | (ids >= vocab_size)).any()):
        bad = sorted({int(t) for t in ids[(ids < 0) | (ids >= vocab_size)].flatten()[:5].tolist()})
        raise ThermoLensInputError(
            f"token id(s) {bad} are outside the model's vocabulary 0..{vocab_size - 1}; pass ids made by "
            "this model's tokenizer (model.to_tokens(...))")
    if mask is not None and lengths is not None:
        raise ThermoLensInputError("give an attention_mask or lengths with the token ids, not both")
    rows = _rows_from_mask(ids, mask) if mask is not None else _rows_from_lengths(ids, lengths)
    texts = tuple(str(tokenizer.decode(list(r))) if tokenizer is not None else " ".join(map(str, r)) for r in rows)
    return PromptList(texts=texts, categories=("all",) * len(rows), name="tokens", token_ids=tuple(rows))


def as_prompts(prompts: Any, tokenizer: Any = None, *, vocab_size: int | None = None) -> PromptList:
    """Normalise ``prompts`` (see the module docstring) into :class:`PromptList`.

    Args:
        prompts: a string, a built-in set name, a list of strings, a PromptSet,
            ``{category: [...]}``, a ``[batch, pos]`` token tensor, or a mapping with
            ``input_ids`` and ``attention_mask`` / ``lengths``.
        tokenizer: decodes token ids into the recorded prompt texts.
        vocab_size: token ids must lie in ``0..vocab_size - 1`` (``None``: not checked).

    Raises:
        ThermoLensInputError: empty input, a non-string prompt, an empty prompt, bad token ids.
    """
    from thermo_lens import prompts as prompt_sets

    if isinstance(prompts, PromptList):
        return prompts
    if isinstance(prompts, (set, frozenset)) or type(prompts).__name__ in ("dict_keys", "dict_values"):
        raise ThermoLensInputError(
            f"prompts given as a {type(prompts).__name__}, which has no order: per-prompt results could not be "
            "matched to your prompts. Pass a list (e.g. sorted(prompts))")
    if isinstance(prompts, Tensor):
        return _from_tokens(prompts, None, None, tokenizer, vocab_size)
    if isinstance(prompts, Mapping) and "input_ids" in prompts:
        extra = set(prompts) - {"input_ids", "attention_mask", "lengths", "token_type_ids"}
        if extra:
            raise ThermoLensInputError(
                f"token input: unexpected keys {sorted(extra)}; give input_ids with attention_mask or lengths")
        return _from_tokens(prompts["input_ids"], prompts.get("attention_mask"), prompts.get("lengths"), tokenizer,
                            vocab_size)
    if isinstance(prompts, str):
        if prompts in prompt_sets.names():
            ps = prompt_sets.get(prompts)
            return PromptList(tuple(ps.prompts), tuple(ps.categories), ps.name)
        if not prompts.strip():
            raise ThermoLensInputError("the prompt is an empty string")
        import difflib

        near = difflib.get_close_matches(prompts, prompt_sets.names(), n=1, cutoff=0.8)
        if near and not any(c.isspace() for c in prompts):
            raise ThermoLensInputError(
                f"{prompts!r} is not a built-in prompt set name (did you mean {near[0]!r}? available: "
                f"{', '.join(prompt_sets.names())}); to measure it as a prompt, pass a list: [{prompts!r}]")
        return PromptList((prompts,), ("all",), "custom")
    if prompts is None:
        raise ThermoLensInputError("expected prompts, got None")
    try:
        ps = prompt_sets.as_prompt_set(prompts)
    except (TypeError, ValueError, KeyError) as e:
        msg = str(e.args[0]) if e.args else str(e)
        raise ThermoLensInputError(
            f"bad prompts: {msg}. Pass a string, a list of strings, {{category: [strings]}}, a "
            "built-in prompt set name or token ids") from None
    return PromptList(tuple(ps.prompts), tuple(ps.categories), ps.name)
