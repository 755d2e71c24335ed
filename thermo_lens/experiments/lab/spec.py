"""Lab spec files: a base recipe, the knobs to vary with their levels, and the seeds.

A spec (TOML)::

    [lab]
    name = "heritage-lab"
    seeds = [1, 2, 3]
    checkpoints = 8              # log-spaced checkpoints per run, step 0 and the last included
    prompts = "paper25"          # what the battery profiles each checkpoint on
    token_scope = "all_but_first"
    prepend_bos = true
    batch_size = 8               # prompts per profiling forward pass
    truncate = false             # true: cut a prompt longer than the context to its first n_ctx tokens
    budgets = [150, 300, 600]    # optional: train every arm x seed once per budget (each a full schedule)
    checkpoint_every = 50        # optional: also checkpoint every 50 steps (effects at matched val loss)
    primary = [["weight_decay", 0.0]]   # optional: the declared primary family (Holm runs over it) ...
    primary_metrics = ["last_block_gain", "penultimate_gain"]   # ... x these metrics, largest budget

    [base]                       # any Recipe field (thermo_lens.experiments.lab.Recipe); defaults for the rest
    n_layers = 3
    d_model = 64
    steps = 400

    [knobs]
    weight_decay = [0.1, 0.0]    # levels; one must be the base's value (the reference)
    optimizer = ["adamw-b2=0.95", "adamw-b2=0.999", "sgd-momentum"]

    [knobs.attention]            # a knob the base cannot express on its own gets a context:
    levels = ["sequential", "parallel"]
    context = { positions = "rotary" }   # parallel attention exists only with rotary positions

Each knob's arms are ``base + context + {knob: level}``: exactly one field differs between an
arm and its knob's reference arm (``base + context``, at the base's level). Arms with identical
recipes are trained once. Every arm runs every seed; a seed fixes the initial weights (shared by
all arms where shapes allow) and the batch order (shared by all arms on the same corpus).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thermo_lens.experiments.lab.recipe import (_ADDED_FIELDS, _DEFAULTS, KNOBS, FieldValue, LabSpecError, Recipe, check_field,
                                               check_level, check_recipe, with_fields)
from thermo_lens.core.safe_io import printable
from thermo_lens.core.tokens import bos_modes_text

if TYPE_CHECKING:
    from thermo_lens.core.tokens import BosMode  # (importing the lab imports no torch)

__all__ = ["Arm", "KnobSpec", "LabSpec", "load_lab_spec", "parse_lab_spec", "check_lab_spec", "spec_fingerprint",
           "MAX_SEEDS", "MAX_CHECKPOINTS"]

#: A lab trains every arm for every seed, and profiles every checkpoint of every run.
MAX_SEEDS = 1000
MAX_CHECKPOINTS = 1000
MAX_SEED = 2**32 - 2  # torch seeds the batch order with seed + 1
MAX_STEPS = 10_000_000  # the recipe's cap on steps (FIELD_RANGES["steps"])

_LAB_FIELDS: dict[str, Any] = {"name": str, "seeds": list, "checkpoints": int, "prompts": (str, list),
                               "token_scope": str, "prepend_bos": (bool, str), "batch_size": int,
                               "eval_every": int, "truncate": bool, "budgets": list, "checkpoint_every": int,
                               "primary": list, "primary_metrics": list}


@dataclass(frozen=True)
class KnobSpec:
    """One knob of a lab: its levels, the reference level (the base's) and its context."""

    name: str
    levels: tuple[FieldValue, ...]
    reference: FieldValue
    context: tuple[tuple[str, FieldValue], ...] = ()


@dataclass(frozen=True)
class Arm:
    """One trained configuration: an id, its recipe and the (knob, level) it stands for."""

    id: str
    recipe: Recipe
    knob: str
    level: FieldValue


@dataclass(frozen=True)
class LabSpec:
    """A parsed lab spec (see the module docstring)."""

    name: str
    base: Recipe
    knobs: tuple[KnobSpec, ...]
    seeds: tuple[int, ...]
    checkpoints: int = 8
    prompts: str | list[str] = "paper25"
    token_scope: str = "all_but_first"
    prepend_bos: BosMode = True
    batch_size: int = 8
    eval_every: int | None = None
    truncate: bool = False
    path: str | None = None
    #: training budgets (steps): every arm x seed is trained once per budget, each a complete
    #: schedule; empty: one budget, the base's ``steps``.
    budgets: tuple[int, ...] = ()
    #: also checkpoint (and profile) every this many steps (for effects at matched validation loss).
    checkpoint_every: int | None = None
    #: the declared primary family: ``(knob, level)`` comparisons x ``primary_metrics`` at the
    #: largest budget; Holm's adjustment runs over exactly these tests.
    primary: tuple[tuple[str, FieldValue], ...] = ()
    primary_metrics: tuple[str, ...] = ("last_block_gain", "penultimate_gain")

    @property
    def sha256(self) -> str:
        """SHA-256 of the canonical parsed spec (:func:`spec_fingerprint`): every result of the lab
        carries it, ``lab.json`` records it, and tables refuse results of another spec."""
        return spec_fingerprint(self)

    def budget_steps(self) -> tuple[int, ...]:
        """The training budgets in steps (the base's ``steps`` when none are declared)."""
        return self.budgets or (self.base.steps,)

    def settings(self) -> dict[str, Any]:
        """Profiling settings, shared by every checkpoint's profile (a study's settings)."""
        return {"prompts": self.prompts, "prepend_bos": self.prepend_bos, "token_scope": self.token_scope,
                "batch_size": self.batch_size, "truncate": self.truncate}

    def knob_recipe(self, knob: KnobSpec, level: FieldValue) -> Recipe:
        return with_fields(self.base, {**dict(knob.context), KNOBS[knob.name].field: level})

    def arms(self) -> list[Arm]:
        """Every distinct arm, base first; a recipe reached by two knobs is one arm (first name wins)."""
        out: dict[str, Arm] = {self.base.hash: Arm("base", self.base, "base", "base")}
        for k in self.knobs:
            ctx = "".join(f"+{f}={_fmt(v)}" for f, v in k.context)
            for level in k.levels:
                r = self.knob_recipe(k, level)
                if r.hash not in out:
                    out[r.hash] = Arm(f"{k.name}={_fmt(level)}{ctx}", r, k.name, level)
        return list(out.values())

    def comparisons(self) -> list[tuple[str, Any, Any, str, str]]:
        """``(knob, reference level, level, reference arm id, arm id)`` for every non-reference level."""
        ids = {a.recipe.hash: a.id for a in self.arms()}
        out = []
        for k in self.knobs:
            ref = ids[self.knob_recipe(k, k.reference).hash]
            for level in k.levels:
                if level != k.reference:
                    out.append((k.name, k.reference, level, ref, ids[self.knob_recipe(k, level).hash]))
        return out


def _fmt(v: object) -> str:
    return format(v, "g") if isinstance(v, float) else str(v)


def _line(text: str, pattern: str) -> int:
    for i, line in enumerate(text.splitlines()):
        if re.search(pattern, line):
            return i + 1
    return 1


def load_lab_spec(path: str | os.PathLike) -> LabSpec:
    """Parse and validate a lab spec file (TOML).

    Raises:
        LabSpecError: naming the file, the line and the knob, level or field that is wrong, with
            the valid ones.
    """
    from thermo_lens.core.safe_io import SafeIOError, safe_read_text
    from thermo_lens.experiments.study.spec import StudySpecError
    from thermo_lens.experiments.study.spec_file import MAX_SPEC_BYTES, _check_shape, _parse_toml

    path = Path(path)
    shown = printable(path)
    if not os.path.lexists(path):
        raise LabSpecError(f"{shown}: no such lab spec file")
    try:
        text = safe_read_text(path, MAX_SPEC_BYTES, what="lab spec")  # a regular UTF-8 file of at most 1 MiB
        data = _parse_toml(text, shown)
        _check_shape(data, shown)
    except (SafeIOError, StudySpecError) as e:
        raise LabSpecError(str(e)) from None
    try:
        return parse_lab_spec(data, path=str(path), text=text)
    except LabSpecError as e:
        msg = printable(str(e))
        m = re.search(r"(knob|field) '([\w.]+)'", msg)
        line = _line(text, rf"^\s*(\[knobs\.)?{re.escape(m.group(2).split('.')[-1])}\b") if m else 1
        raise LabSpecError(f"{shown}:{line}: {msg}") from None


def parse_lab_spec(data: dict[str, Any], *, path: str | None = None, text: str = "") -> LabSpec:
    """Validate a spec already read into a dict (``{"lab": ..., "base": ..., "knobs": ...}``)."""
    if not isinstance(data, dict):
        raise LabSpecError("a lab spec is a table with [lab], [base] and [knobs]")
    from thermo_lens.core.validate import excerpt

    unknown = set(data) - {"lab", "base", "knobs"}
    if unknown:
        raise LabSpecError(f"field {_key(sorted(map(str, unknown))[0])}: unknown section; expected lab, base, knobs")
    for section in ("lab", "base", "knobs"):
        if not isinstance(data.get(section, {}), dict):
            raise LabSpecError(f"field {_key(section)}: must be a table ([{section}])")
    lab = data.get("lab", {})
    for k, v in lab.items():
        if k not in _LAB_FIELDS:
            raise LabSpecError(f"field {_key('lab.' + k)}: unknown; valid: {', '.join(_LAB_FIELDS)}")
        if not isinstance(v, _LAB_FIELDS[k]) or (isinstance(v, bool) and _LAB_FIELDS[k] is int):
            raise LabSpecError(f"field 'lab.{k}': bad value {excerpt(v, 60)}")
    seeds = lab.get("seeds", [0])
    if not seeds or len(seeds) > MAX_SEEDS or len(set(map(str, seeds))) != len(seeds) \
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_SEED for s in seeds):
        raise LabSpecError(f"field 'lab.seeds': {excerpt(seeds, 60)}; give 1 to {MAX_SEEDS} distinct integers in "
                           f"[0, {MAX_SEED}], e.g. [1, 2, 3]")

    base_kw = {k: _recipe_value(k, v, f"field {_key('base.' + k)}") for k, v in data.get("base", {}).items()}
    base = with_fields(Recipe(), base_kw)
    _check_recipe(base, "field 'base'")

    knobs = []
    for name, entry in data.get("knobs", {}).items():
        if name not in KNOBS:
            raise LabSpecError(f"unknown knob {excerpt(name, 60)}; valid knobs: {', '.join(KNOBS)}")
        if isinstance(entry, list):
            levels_raw, ctx_raw = entry, {}
        elif isinstance(entry, dict):
            extra = set(entry) - {"levels", "context"}
            if extra:
                raise LabSpecError(f"knob {name!r}: unknown key {excerpt(sorted(extra)[0], 60)}; use levels and context")
            levels_raw, ctx_raw = entry.get("levels", []), entry.get("context", {})
        else:
            raise LabSpecError(f"knob {name!r}: give a list of levels or a table with levels and context")
        if not isinstance(levels_raw, list) or len(levels_raw) < 2:
            raise LabSpecError(f"knob {name!r}: give at least two levels, one of them the base's value")
        levels = tuple(check_level(name, lv) for lv in levels_raw)
        if len(set(levels)) != len(levels):
            raise LabSpecError(f"knob {name!r}: repeated level in {excerpt(levels_raw, 120)}")
        if not isinstance(ctx_raw, dict):
            raise LabSpecError(f"knob {name!r}: context must be a table, e.g. context = {{ positions = \"rotary\" }}")
        ctx = []
        for f, v in ctx_raw.items():
            if f == KNOBS[name].field:
                raise LabSpecError(f"knob {name!r}: its context cannot set the knob itself")
            ctx.append((f, _recipe_value(f, v, f"knob {name!r}: context field {excerpt(f, 60)}")))
        ref_recipe = with_fields(base, dict(ctx))
        reference = getattr(ref_recipe, KNOBS[name].field)
        if reference not in levels:
            raise LabSpecError(f"knob {name!r}: levels {excerpt(list(levels), 120)} must include the base's value "
                               f"{excerpt(reference, 60)} (the reference every other level is compared with)")
        ks = KnobSpec(name=name, levels=levels, reference=reference, context=tuple(ctx))
        for lv in levels:
            r = with_fields(ref_recipe, {KNOBS[name].field: lv})
            _check_recipe(r, f"knob {name!r} level {lv!r}")
        knobs.append(ks)
    budgets = lab.get("budgets", [])
    _check_budgets(budgets, base.warmup_steps)
    every = lab.get("checkpoint_every")
    _check_every(every, max(budgets or [base.steps]))
    names = {k.name: k for k in knobs}
    primary = []
    for entry in lab.get("primary", []):
        if not (isinstance(entry, list) and len(entry) == 2 and entry[0] in names):
            raise LabSpecError(f"field 'lab.primary': {excerpt(entry, 60)}; give [knob, level] pairs of this spec's knobs, "
                               f"e.g. [\"weight_decay\", 1.0]")
        level = check_level(entry[0], entry[1])
        if level not in names[entry[0]].levels or level == names[entry[0]].reference:
            raise LabSpecError(f"field 'lab.primary': {excerpt(entry, 60)}; the level must be one of the knob's non-reference "
                               f"levels {[lv for lv in names[entry[0]].levels if lv != names[entry[0]].reference]!r}")
        primary.append((entry[0], level))
    from thermo_lens.experiments.lab.effects import METRICS

    pm = lab.get("primary_metrics", ["last_block_gain", "penultimate_gain"])
    if not pm or any(m not in METRICS for m in pm):
        raise LabSpecError(f"field 'lab.primary_metrics': {excerpt(pm, 60)}; choose from {', '.join(METRICS)}")
    spec = LabSpec(name=lab.get("name", Path(path).stem if path else "lab"), base=base, knobs=tuple(knobs),
                   seeds=tuple(seeds), checkpoints=lab.get("checkpoints", 8), prompts=lab.get("prompts", "paper25"),
                   token_scope=lab.get("token_scope", "all_but_first"), prepend_bos=lab.get("prepend_bos", True),
                   batch_size=lab.get("batch_size", 8), eval_every=lab.get("eval_every"),
                   truncate=lab.get("truncate", False), path=path, budgets=tuple(sorted(budgets)),
                   checkpoint_every=every, primary=tuple(primary), primary_metrics=tuple(pm))
    check_lab_spec(spec)
    return spec


