"""The paper's prompt sets, as named built-in sets.

D'Elia (2026), "Thermodynamic Constraints in Transformer Architectures: A Sheaf-Theoretic
Perspective", measured residual gain on a handful of small prompt sets, one per notebook. They are
shipped verbatim in ``thermo_lens/data/paper_prompts.json`` (see ``thermo_lens.definitions``; "the 25-prompt sets
are 5 categories x 5: Factual, Syntactic, Cliche, Novel, Nonsense") so that a run can be repeated on
exactly the paper's inputs, and any measurement can record which set produced it.

>>> from thermo_lens import prompts
>>> ps = prompts.get("paper25")          # the categorised 5 x 5 set (Grand Unified / twin test)
>>> len(ps), sorted(set(ps.categories))[:2]
(25, ['Cliche', 'Factual'])
>>> prompts.as_prompt_set(["my prompt", "another"]).categories
('all', 'all')

Built-in sets (JSON key = set name; the notebook they come from in brackets):

``grand_unified_twin_gpt2_gptj_25`` (alias ``paper25``, the default)
    25 prompts, 5 categories x 5, stored by category in the JSON. Used for the Grand Unified
    benchmark (the abstract's hierarchy 0.80 / 1.11 / 1.48 / 2.31), the twin (base vs fine-tuned)
    test, the GPT-2 LayerNorm validation and the GPT-J test.
``pythia_family_sweep_25`` (alias ``pythia25``)
    25 prompts used for the Pythia family sweep (the Kleiber r = -0.81 data). Stored in the JSON as
    a *flat* list. Its categories are recovered, not given: see :data:`PYTHIA25_CATEGORY_NOTE`.
``high_rho_hunt_5``, ``clean_residual_3``, ``h4_4``, ``l_star_v3_5``, ``scaling_law_4``, ``ffn_8``,
``opt_anomaly_2``, ``restriction_maps_1``, ``bentov_1``
    flat lists, category ``"all"``.
``input_dependency_5``
    one prompt per category, category = the JSON key as the paper wrote it (``"1_Factual"``, ...),
    so results join to the reference rows ``last_block_gain_alltokens[1_Factual]`` etc.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

__all__ = [
    "PromptSet",
    "DEFAULT",
    "ALIASES",
    "CATEGORIES",
    "PYTHIA25_CATEGORY_NOTE",
    "names",
    "aliases",
    "get",
    "as_prompt_set",
]

#: Name of the default prompt set (an alias of ``grand_unified_twin_gpt2_gptj_25``).
DEFAULT = "paper25"

#: Friendly alias -> canonical JSON name.
ALIASES: dict[str, str] = {
    "paper25": "grand_unified_twin_gpt2_gptj_25",
    "pythia25": "pythia_family_sweep_25",
}

#: The five categories of the paper's 25-prompt sets, in the paper's order.
CATEGORIES: tuple[str, ...] = ("Factual", "Syntactic", "Cliche", "Novel", "Nonsense")

#: Why ``pythia_family_sweep_25`` carries categories although the JSON stores a flat list.
PYTHIA25_CATEGORY_NOTE = (
    "pythia_family_sweep_25 is stored as a flat list of 25 prompts. It is 5 contiguous blocks of 5 "
    "whose content matches the categorised set's categories in the same order "
    "(Factual, Syntactic, Cliche, Novel, Nonsense): 1-5 are encyclopaedic facts, 6-10 long "
    "multi-clause sentences, 11-15 proverbs, 16-20 technical/novel statements, 21-25 word salad; "
    "and blocks 1, 3, 4, 5 each share a prompt (or its opening words) with the same category of "
    "grand_unified_twin_gpt2_gptj_25 ('The largest planet in our solar system is', 'Actions speak "
    "louder than', 'The epistemological implications of quantum decoherence suggest that ...', "
    "'Table sky run blue jump ...'). The categories are therefore inferred from position and "
    "content; the paper's file does not label them."
)

_DATA_FILE = "paper_prompts.json"
_SOURCE = "D'Elia (2026) released prompts, thermo_lens/data/paper_prompts.json"


@dataclass(frozen=True)
class PromptSet:
    """An ordered, immutable set of prompts with one category per prompt.

    Attributes
    ----------
    name:
        Set name (canonical name for built-in sets; ``"custom"`` unless given for user sets).
    prompts:
        The prompts, in order.
    categories:
        Category of each prompt, same length as ``prompts`` (``"all"`` when uncategorised).
    source:
        Where the prompts came from (free text, recorded with results).
    """

    name: str
    prompts: Sequence[str]  # stored as a tuple (lists are accepted)
    categories: Sequence[str]
    source: str = "user"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"PromptSet.name must be a non-empty str, got {self.name!r}")
        if isinstance(self.prompts, (str, bytes)) or isinstance(self.categories, (str, bytes)):
            raise TypeError("PromptSet.prompts and .categories must be sequences of str, not a str")
        prompts = tuple(self.prompts)
        categories = tuple(self.categories)
        _check_prompts(prompts, what=f"PromptSet {self.name!r}")
        if len(categories) != len(prompts):
            raise ValueError(
                f"PromptSet {self.name!r}: {len(prompts)} prompts but {len(categories)} categories"
            )
        for i, c in enumerate(categories):
            if not isinstance(c, str) or not c:
                raise TypeError(f"PromptSet {self.name!r}: category {i} is {c!r}, not a non-empty str")
        object.__setattr__(self, "prompts", prompts)
        object.__setattr__(self, "categories", categories)

    def __len__(self) -> int:
        return len(self.prompts)

    def __iter__(self) -> Iterator[str]:
        return iter(self.prompts)

    def __getitem__(self, i: int) -> str:
        return self.prompts[i]

    def by_category(self) -> dict[str, tuple[str, ...]]:
        """Category -> its prompts, categories in order of first appearance."""
        out: dict[str, list[str]] = {}
        for p, c in zip(self.prompts, self.categories):
            out.setdefault(c, []).append(p)
        return {c: tuple(ps) for c, ps in out.items()}

    @property
    def category_names(self) -> tuple[str, ...]:
        """Distinct categories, in order of first appearance."""
        return tuple(dict.fromkeys(self.categories))

    def __repr__(self) -> str:
        counts = ", ".join(f"{c}={len(v)}" for c, v in self.by_category().items())
        return f"PromptSet(name={self.name!r}, n={len(self)}, categories: {counts})"


def _check_prompts(prompts: tuple, what: str) -> None:
    """The one prompt-list rule (:func:`thermo_lens.core.model.validate_prompts`), messages prefixed
    with ``what``: ``ThermoLensInputError`` (a ``ValueError``; its type errors are also
    ``TypeError``)."""
    from thermo_lens.core.tokens import validate_prompts

    try:
        validate_prompts(prompts)
    except ValueError as e:
        raise type(e)(f"{what}: {e}") from None


@lru_cache(maxsize=1)
def _raw() -> dict:
    text = resources.files("thermo_lens").joinpath("data", _DATA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


@lru_cache(maxsize=None)
def _build(name: str) -> PromptSet:
    raw = _raw()[name]
    source = f"{_SOURCE}, key {name!r}"
    if isinstance(raw, dict):
        prompts: list[str] = []
        cats: list[str] = []
        for cat, items in raw.items():
            items = [items] if isinstance(items, str) else list(items)
            prompts.extend(items)
            cats.extend([cat] * len(items))
        return PromptSet(name, tuple(prompts), tuple(cats), source)
    flat = tuple(raw)
    if name == "pythia_family_sweep_25":
        inferred = tuple(c for c in CATEGORIES for _ in range(5))
        return PromptSet(name, flat, inferred, source + "; categories inferred (5 blocks of 5)")
    return PromptSet(name, flat, ("all",) * len(flat), source)


def names(include_aliases: bool = True) -> list[str]:
    """Names accepted by :func:`get`: the JSON's set names, then (optionally) the aliases."""
    out = list(_raw().keys())
    if include_aliases:
        out += list(ALIASES)
    return out


