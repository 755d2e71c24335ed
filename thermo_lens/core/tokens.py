"""Tokens: BOS modes, token scopes, tokenization into padded batches, batch plans.

Everything between "a list of prompt texts (or token ids)" and "a right-padded batch the model
runs" lives here, so that every entry point tokenizes, pads and batches the same way.

**BOS modes** (``prepend_bos``, :data:`BosMode`; ``thermo_lens.definitions`` §1): ``"host"`` (the
default) tokenizes exactly as the host's ``model.to_tokens(prompt)`` does (its
``cfg.default_prepend_bos``; BERT's ``[CLS] ... [SEP]``), so ``run_with_cache(prompt)`` and
thermo-lens see the same tokens; ``True`` / ``False`` force a BOS (``[CLS]`` for BERT-style
tokenizers) or none; ``"tokenizer"`` reproduces the paper's protocol (the HF tokenizer with
``add_special_tokens=True``: BOS for LLaMA/Gemma-style tokenizers, ``</s>`` for OPT, nothing for
GPT-2/NeoX). ``"host"`` is recorded as what it resolved to: ``True``, ``False``, or
``"host:<special tokens>"`` (e.g. ``"host:[CLS]+text+[SEP]"``). Token ids passed by the caller
are used exactly as given and recorded as :data:`TOKENS_GIVEN`.

**Token scopes** (``token_scope``, :data:`TokenScope`): which real tokens of a prompt a
per-token quantity is reduced over (:data:`TOKEN_SCOPES` has their definitions; the mask is
:func:`scope_mask`).

**Batches**: right padding keeps every real token at its true position (absolute and rotary
position encodings see the positions of an unpadded run) and, in causal models, real tokens
never attend to padding; padded positions never enter a norm (:attr:`TokenBatch.mask`).
:func:`plan_batches` runs prompts that fit one batch in the caller's order and groups more into
length buckets, whatever the hooks (two runs that differ only in their hooks batch identically); a
hook sees the batch it runs on as :class:`BatchInfo`.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Literal, Protocol, Sequence, get_args, runtime_checkable

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from thermo_lens.core.errors import PromptTooShortError, ThermoLensInputError, ThermoLensInputTypeError
from thermo_lens.core.model import ModelView

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "BosMode", "BosModeName", "BOS_MODES", "HOST_BOS", "TOKENIZER_BOS", "TOKENS_GIVEN", "check_bos", "bos_modes_text",
    "TokenScope", "TermScope", "TOKEN_SCOPES", "TERM_SCOPES", "scope_mask", "check_token_scope",
    "TokenBatch", "BatchInfo", "encoder", "encode", "tokenize", "token_batch", "plan_batches", "MAX_PADDING",
    "validate_prompts", "bos_id", "host_tokens", "resolve_host_bos", "hf_tokenizer",
]

#: The named BOS modes (the others are ``True`` and ``False``).
BosModeName = Literal["host", "tokenizer"]
#: What ``prepend_bos`` accepts (see the module docstring).
BosMode = BosModeName | bool
_BOS_NAMES: tuple[BosModeName, ...] = get_args(BosModeName)
HOST_BOS: BosModeName = _BOS_NAMES[0]
TOKENIZER_BOS: BosModeName = _BOS_NAMES[1]
#: Every BOS mode, the one list of them (the check, its message, spec files and the command line read it).
BOS_MODES: tuple[BosMode, ...] = (HOST_BOS, True, False, *_BOS_NAMES[1:])
#: The ``prepend_bos`` recorded when the caller passed token ids: they are used exactly as given.
TOKENS_GIVEN = "tokens_as_given"


def bos_modes_text(quote: str = '"', bools: tuple[str, str] = ("True", "False")) -> str:
    """The BOS modes in words, ``'"host", True, False or "tokenizer"'`` (``quote`` around the named
    ones; ``bools``: how the booleans are spelt, ``("true", "false")`` in a spec file)."""
    words = [bools[0] if m is True else bools[1] if m is False else f"{quote}{m}{quote}" for m in BOS_MODES]
    return ", ".join(words[:-1]) + f" or {words[-1]}"


def check_bos(value: object, name: str = "prepend_bos") -> BosMode:
    """The one check of a ``prepend_bos`` value: ``value`` if it is one of :data:`BOS_MODES`, else
    a :class:`ThermoLensInputError` naming them. Run once, when the run settings are made
    (:class:`thermo_lens.core.settings.RunSettings`), never again per prompt."""
    if isinstance(value, bool):
        return value
    for mode in _BOS_NAMES:
        if value == mode:
            return mode
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:80] + "...(cut)"
    raise ThermoLensInputError(f"{name} must be {bos_modes_text()}, got {type(value).__name__} {shown}")


#: The token scopes of per-prompt reductions.
TokenScope = Literal["last", "all_but_first", "all", "frobenius"]
#: The token scopes of per-token additive terms (:data:`TERM_SCOPES`: no ``frobenius``).
TermScope = Literal["all_but_first", "all", "last"]

#: Token scope name -> its definition (recorded in every result). ``g(a -> b)`` reduces a pair of
#: residual states; per-token terms (the attribution, write norms) use the mean scopes and ``last``.
TOKEN_SCOPES: dict[str, str] = {
    "last": "last real token of each prompt (padding-aware): ||x_b[t_last]|| / ||x_a[t_last]||",
    "all_but_first": (
        "mean over real tokens t = 1..n-1 (position 0 excluded) of the per-token ratios "
        "||x_b[t]|| / ||x_a[t]|| (mean of ratios, not ratio of mean norms)"
    ),
    "all": "mean over all real tokens t = 0..n-1 of the per-token ratios ||x_b[t]|| / ||x_a[t]||",
    "frobenius": (
        "ratio of Frobenius norms over all real tokens: ||X_b||_F / ||X_a||_F, X = x[0..n-1] [n, d_model]"
    ),
}


def check_token_scope(value: object, allowed: Iterable[str] | None = None, *, why: str = "",
                      name: str = "token_scope", refused: dict[str, str] | None = None) -> str:
    """The one check of every ``token_scope`` option (entry points, measurements, reductions):
    ``value`` if it is one of ``allowed`` (default: every scope of :data:`TOKEN_SCOPES`), else a
    :class:`ThermoLensInputError` naming the allowed scopes (``why``: what the scopes are for;
    ``refused``: a scope that exists but does not apply here -> the message saying why)."""
    names = list(TOKEN_SCOPES if allowed is None else allowed)
    if isinstance(value, str) and value in names:
        return value
    if refused and isinstance(value, str) and value in refused:
        raise ThermoLensInputError(refused[value])
    shown = repr(value[:81]) if isinstance(value, str) else f"{type(value).__name__} {value!r}"
    if len(shown) > 80:
        shown = shown[:80] + "...(cut)"
    raise ThermoLensInputError(
        f"unknown {name} {shown}: {name} must be one of {', '.join(names)}{why} "
        f"(choose one of {', '.join(map(repr, names))}; definitions in thermo_lens.core.tokens.TOKEN_SCOPES)")


#: Token scopes of per-token additive terms (the gain attribution, head write norms): means over
#: the scope's real tokens of a per-token quantity (``frobenius``, a ratio of whole-sequence norms,
#: has no per-token form).
TERM_SCOPES: dict[str, str] = {
    "all_but_first": "mean over real tokens t = 1..n-1 (position 0, the BOS/first token, excluded)",
    "all": "mean over all real tokens t = 0..n-1",
    "last": "the last real token of each prompt",
}
# The Literal types are the one list of scope names; the definitions are keyed by exactly those.
for _names, _defined in ((get_args(TokenScope), TOKEN_SCOPES), (get_args(TermScope), TERM_SCOPES)):
    if tuple(_defined) != _names:  # pragma: no cover - a scope added to one list and not the other
        raise ImportError(f"token scopes {_names} and their definitions {tuple(_defined)} disagree")


def scope_mask(lengths: Int[Tensor, " batch"], width: int, token_scope: str,
               device: torch.device | str | None = None) -> Bool[Tensor, "batch pos"]:
    """``[batch, pos]`` True on the tokens a scope reduces over: the last real token (``last``),
    the real tokens from position 1 (``all_but_first``) or every real token (``all``,
    ``frobenius``). Padding (positions ``>= lengths[b]``) is never in scope."""
    lengths = lengths.to(device) if device is not None else lengths
    pos = torch.arange(width, device=lengths.device)[None, :]
    if token_scope == "last":
        return pos == (lengths - 1)[:, None]
    mask = pos < lengths[:, None]
    if token_scope == "all_but_first":
        mask = mask & (pos > 0)
    else:
        check_token_scope(token_scope)
    return mask


def scope_rows(lengths: Sequence[int], width: int, token_scope: str) -> tuple[Tensor, Tensor, Tensor]:
    """The tokens a scope reduces over (:func:`scope_mask`'s True entries), built on the host from
    the rows' lengths (Python ints: no device sync, no data-dependent shape on a device):
    ``(rows, prompt_of, n)``, the flat ``b * width + t`` index ``[n_rows]`` int64 of each scoped
    token in row-major order, its row ``b`` ``[n_rows]`` int64, and the scoped tokens per row
    ``[batch, 1]`` float64, at least 1. On the CPU; move them once per batch."""
    check_token_scope(token_scope)
    flat: list[int] = []
    prompt_of: list[int] = []
    counts: list[float] = []
    for b, n in enumerate(lengths):
        n = min(int(n), width)
        first, stop = (n - 1, n) if token_scope == "last" else (1 if token_scope == "all_but_first" else 0, n)
        first = max(first, 0)
        flat.extend(range(b * width + first, b * width + stop))
        prompt_of.extend([b] * max(stop - first, 0))
        counts.append(float(max(stop - first, 1)))
    return (torch.tensor(flat, dtype=torch.long), torch.tensor(prompt_of, dtype=torch.long),
            torch.tensor(counts, dtype=torch.float64)[:, None])


def to_device(t: Tensor, device: torch.device | str) -> Tensor:
    """A host-built tensor (an index, a mask) on ``device``: on CUDA through pinned memory without
    waiting (the copy is queued on the stream like a kernel: the host does not wait for the device);
    elsewhere ``t.to(device)``."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


# ---------------------------------------------------------------------------- batches
@dataclass(frozen=True)
class TokenBatch:
    """A right-padded batch of prompts.

    Attributes:
        tokens: ``[batch, pos]`` token ids (padding after each prompt's real tokens).
        lengths: ``[batch]`` real tokens per prompt (BOS included when prepended).
        prompt_index: ``[batch]`` index of each row in the caller's prompt list.
        prepend_bos: the BOS mode used (``"host"`` as it resolved; :data:`TOKENS_GIVEN` for ids).
        truncated: per row, whether the prompt was cut to the context.
        length_list: ``lengths`` as Python ints (the host's own copy: the pass sizes and indexes
            with it without reading a tensor back); empty when not given, then read from
            ``lengths`` on first use (:attr:`host_lengths`).
    """

    tokens: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]
    prompt_index: Int[Tensor, " batch"]
    prepend_bos: bool | str
    truncated: tuple[bool, ...] = field(default=())
    length_list: tuple[int, ...] = field(default=(), compare=False)

    @property
    def host_lengths(self) -> tuple[int, ...]:
        """The rows' real lengths as Python ints."""
        if len(self.length_list) != int(self.tokens.shape[0]):
            object.__setattr__(self, "length_list", tuple(int(n) for n in self.lengths.tolist()))
        return self.length_list

    @property
    def mask(self) -> Bool[Tensor, "batch pos"]:
        """True on real tokens, False on padding."""
        pos = torch.arange(self.tokens.shape[1], device=self.lengths.device)
        return pos[None, :] < self.lengths[:, None]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def select(self, rows: Sequence[int]) -> "TokenBatch":
        """The sub-batch of ``rows`` (in that order), re-padded to its own longest prompt."""
        rows = [int(i) for i in rows]
        idx = torch.as_tensor(rows, dtype=torch.long)
        own = self.host_lengths
        length_list = tuple(own[i] for i in rows)
        return TokenBatch(
            tokens=self.tokens[idx, : max(length_list)],
            lengths=self.lengths[idx],
            prompt_index=self.prompt_index[idx],
            prepend_bos=self.prepend_bos,
            truncated=tuple(self.truncated[i] for i in rows),
            length_list=length_list,
        )


