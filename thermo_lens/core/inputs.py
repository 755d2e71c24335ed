"""One normalisation of the prompts every entry point accepts.

:func:`as_prompts` turns what a researcher passes (anything of type :data:`Prompts`) into a
:class:`PromptList`:

* a single string: one prompt (``"The capital of France is"``), unless it names a built-in prompt
  set (``"paper25"``, see :func:`thermo_lens.core.prompts.names`), which is used by name; a one-word
  string that nearly matches a set name (``"paper26"``) is refused as a likely typo;
* a list / tuple of strings, or a :class:`~thermo_lens.core.prompts.PromptSet`;
* ``{category: [prompt, ...]}``: the prompts of every category, in order, with their categories;
* token ids: a ``[batch, pos]`` integer tensor, or a mapping with ``input_ids`` and
  ``attention_mask`` (an HF ``BatchEncoding``, left or right padded) or ``input_ids`` and
  ``lengths`` (right padded). A tensor without a mask (``model.to_tokens(prompt_list)``) is
  masked the way TransformerLens derives its attention mask from pad tokens
  (``transformer_lens.utils.get_attention_mask``): with the tokenizer's ``padding_side``, the run
  of pad tokens after (right) or before (left) each row's real tokens is padding, and with left
  padding a BOS that shares the pad token's id is real. Where that is ambiguous (every row ends in
  the pad token, a row is all pad tokens, pad tokens on the other side) it is refused: pass the
  mask. Token ids are used exactly as given (no BOS is added; ``prepend_bos`` is recorded as
  ``"tokens_as_given"``) and the prompt texts are their decodings. Ids must lie in the model's
  vocabulary; lengths are integers.

An unordered container (a ``set``) is refused: per-prompt results come back in the caller's
order, and a set has none. An ``ActivationCache`` is not prompts: pass the tokens it was made from
as prompts and the cache as ``cache=`` (the activation measures accept it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence, TypeAlias, TypeGuard, Union

import torch
from torch import Tensor

from thermo_lens.core.errors import ThermoLensInputError, ThermoLensInputTypeError

if TYPE_CHECKING:  # for the alias only; the module itself is imported on use
    from numpy.typing import ArrayLike
    from transformers import PreTrainedTokenizerBase

    from thermo_lens.core.model import ModelView
    from thermo_lens.core.prompts import PromptSet

__all__ = ["Prompts", "PromptList", "as_prompts", "as_model_prompts"]

#: What every entry point accepts as prompts: a string, a built-in set name, a list of strings,
#: ``{category: [strings]}``, a :class:`~thermo_lens.core.prompts.PromptSet`, a ``[batch, pos]`` token
#: tensor, or a mapping with ``input_ids`` and ``attention_mask`` / ``lengths``.
Prompts: TypeAlias = Union[str, Sequence[str], Mapping[str, Sequence[str]], "PromptSet", Tensor, Mapping[str, Any], "PromptList"]


class _Activations(Protocol):
    """An ``ActivationCache``, or a ``{hook name: activation}`` dict like one."""

    def keys(self) -> Iterable[str]: ...


@dataclass(frozen=True)
class PromptList:
    """Prompts as every entry point sees them, normalised (:func:`as_prompts`).

    Attributes:
        texts: the prompt strings (decoded token ids when ``token_ids`` is given).
        categories: one category per prompt (``"all"`` unless given).
        name: the prompt set's name (``"custom"`` for a list, ``"tokens"`` for token ids).
        token_ids: the real token ids of each prompt when the caller passed tokens, else None.
        padding: for a token tensor given without a mask, how its padding was found (the pad
            token, side and number of padded positions); ``""`` otherwise.
        starts: for token ids, the position of each row's first real token in the tensor as given
            (non-zero for left padding); ``None`` for texts.
    """

    texts: tuple[str, ...]
    categories: tuple[str, ...]
    name: str = "custom"
    token_ids: tuple[tuple[int, ...], ...] | None = None
    padding: str = ""
    starts: tuple[int, ...] | None = None

    def __len__(self) -> int:
        return len(self.texts)


def _rows_from_mask(ids: Tensor, mask: Tensor | ArrayLike) -> list[tuple[int, ...]]:
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
        rows.append(tuple(ids[b, lo:hi].tolist()))
    return rows


def _rows_from_lengths(ids: Tensor, lengths: Tensor | ArrayLike | None) -> list[tuple[int, ...]]:
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
        rows.append(tuple(ids[b, : int(n)].tolist()))
    return rows


def _pad_rule(ids: Tensor, tokenizer: PreTrainedTokenizerBase | None, prepend_bos: bool) -> tuple[list[tuple[int, ...]], list[int], str]:
    """Rows of a token tensor given without a mask, its padding found the way TransformerLens'
    ``utils.get_attention_mask`` finds it (see the module docstring); ``(rows, starts, description)``.
    Ambiguous layouts raise."""
    pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    B, T = ids.shape
    if tokenizer is None or pad is None or not bool((ids == int(pad)).any()):
        return [tuple(r) for r in ids.tolist()], [0] * B, ""
    pad = int(pad)
    side = str(getattr(tokenizer, "padding_side", "right") or "right")
    bos = getattr(tokenizer, "bos_token_id", None)
    bos_is_pad = bos is not None and int(bos) == pad and prepend_bos
    try:
        shown = f"{pad} ({tokenizer.convert_ids_to_tokens(pad)!r})"
    except Exception:  # noqa: BLE001 - a tokenizer without the method; the id is enough
        shown = str(pad)
    fix = ("pass the mask: {'input_ids': tokens, 'attention_mask': mask} (or 'lengths': real tokens per "
           "row), e.g. model.tokenizer(prompts, padding=True, return_tensors='pt')")
    real = ids != pad
    trailing = (real.flip(-1).cumsum(-1) == 0).sum(-1)  # pad tokens after the last real token
    leading = (real.cumsum(-1) == 0).sum(-1)  # pad tokens before the first real token
    all_pad = [b for b in range(B) if int(leading[b]) == T]
    if all_pad:
        raise ThermoLensInputError(
            f"token row(s) {all_pad[:8]} hold nothing but the pad token {shown}: its padding cannot be told "
            f"apart from its tokens; {fix}")
    if side == "left":
        if bool((trailing > 0).any()):
            rows = (trailing > 0).nonzero().flatten().tolist()
            raise ThermoLensInputError(
                f"token row(s) {rows[:8]} end in the pad token {shown}, but the tokenizer pads on the left: "
                f"right-padded tokens, or a real final token with the pad's id? {fix}")
        starts = [int(n) - 1 if bos_is_pad else int(n) for n in leading]
        if bos_is_pad and min(int(n) for n in leading) < 1:
            raise ThermoLensInputError(
                f"the BOS and pad tokens share id {shown} and the model prepends a BOS, but a row does not "
                f"start with it: the padding is ambiguous; {fix}")
        if not bos_is_pad and min(starts) > 0:
            raise ThermoLensInputError(
                f"every token row starts with the pad token {shown}: left padding cannot be told apart from "
                f"real tokens with the pad's id; {fix}")
        rows = [tuple(ids[b, starts[b]:].tolist()) for b in range(B)]
        n_pad = sum(starts)
        how = "before each row's first real token (left padding" + (
            "; the BOS, which shares the pad's id, kept" if bos_is_pad else "") + ")"
    else:
        if bool((trailing > 0).all()):
            raise ThermoLensInputError(
                f"every token row ends in the pad token {shown}, so padding cannot be told apart from a real "
                f"final token with the pad's id (e.g. an end-of-text token); {fix}")
        first_ok = 1 if bos_is_pad else 0
        odd = [b for b in range(B) if int(leading[b]) > first_ok]
        if odd:
            raise ThermoLensInputError(
                f"token row(s) {odd[:8]} start with {int(leading[odd[0]])} pad token(s) {shown}, but the tokenizer "
                f"pads on the right: left-padded tokens (set model.tokenizer.padding_side = 'left'), or real "
                f"tokens with the pad's id? {fix}")
        lengths = [T - int(n) for n in trailing]
        rows = [tuple(ids[b, :lengths[b]].tolist()) for b in range(B)]
        starts = [0] * B
        n_pad = int(trailing.sum())
        how = "after each row's last real token (right padding)"
    desc = (f"no attention mask given: {n_pad} pad token(s) {shown} {how} masked, as "
            "transformer_lens.utils.get_attention_mask derives the mask") if n_pad else ""
    return rows, starts, desc


def _from_tokens(ids: Tensor | ArrayLike, mask: Tensor | ArrayLike | None, lengths: Tensor | ArrayLike | None,
                 tokenizer: PreTrainedTokenizerBase | None, vocab_size: int | None,
                 prepend_bos: bool = True) -> PromptList:
    ids = torch.as_tensor(ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ThermoLensInputError(
            f"token ids must be an integer tensor [batch, pos] (any integer dtype), got {tuple(ids.shape)} {ids.dtype}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ThermoLensInputError("the token tensor is empty; pass at least one prompt with one token")
    if ids.device.type == "meta":
        raise ThermoLensInputError("the token ids are a meta tensor (no values); pass real token ids")
    # int64 before any comparison: in a narrow dtype (uint8) the vocabulary size itself wraps around
    ids = ids.to("cpu", torch.long)
    if vocab_size is not None and bool(((ids < 0) | (ids >= vocab_size)).any()):
        bad = sorted({int(t) for t in ids[(ids < 0) | (ids >= vocab_size)].flatten()[:5].tolist()})
        raise ThermoLensInputError(
            f"token id(s) {bad} are outside the model's vocabulary 0..{vocab_size - 1}; pass ids made by "
            "this model's tokenizer (model.to_tokens(...))")
    if mask is not None and lengths is not None:
        raise ThermoLensInputError("give an attention_mask or lengths with the token ids, not both")
    padding = ""
    if mask is not None:
        rows = _rows_from_mask(ids, mask)
        m = torch.as_tensor(mask).to(torch.bool)
        starts = [int(m[b].nonzero()[0]) for b in range(ids.shape[0])]
    elif lengths is not None:
        rows = _rows_from_lengths(ids, lengths)
        starts = [0] * len(rows)
    else:
        rows, starts, padding = _pad_rule(ids, tokenizer, prepend_bos)
    texts = tuple(str(tokenizer.decode(list(r))) if tokenizer is not None else " ".join(map(str, r)) for r in rows)
    return PromptList(texts=texts, categories=("all",) * len(rows), name="tokens", token_ids=tuple(rows),
                      padding=padding, starts=tuple(starts))


def _is_cache(obj: object) -> TypeGuard[_Activations]:
    """An ``ActivationCache`` (or a ``{hook name: activation}`` dict like one)."""
    if type(obj).__name__ == "ActivationCache" or hasattr(obj, "cache_dict"):
        return True
    return (isinstance(obj, Mapping) and "input_ids" not in obj and len(obj) > 0
            and all(isinstance(v, Tensor) for v in obj.values()))


def as_prompts(prompts: object, tokenizer: PreTrainedTokenizerBase | None = None, *, vocab_size: int | None = None,
               prepend_bos: bool = True) -> PromptList:
    """Normalise ``prompts`` (see the module docstring) into :class:`PromptList`.

    Args:
        prompts: a string, a built-in set name, a list of strings, a PromptSet,
            ``{category: [...]}``, a ``[batch, pos]`` token tensor, or a mapping with
            ``input_ids`` and ``attention_mask`` / ``lengths``.
        tokenizer: decodes token ids into the recorded prompt texts.
        vocab_size: token ids must lie in ``0..vocab_size - 1`` (``None``: not checked).
        prepend_bos: whether the host prepends a BOS (``model.cfg.default_prepend_bos``): with
            left padding, a BOS sharing the pad token's id is a real token.

    Raises:
        ThermoLensInputError: empty input, a non-string prompt, an empty prompt, bad token ids,
            token ids whose padding is ambiguous, an ``ActivationCache`` (pass it as ``cache=``).
    """
    from thermo_lens.core import prompts as prompt_sets

    if isinstance(prompts, PromptList):
        return prompts
    if _is_cache(prompts):
        raise ThermoLensInputTypeError(
            f"got an {type(prompts).__name__} of {len(list(prompts.keys()))} activations as the prompts: a cache is not "
            "prompts. Pass the tokens (or prompt strings) the cache was made from as prompts and the cache as "
            "cache=, e.g. tokens = model.to_tokens(prompts); _, cache = model.run_with_cache(tokens); "
            "thermo_lens.residual_gain(model, tokens, cache=cache)")
    if isinstance(prompts, (set, frozenset)) or type(prompts).__name__ in ("dict_keys", "dict_values"):
        raise ThermoLensInputError(
            f"prompts given as a {type(prompts).__name__}, which has no order: per-prompt results could not be "
            "matched to your prompts. Pass a list (e.g. sorted(prompts))")
    astype = getattr(prompts, "astype", None)
    if type(prompts).__name__ == "ndarray" and getattr(getattr(prompts, "dtype", None), "kind", "") in "iu" and astype:
        prompts = torch.as_tensor(astype("int64"))  # numpy token ids, of any integer dtype
    if isinstance(prompts, Tensor):
        return _from_tokens(prompts, None, None, tokenizer, vocab_size, prepend_bos)
    if isinstance(prompts, Mapping) and "input_ids" in prompts:
        extra = set(prompts) - {"input_ids", "attention_mask", "lengths", "token_type_ids"}
        if extra:
            raise ThermoLensInputError(
                f"token input: unexpected keys {sorted(extra)}; give input_ids with attention_mask or lengths")
        return _from_tokens(prompts["input_ids"], prompts.get("attention_mask"), prompts.get("lengths"), tokenizer,
                            vocab_size, prepend_bos)
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


def as_model_prompts(view: ModelView, prompts: object) -> PromptList:
    """:func:`as_prompts` with ``view``'s tokenizer, vocabulary and BOS default
    (``view`` a :class:`~thermo_lens.core.model.ModelView`)."""
    if isinstance(prompts, PromptList):
        return prompts
    bos = getattr(getattr(view.model, "cfg", None), "default_prepend_bos", True)
    return as_prompts(prompts, tokenizer=view.tokenizer, vocab_size=view.d_vocab,
                      prepend_bos=bool(True if bos is None else bos))