def aliases() -> dict[str, str]:
    """Alias -> canonical set name."""
    return dict(ALIASES)


def get(name: str = DEFAULT) -> PromptSet:
    """The built-in prompt set ``name`` (a JSON key or an alias; default ``"paper25"``).

    The returned set's ``name`` is the canonical JSON key, so results record the real set.
    Unknown names raise ``KeyError`` listing the available names.
    """
    if not isinstance(name, str):
        raise TypeError(f"prompt set name must be a str, got {type(name).__name__}")
    canonical = ALIASES.get(name, name)
    if canonical not in _raw():
        raise KeyError(f"unknown prompt set {name!r}; available: {', '.join(names())}")
    return _build(canonical)


def as_prompt_set(obj: object,  # a PromptSet, set name, list of strings or {category: [...]}; checked below
                  name: str | None = None) -> PromptSet:
    """Turn ``obj`` into a :class:`PromptSet`.

    - ``PromptSet``: returned as is (renamed if ``name`` is given).
    - ``str``: the name of a built-in set (see :func:`names`). A single prompt must be wrapped in a
      list: ``as_prompt_set(["The capital of France is"])``.
    - ``dict`` category -> list of str (or a single str): categorised set.
    - any other iterable of str (list, tuple, ...): one category, ``"all"``.

    Raises ``TypeError`` for non-string prompts or unsupported types and ``ValueError`` for empty
    input or empty/whitespace prompts.
    """
    if isinstance(obj, PromptSet):
        if name is not None and name != obj.name:
            return PromptSet(name, obj.prompts, obj.categories, obj.source)
        return obj
    if isinstance(obj, str):
        try:
            ps = get(obj)
        except KeyError:
            raise KeyError(
                f"{obj!r} is not a built-in prompt set name (available: {', '.join(names())}); "
                "to use it as a prompt, pass a list: [" + repr(obj) + "]"
            ) from None
        return ps if name is None else PromptSet(name, ps.prompts, ps.categories, ps.source)
    if isinstance(obj, bytes):
        raise TypeError("prompts must be str, not bytes")
    set_name = name if name is not None else "custom"
    if isinstance(obj, Mapping):
        if len(obj) == 0:
            raise ValueError("empty mapping: no categories, no prompts")
        prompts: list = []
        cats: list[str] = []
        for cat, items in obj.items():
            if not isinstance(cat, str) or not cat:
                raise TypeError(f"category keys must be non-empty str, got {cat!r}")
            if isinstance(items, str):
                items = [items]
            elif isinstance(items, (bytes, Mapping)) or not isinstance(items, Iterable):
                raise TypeError(f"category {cat!r}: expected a list of str, got {type(items).__name__}")
            items = list(items)
            if not items:
                raise ValueError(f"category {cat!r} has no prompts")
            prompts.extend(items)
            cats.extend([cat] * len(items))
        _check_prompts(tuple(prompts), what="as_prompt_set")
        return PromptSet(set_name, tuple(prompts), tuple(cats), "user")
    if not isinstance(obj, Iterable):
        raise TypeError(
            f"cannot make a PromptSet from {type(obj).__name__}; pass a list of str, "
            "a dict category -> list of str, a PromptSet or a built-in set name"
        )
    prompts_t = tuple(obj)
    _check_prompts(prompts_t, what="as_prompt_set")
    return PromptSet(set_name, prompts_t, ("all",) * len(prompts_t), "user")