@dataclass(frozen=True)
class BatchInfo:
    """The batch a hook is running on (``hook.ctx["batch"]`` inside a thermo-lens run).

    Attributes:
        prompt_index: ``[batch]`` index of each row in the caller's prompt list.
        lengths: ``[batch]`` real tokens of each row (BOS included when prepended); positions
            ``>= lengths[b]`` are padding (right padding: real tokens keep their positions).
        batch: number of this batch (0-based) and ``n_batches`` the number of batches.
        width: the padded length of this batch.
    """

    prompt_index: Tensor
    lengths: Tensor
    batch: int
    n_batches: int
    width: int

    @property
    def mask(self) -> Tensor:
        """``[batch, pos]`` True on real tokens."""
        return torch.arange(self.width)[None, :] < self.lengths[:, None]

    @classmethod
    def of(cls, tb: TokenBatch, batch: int, n_batches: int, prompt_index: Tensor | None = None) -> "BatchInfo":
        return cls(prompt_index=(tb.prompt_index if prompt_index is None else prompt_index).clone(),
                   lengths=tb.lengths.clone(), batch=batch, n_batches=n_batches, width=int(tb.tokens.shape[1]))


#: Bucketing bound: a length bucket pads at most this fraction of its token positions.
MAX_PADDING = 0.10


