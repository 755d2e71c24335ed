"""A lab recipe (everything that decides a trained model) and the knobs that vary it.

A :class:`Recipe` is a flat, frozen record: architecture fields (:class:`~thermo_lens.experiments.lab.
architecture.Architecture`) plus data, tokenizer and optimisation fields. A knob names one field
and the levels it may take; :data:`KNOBS` is the registry, and every error about a knob or a level
names it and lists what is valid.

Optimiser levels (``optimizer``):

``adamw-b2=0.95``   ``torch.optim.AdamW``, betas (0.9, 0.95) (GPT-3 / Pythia style)
``adamw-b2=0.999``  ``torch.optim.AdamW``, betas (0.9, 0.999) (the PyTorch default)
``sgd-momentum``    ``torch.optim.SGD``, momentum 0.9, peak learning rate ``lr * sgd_lr_scale``

Weight decay is decoupled (``p <- p * (1 - lr_t * weight_decay)`` at every step, ``lr_t`` the
scheduled AdamW-scale learning rate) for every optimiser, so the optimiser knob changes the
gradient step only. It applies to matrices (``ndim >= 2``: weights and embeddings), not to
biases or LayerNorm parameters. Schedule: linear warm-up over ``warmup_steps`` then cosine decay
to ``min_lr_ratio * lr``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields, replace
from collections.abc import Callable, Mapping
from typing import Any

from thermo_lens.experiments.lab.architecture import Architecture
from thermo_lens.core.errors import ThermoLensInputError

__all__ = ["Recipe", "Knob", "KNOBS", "OPTIMIZERS", "ACTIVATIONS", "FIELD_RANGES", "LabSpecError", "check_level",
           "check_field", "check_recipe"]


class LabSpecError(ThermoLensInputError):
    """A malformed lab spec: unknown knob, unknown level, bad field; the message names it."""


#: A recipe field's value (every :class:`Recipe` field is a str, an int or a float), so also a knob's level.
FieldValue = str | int | float

#: Optimiser level -> (torch class name, settings).
OPTIMIZERS: dict[str, dict[str, Any]] = {
    "adamw-b2=0.95": {"class": "AdamW", "betas": (0.9, 0.95)},
    "adamw-b2=0.999": {"class": "AdamW", "betas": (0.9, 0.999)},
    "sgd-momentum": {"class": "SGD", "momentum": 0.9},
}


#: Activations every lab family (GPT-2, OPT, GPT-NeoX) and TransformerBridge accept by name.
ACTIVATIONS = ("gelu_new", "gelu", "gelu_fast", "gelu_pytorch_tanh", "relu", "silu")


@dataclass(frozen=True)
class Recipe(Architecture):
    """Everything that decides one trained lab model, apart from the seed.

    The architecture fields are :class:`~thermo_lens.experiments.lab.architecture.Architecture`'s, in
    its order and with its defaults, except ``n_layers`` (3 here: a lab's profile wants more than
    the two blocks an architecture needs); the fields below come after them.
    """

    n_layers: int = 3
    init_scale: float = 1.0
    # data and tokenizer
    data: str = "stdlib-docstrings"
    vocab_size: int = 1024
    min_frequency: int = 2
    # optimisation
    optimizer: str = "adamw-b2=0.95"
    lr: float = 3e-3
    sgd_lr_scale: float = 30.0
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    grad_clip_norm: float = 1.0
    batch_size: int = 16
    block_size: int = 64
    steps: int = 400

    def architecture(self) -> Architecture:
        names = {f.name for f in fields(Architecture)}
        return Architecture(**{k: v for k, v in asdict(self).items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def hash(self) -> str:
        """First 10 hex digits of the SHA-256 of the recipe's JSON (names a run directory).

        Fields added after the first labs (:data:`_ADDED_FIELDS`) enter only when they differ from
        their default, so adding a field never renames the runs of an existing lab.
        """
        d = {k: v for k, v in self.to_dict().items() if not (k in _ADDED_FIELDS and v == _DEFAULTS[k])}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]

    def differences(self, other: "Recipe") -> dict[str, tuple[Any, Any]]:
        """``{field: (self's, other's)}`` for every field that differs."""
        a, b = self.to_dict(), other.to_dict()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


_ADDED_FIELDS = frozenset({"embed_proj_dim"})
_DEFAULTS = {f.name: f.default for f in fields(Recipe)}


@dataclass(frozen=True)
class Knob:
    """One field of the recipe a lab varies, with what its levels may be."""

    name: str
    field: str
    description: str
    choices: tuple[str, ...] | None = None          # categorical levels
    check: Callable[[float], bool] | None = None    # numeric levels
    valid: str = ""                                 # how to say what is valid

    def parse(self, level: object) -> FieldValue:
        """The level as the recipe stores it; :class:`LabSpecError` naming the knob if invalid."""
        if self.choices is not None:
            if not isinstance(level, str) or level not in self.choices:
                raise LabSpecError(f"knob {self.name!r}: unknown level {_excerpt(level)}; valid levels: "
                                   f"{', '.join(map(repr, self.choices))}")
            return level
        check = self.check  # a numeric knob has one (set with its range in KNOBS)
        if isinstance(level, bool) or not isinstance(level, (int, float)) or check is None or not check(level):
            raise LabSpecError(f"knob {self.name!r}: bad level {_excerpt(level)}; valid levels: {self.valid}")
        typ = type(getattr(Recipe(), self.field))
        return typ(level)


def _corpora() -> tuple[str, ...]:
    from thermo_lens.experiments.lab import corpora

    return tuple(corpora.names())


def _knobs() -> dict[str, Knob]:
    ks = [
        Knob("weight_decay", "weight_decay", "decoupled weight decay on matrices (0 = none)",
             check=lambda v: 0 <= v < 1, valid="a number in [0, 1)"),
        Knob("optimizer", "optimizer", "AdamW with beta2 0.95 or 0.999, or SGD with momentum 0.9",
             choices=tuple(OPTIMIZERS)),
        Knob("lr", "lr", "peak learning rate (AdamW scale)", check=lambda v: 0 < v < 1,
             valid="a number in (0, 1)"),
        Knob("warmup_steps", "warmup_steps", "linear warm-up steps before the cosine decay",
             check=lambda v: float(v).is_integer() and v >= 0, valid="an integer >= 0"),
        Knob("init_scale", "init_scale", "multiplier on every initial matrix (embeddings and weights)",
             check=lambda v: 0 < v <= 100, valid="a number in (0, 100]"),
        Knob("embeddings", "embeddings", "unembedding tied to the embedding or its own matrix",
             choices=("tied", "untied")),
        Knob("attention", "attention", "attention and MLP in sequence, or in parallel (GPT-J / Pythia)",
             choices=("sequential", "parallel")),
        Knob("positions", "positions", "learned absolute position embeddings or rotary (RoPE)",
             choices=("learned", "rotary")),
        Knob("norm", "norm", "LayerNorm before each sublayer (pre-LN) or after the residual add (post-LN)",
             choices=("pre", "post")),
        Knob("data", "data", "training corpus (thermo_lens.experiments.lab.corpora)", choices=_corpora()),
    ]
    return {k.name: k for k in ks}


#: Knob name -> :class:`Knob`.
KNOBS: dict[str, Knob] = _knobs()


# ---------------------------------------------------------------------------- field ranges
def _int_range(lo: int, hi: int, why: str = "") -> tuple[str, Callable[[Any], bool], str]:
    return ("int", lambda v: lo <= v <= hi, f"an integer in [{lo:,}, {hi:,}]" + (f" ({why})" if why else ""))


def _real(test: Callable[[float], bool], valid: str) -> tuple[str, Callable[[Any], bool], str]:
    return ("float", lambda v: not math.isnan(v) and test(v), valid)


#: Recipe field -> (type, check, what is valid) for every field that is not a knob (a knob's
#: levels are checked by its :class:`Knob`). The caps keep a lab a toy trained on one CPU: a
#: value past them is a typo, and would exhaust memory (vocab_size 10^9) or never finish.
FIELD_RANGES: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    "n_layers": _int_range(2, 256, "the profile's L* needs at least two blocks"),
    "d_model": _int_range(1, 8192),
    "n_heads": _int_range(1, 1024),
    "d_mlp": _int_range(1, 65536),
    "n_ctx": _int_range(1, 65536),
    "activation": ("str", lambda v: v in ACTIVATIONS, "one of " + ", ".join(ACTIVATIONS)),
    "embed_proj_dim": _int_range(0, 8192, "0: no projection"),
    "rotary_pct": _real(lambda v: 0 < v <= 1, "a number in (0, 1]: the fraction of each head's dimensions that rotate"),
    "rotary_base": _real(lambda v: 1 < v <= 1e9, "a number in (1, 1e9]"),
    "initializer_range": _real(lambda v: 0 < v <= 1, "a number in (0, 1]: the std of the initial weights"),
    "vocab_size": _int_range(257, 131072, "the 256 byte tokens and <|endoftext|> come first"),
    "min_frequency": _int_range(0, 1_000_000),
    "sgd_lr_scale": _real(lambda v: 0 < v <= 1e6, "a number in (0, 1e6]"),
    "eps": _real(lambda v: 0 < v < 1, "a number in (0, 1)"),
    "min_lr_ratio": _real(lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "grad_clip_norm": _real(lambda v: v > 0, "a number > 0 (inf: no clipping)"),
    "batch_size": _int_range(1, 65536),
    "block_size": _int_range(1, 65536, "and at most n_ctx"),
    "steps": _int_range(1, 10_000_000),
}


def check_field(name: str, value: object) -> FieldValue:
    """A recipe field's value as the recipe stores it; :class:`LabSpecError` naming the field and
    what is valid (a knob's field is checked as that knob's level)."""
    from thermo_lens.core.validate import excerpt

    knob = next((n for n, kn in KNOBS.items() if kn.field == name), None)
    if knob is not None:
        return check_level(knob, value)
    if name not in FIELD_RANGES:
        raise LabSpecError(f"unknown recipe field; valid: {', '.join(f.name for f in fields(Recipe))}")
    kind, ok, valid = FIELD_RANGES[name]
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool) and ok(value):
            return value
    elif kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and ok(value):
            return float(value)
    elif isinstance(value, str) and ok(value):
        return value
    raise LabSpecError(f"bad value {excerpt(value, 60)}; valid: {valid}")


def check_recipe(r: Recipe) -> None:
    """Every field of ``r`` in range (:func:`check_field`) and the fields consistent with each
    other; :class:`LabSpecError` naming the field (``"field 'd_model': ..."``)."""
    from thermo_lens.experiments.lab.architecture import ArchitectureError, family_of

    for f in fields(Recipe):
        try:
            check_field(f.name, getattr(r, f.name))
        except LabSpecError as e:
            msg = str(e).removeprefix(f"knob {f.name!r}: ")
            raise LabSpecError(f"field '{f.name}': {msg}") from None
    if r.d_model % r.n_heads:
        raise LabSpecError(f"field 'n_heads': d_model {r.d_model} is not divisible by n_heads {r.n_heads}")
    if r.block_size > r.n_ctx:
        raise LabSpecError(f"field 'block_size': block_size {r.block_size} exceeds the context n_ctx {r.n_ctx}")
    if r.positions == "rotary":
        rotary = int(r.d_model // r.n_heads * r.rotary_pct)
        if rotary < 2 or rotary % 2:
            raise LabSpecError(f"field 'rotary_pct': {r.rotary_pct:g} of the head dimension {r.d_model // r.n_heads} "
                               f"is {rotary} rotary dimensions; rotary positions need an even number >= 2")
    try:
        family_of(r.architecture())
    except ArchitectureError as e:
        raise LabSpecError(str(e)) from None


def _excerpt(value: object) -> str:
    """A value from the spec, quoted for a message and cut to a readable length."""
    from thermo_lens.core.validate import excerpt

    return excerpt(value, 60)


def check_level(knob: str, level: object) -> FieldValue:
    """Validate ``level`` of ``knob``; errors name the knob and list the valid knobs or levels."""
    if knob not in KNOBS:
        raise LabSpecError(f"unknown knob {_excerpt(knob)}; valid knobs: {', '.join(KNOBS)}")
    return KNOBS[knob].parse(level)


def with_level(recipe: Recipe, knob: str, level: object) -> Recipe:
    """``recipe`` with ``knob`` set to ``level`` (validated)."""
    return with_fields(recipe, {KNOBS[knob].field: check_level(knob, level)})


def with_fields(recipe: Recipe, changes: Mapping[str, FieldValue]) -> Recipe:
    """``recipe`` with the fields ``changes`` names set. The names come from a spec at run time, so
    :func:`check_field` and :func:`check_recipe` check them, not the type checker."""
    kw: dict[str, Any] = dict(changes)
    return replace(recipe, **kw)