MAX_BUDGETS = 8


def _check_budgets(budgets: object, warmup: int) -> None:
    """Up to :data:`MAX_BUDGETS` distinct step counts, each above the warm-up and at most the
    recipe's step cap (``steps`` in :data:`~thermo_lens.experiments.lab.recipe.FIELD_RANGES`)."""
    from thermo_lens.core.validate import excerpt

    top = MAX_STEPS
    ok = isinstance(budgets, (list, tuple)) and len(budgets) <= MAX_BUDGETS and all(
        isinstance(b, int) and not isinstance(b, bool) and warmup < b <= top for b in budgets) \
        and len(set(budgets)) == len(budgets)
    if not ok:
        raise LabSpecError(f"field 'lab.budgets': {excerpt(budgets, 60)}; give up to {MAX_BUDGETS} distinct step counts, "
                           f"each larger than base.warmup_steps ({warmup}) and at most {top:,}, e.g. [150, 300, 600]")


def _check_every(every: object, longest: int) -> None:
    """``None`` or a number of steps in [ceil(longest / MAX_CHECKPOINTS), longest]."""
    from thermo_lens.core.validate import excerpt

    if every is None:
        return
    lo = max(1, -(-longest // MAX_CHECKPOINTS))
    if isinstance(every, bool) or not isinstance(every, int) or not lo <= every <= longest:
        raise LabSpecError(f"field 'lab.checkpoint_every': {excerpt(every, 60)}; give a number of steps in "
                           f"[{lo:,}, {longest:,}] (at most {MAX_CHECKPOINTS} checkpoints per run, none past its end)")


def check_lab_spec(spec: LabSpec) -> None:
    """Check every field of a :class:`LabSpec` (also one built in code): the lab's settings and
    every arm's recipe, each in range (:data:`thermo_lens.experiments.lab.recipe.FIELD_RANGES`); nothing is
    built or written before this passes. :class:`LabSpecError` names the field and what is valid."""
    from thermo_lens.core import prompts as prompt_sets
    from thermo_lens.core import validate as V
    from thermo_lens.core.errors import ThermoLensInputError

    if not isinstance(spec.name, str) or not spec.name.strip() or len(spec.name) > 200 or not spec.name.isprintable():
        raise LabSpecError(f"field 'lab.name': {V.excerpt(spec.name, 60)}; give a name of 1 to 200 printable characters")
    seeds = spec.seeds
    if not isinstance(seeds, tuple) or not seeds or len(seeds) > MAX_SEEDS or len(set(seeds)) != len(seeds) \
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_SEED for s in seeds):
        raise LabSpecError(f"field 'lab.seeds': {V.excerpt(seeds, 60)}; give 1 to {MAX_SEEDS} distinct integers in "
                           f"[0, {MAX_SEED}], e.g. (1, 2, 3)")
    _check_budgets(spec.budgets, spec.base.warmup_steps)
    _check_every(spec.checkpoint_every, max(spec.budget_steps()))
    steps = min(a.recipe.steps for a in spec.arms())
    for f, v, hi in (("checkpoints", spec.checkpoints, MAX_CHECKPOINTS),
                     ("batch_size", spec.batch_size, 1 << 16),
                     ("eval_every", spec.eval_every, steps)):
        if f == "eval_every" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
            why = {"checkpoints": " (log-spaced steps, step 0 and the last included; more than steps + 1 "
                                  "is every step)",
                   "eval_every": f" (steps {steps})", "batch_size": ""}[f]
            raise LabSpecError(f"field 'lab.{f}': bad value {V.excerpt(v, 60)}; valid: an integer in [1, {hi}]{why}")
    if not isinstance(spec.truncate, bool):
        raise LabSpecError(f"field 'lab.truncate': bad value {V.excerpt(spec.truncate, 60)}; valid: true or false")
    try:
        V.prepend_bos(spec.prepend_bos)
    except ThermoLensInputError:
        raise LabSpecError(f"field 'lab.prepend_bos': bad value {V.excerpt(spec.prepend_bos, 60)}; valid: "
                           + bos_modes_text(bools=("true", "false"))) from None
    try:
        prompt_sets.as_prompt_set(spec.prompts)
    except (KeyError, TypeError, ValueError) as e:
        raise LabSpecError(f"field 'lab.prompts': {e.args[0] if e.args else e}") from None
    if spec.token_scope not in ("last", "all_but_first", "all", "frobenius"):
        raise LabSpecError(f"field 'lab.token_scope': {V.excerpt(spec.token_scope, 60)} is not one of last, "
                           "all_but_first, all, frobenius")
    _check_recipe(spec.base, "field 'base'")
    for arm in spec.arms():
        _check_recipe(arm.recipe, f"arm {arm.id!r}")


def spec_fingerprint(spec: LabSpec) -> str:
    """SHA-256 of the lab's canonical form: everything that decides its runs and tables (name,
    seeds, checkpoints, settings, base recipe, knobs), not where the spec file lies or how it is
    written (comments, order, a default spelt out). A recipe field added to thermo-lens later enters
    only when it differs from its default, so an upgrade keeps a lab's fingerprint."""
    return hashlib.sha256(json.dumps(canonical_spec(spec), sort_keys=True, default=str).encode()).hexdigest()


def canonical_spec(spec: LabSpec) -> dict[str, Any]:
    """The JSON form :func:`spec_fingerprint` hashes."""
    def recipe(r: Recipe) -> dict[str, Any]:
        return {k: v for k, v in r.to_dict().items() if not (k in _ADDED_FIELDS and v == _DEFAULTS[k])}

    out = {"name": spec.name, "seeds": list(spec.seeds), "checkpoints": spec.checkpoints,
           "eval_every": spec.eval_every, "settings": spec.settings(), "base": recipe(spec.base),
           "knobs": [{"name": k.name, "levels": list(k.levels), "reference": k.reference, "context": dict(k.context)}
                     for k in spec.knobs]}
    # Fields added with budgets and the declared family enter only when set (older labs keep their fingerprint).
    if spec.budgets:
        out["budgets"] = list(spec.budgets)
    if spec.checkpoint_every is not None:
        out["checkpoint_every"] = spec.checkpoint_every
    if spec.primary:
        out["primary"] = [list(p) for p in spec.primary]
        out["primary_metrics"] = list(spec.primary_metrics)
    return out


def _key(key: str) -> str:
    """A key from the spec, quoted for a message: cut short, control characters escaped."""
    return "'" + printable(key[:60] + ("..." if len(key) > 60 else "")) + "'"


def _recipe_value(name: str, value: object, where: str) -> FieldValue:
    """A recipe field's value, validated (through its knob when it has one): in range, or a
    :class:`LabSpecError` naming ``where`` and what is valid."""
    valid = [f.name for f in fields(Recipe)]
    if name not in valid:
        raise LabSpecError(f"{where}: unknown recipe field; valid: {', '.join(valid)}")
    if name in KNOBS and KNOBS[name].field == name:
        return check_level(name, value)
    try:
        return check_field(name, value)
    except LabSpecError as e:
        raise LabSpecError(f"{where}: {e}") from None


def _check_recipe(r: Recipe, where: str) -> None:
    """:func:`~thermo_lens.experiments.lab.recipe.check_recipe`, its message placed at ``where`` (``"field 'base'"``
    becomes ``"field 'base.n_heads': ..."``)."""
    try:
        check_recipe(r)
    except LabSpecError as e:
        msg = str(e)
        if where == "field 'base'" and msg.startswith("field '"):
            raise LabSpecError("field 'base." + msg.removeprefix("field '")) from None
        raise LabSpecError(f"{where}: {msg}") from None