def _chunks(n: int, size: int) -> Iterable[range]:
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


def plan_batches(
    lengths: Sequence[int] | Tensor,
    batch_size: int,
    *,
    sort_by_length: bool | None = None,
    max_padding: float | None = MAX_PADDING,
) -> list[list[int]]:
    """The prompt indices of each padded forward batch of a run.

    ``sort_by_length=None`` (the default of every entry point): one batch in the caller's order
    when every prompt fits one batch (``len(lengths) <= batch_size``), else length buckets as for
    ``True``. ``sort_by_length=False``: the caller's order, ``batch_size`` prompts per batch.
    ``sort_by_length=True, max_padding=None``: prompts in order of token length (stable), then
    ``batch_size`` per batch. ``sort_by_length=True`` with ``max_padding``: length buckets; in
    length order, a batch is closed when it holds ``batch_size`` prompts or when adding the next
    (longest so far) prompt would make more than ``max_padding`` of the batch's positions padding.
    Every batch then pads at most ``max_padding`` of its positions (so does the whole run); the
    price is more, smaller batches when lengths are spread out.

    The plan depends on the token lengths and these settings only, never on hooks: two runs of
    the same prompts and settings batch identically, so a paired difference between them (an
    ablation against the clean run) holds exactly the hooks' effect, no float rounding of
    differently shaped batches.
    """
    n = [int(x) for x in (lengths.tolist() if isinstance(lengths, Tensor) else lengths)]
    if sort_by_length is None:
        if len(n) <= batch_size:
            return [list(range(len(n)))]
        sort_by_length = True
    if not sort_by_length:
        return [list(r) for r in _chunks(len(n), batch_size)]
    order = sorted(range(len(n)), key=lambda i: n[i])
    if max_padding is None:
        return [[order[k] for k in ks] for ks in _chunks(len(n), batch_size)]
    out: list[list[int]] = []
    cur: list[int] = []
    real = 0
    for i in order:
        if cur:
            width = n[i]  # sorted: the newcomer is the longest
            padded = (len(cur) + 1) * width
            if len(cur) >= batch_size or 1 - (real + n[i]) / padded > max_padding:
                out.append(cur)
                cur, real = [], 0
        cur.append(i)
        real += n[i]
    if cur:
        out.append(cur)
    return out


# ---------------------------------------------------------------------------- tokenization
@runtime_checkable
class PromptRows(Protocol):
    """Normalised prompts (:class:`thermo_lens.core.inputs.PromptList`): texts, and the token ids
    of each row when the caller gave ids."""

    @property
    def texts(self) -> Sequence[str]: ...

    @property
    def token_ids(self) -> Sequence[Sequence[int]] | None: ...


def bos_id(view: ModelView) -> int:
    """The id ``prepend_bos=True`` prepends: the tokenizer's BOS, or ``[CLS]`` for BERT-style
    tokenizers (which have no BOS)."""
    tok = view.tokenizer
    bos = getattr(tok, "bos_token_id", None)
    cls = getattr(tok, "cls_token_id", None)
    # The bridge installs a fallback bos_token ('<|endoftext|>') that a WordPiece vocabulary maps
    # to [UNK]: never use that.
    if cls is not None and (bos is None or bos == getattr(tok, "unk_token_id", None)):
        bos = cls
    if bos is None:
        raise ThermoLensInputError(
            f"{view.name}: the tokenizer has no BOS (or CLS) token, so prepend_bos=True is "
            "impossible; pass prepend_bos=False or prepend_bos='tokenizer'."
        )
    return int(bos)


@functools.lru_cache(maxsize=16)
def _auto_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path)


def hf_tokenizer(view: ModelView) -> PreTrainedTokenizerBase:
    """The tokenizer exactly as ``AutoTokenizer.from_pretrained`` loads it (the paper's).

    ``TransformerBridge.boot_transformers`` reloads the tokenizer with ``add_bos_token=True``,
    so ``model.tokenizer(..., add_special_tokens=True)`` prepends BOS even for GPT-2/NeoX
    tokenizers that add none; ``prepend_bos="tokenizer"`` must use this one instead. Falls back
    to the model's tokenizer (with a warning) when it cannot be reloaded.
    """
    name = getattr(view.tokenizer, "name_or_path", None)
    try:
        return _auto_tokenizer(str(name)) if name else view.tokenizer
    except Exception as e:  # noqa: BLE001 - depends on the user's files / network
        warnings.warn(
            f"could not reload the HF tokenizer {name!r} ({e}); prepend_bos='tokenizer' uses "
            "the model's tokenizer as TransformerLens configured it", stacklevel=3)
        return view.tokenizer


def host_tokens(view: ModelView, prompt: str) -> list[int]:
    """Token ids of ``prompt`` exactly as the host tokenizes it: ``model.to_tokens(prompt)``
    (what ``model.run_with_cache(prompt)`` runs), untruncated."""
    ids = view.adapter.to_tokens(view.model, prompt)
    if ids is None:  # a duck-typed host without to_tokens: TransformerLens' default
        return [bos_id(view)] + list(view.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    return ids


def resolve_host_bos(view: ModelView, prompt: str, ids: list[int] | None = None) -> bool | str:
    """What ``prepend_bos="host"`` does to ``prompt``: ``True`` (the host prepends the BOS that
    ``prepend_bos=True`` prepends), ``False`` (no special token), or
    ``"host:<prefix>+text+<suffix>"`` naming the special tokens it adds (BERT:
    ``"host:[CLS]+text+[SEP]"``)."""
    ids = host_tokens(view, prompt) if ids is None else ids
    tok = view.tokenizer
    plain = list(tok(prompt, add_special_tokens=False)["input_ids"])
    if ids == plain:
        return False
    try:
        if ids == [bos_id(view)] + plain:
            return True
    except ThermoLensInputError:
        pass
    n = len(plain)
    for start in range(len(ids) - n + 1):
        if ids[start:start + n] == plain:
            def conv(t: list[int]) -> str:
                return "".join(tok.convert_ids_to_tokens(t))
            pre, post = conv(ids[:start]), conv(ids[start + n:])
            return "host:" + "+".join([*([pre] if pre else []), "text", *([post] if post else [])])
    return "host:own"  # the host's tokens are not the plain tokens plus specials


def encoder(view: ModelView, prepend_bos: BosMode | str) -> Callable[[str], list[int]]:
    """The function ``prompt -> token ids`` of a BOS mode (see the module docstring), chosen once
    for a batch: the mode is read here, not per prompt. ``prepend_bos`` is a :data:`BosMode` (checked
    when the run settings were made) or what ``"host"`` resolved to (``"host:..."``, as results
    record it)."""
    if isinstance(prepend_bos, str) and (prepend_bos == HOST_BOS or prepend_bos.startswith("host:")):
        return functools.partial(host_tokens, view)
    if prepend_bos == TOKENIZER_BOS:  # the HF tokenizer with its own special tokens
        tok, prefix, special = hf_tokenizer(view), [], True
    elif prepend_bos is True or prepend_bos is False:
        tok, prefix, special = view.tokenizer, [bos_id(view)] if prepend_bos else [], False
    else:
        raise ThermoLensInputError(f"prepend_bos must be {bos_modes_text()}, got {prepend_bos!r}")

    def encode_one(prompt: str) -> list[int]:
        return prefix + list(tok(prompt, add_special_tokens=special)["input_ids"])

    return encode_one


def encode(view: ModelView, prompt: str, prepend_bos: BosMode | str) -> list[int]:
    """Token ids of one prompt under a BOS mode (see the module docstring and :func:`encoder`)."""
    return encoder(view, prepend_bos)(prompt)


def _pad_id(view: ModelView) -> int:
    pad = getattr(view.tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(view.tokenizer, "eos_token_id", None) or 0
    return int(pad)


def _fit(view: ModelView, ids: list[int], i: int, truncate: bool, min_tokens: int, label: str, how: str) -> list[int]:
    """``ids`` cut to the context (or an error) and checked against ``min_tokens``."""
    if len(ids) > view.n_ctx:
        if not truncate:
            raise ThermoLensInputError(
                f"prompt {i} is {len(ids)} tokens long but {view.name} has a context of {view.n_ctx} "
                f"tokens; shorten it, or pass truncate=True to keep its first {view.n_ctx} tokens.")
        ids = ids[: view.n_ctx]
    if len(ids) < min_tokens:
        raise PromptTooShortError(
            f"{label} has {len(ids)} token(s){how}; this measurement needs at least {min_tokens}.")
    return ids


def _batch(view: ModelView, rows: list[list[int]], index: Sequence[int], prepend_bos: bool | str,
           truncated: list[bool]) -> TokenBatch:
    width, pad = max(len(r) for r in rows), _pad_id(view)
    # padded on the host, then one tensor (not one copy per row)
    tokens = torch.tensor([list(r) + [pad] * (width - len(r)) for r in rows], dtype=torch.long)
    return TokenBatch(tokens=tokens, lengths=torch.tensor([len(r) for r in rows], dtype=torch.long),
                      prompt_index=torch.tensor(list(index), dtype=torch.long), prepend_bos=prepend_bos,
                      truncated=tuple(truncated), length_list=tuple(len(r) for r in rows))


def tokenize(
    view: ModelView,
    prompts: object,  # checked here (validate_prompts), with its own messages
    *,
    prepend_bos: BosMode | str,
    truncate: bool = False,
    min_tokens: int = 1,
    prompt_index: Sequence[int] | None = None,
) -> TokenBatch:
    """Tokenize prompt texts into one right-padded :class:`TokenBatch`.

    Args:
        view: the model.
        prompts: non-empty strings.
        prepend_bos: a :data:`BosMode`. No default: it changes every number. The batch records
            what ``"host"`` resolved to (:func:`resolve_host_bos`).
        truncate: cut prompts longer than ``n_ctx`` to their first ``n_ctx`` tokens instead of
            raising.
        min_tokens: prompts with fewer tokens raise (e.g. 2 for metrics needing a token beyond
            position 0).
        prompt_index: indices of these prompts in the caller's list (for error messages).
    """
    prompts = validate_prompts(prompts)
    index = list(prompt_index) if prompt_index is not None else list(range(len(prompts)))
    rows, truncated, resolved = [], [], []
    encode_one = encoder(view, prepend_bos)  # the BOS mode read once for the batch
    for i, p in zip(index, prompts):
        ids = encode_one(p)
        if prepend_bos == HOST_BOS:
            resolved.append(resolve_host_bos(view, p, ids))
        truncated.append(len(ids) > view.n_ctx)
        rows.append(_fit(view, ids, i, truncate, min_tokens, f"prompt {i} ({p!r})", f" with prepend_bos={prepend_bos!r}"))
    if resolved:
        kinds = list(dict.fromkeys(resolved))
        prepend_bos = kinds[0] if len(kinds) == 1 else "host:" + "|".join(str(k) for k in kinds)
    return _batch(view, rows, index, prepend_bos, truncated)


def token_batch(view: ModelView, prompts: PromptRows, rows: Sequence[int], *, prepend_bos: BosMode | str, truncate: bool = False,
                min_tokens: int = 1) -> TokenBatch:
    """The batch of rows ``rows`` of normalised prompts (:class:`thermo_lens.core.inputs.PromptList`):
    texts tokenized with ``prepend_bos``, token ids exactly as given (recorded as
    :data:`TOKENS_GIVEN`)."""
    if prompts.token_ids is None:
        return tokenize(view, [prompts.texts[i] for i in rows], prepend_bos=prepend_bos, truncate=truncate,
                        min_tokens=min_tokens, prompt_index=list(rows))
    ids, truncated = [], []
    for i in rows:
        r = list(prompts.token_ids[i])
        truncated.append(len(r) > view.n_ctx)
        ids.append(_fit(view, r, i, truncate, min_tokens, f"prompt {i}", " as given"))
    return _batch(view, ids, list(rows), TOKENS_GIVEN, truncated)


def validate_prompts(prompts: object) -> list[str]:
    """Check a prompt list: a non-empty list of non-empty strings (clear errors otherwise)."""
    if isinstance(prompts, str):
        raise ThermoLensInputError("expected a list of prompts, got a single string; wrap it: [prompt]")
    if prompts is None:
        raise ThermoLensInputError("expected a list of prompts, got None")
    if not isinstance(prompts, Iterable):
        raise ThermoLensInputError(f"expected a list of prompt strings, got {type(prompts).__name__}")
    given: list[object] = list(prompts)
    if not given:
        raise ThermoLensInputError("the prompt list is empty; pass at least one prompt")
    out: list[str] = []
    for i, p in enumerate(given):
        if not isinstance(p, str):
            raise ThermoLensInputTypeError(f"prompt {i} is a {type(p).__name__} ({p!r}), not a string")
        if not p.strip():
            raise ThermoLensInputError(f"prompt {i} is an empty string")
        out.append(p)
    return out
