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

    [base]                       # any Recipe field (thermo_lens.lab.Recipe); defaults for the rest
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
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from thermo_lens.lab.architecture import ArchitectureError, family_of
from thermo_lens.lab.recipe import KNOBS, LabSpecError, Recipe, check_level

__all__ = ["Arm", "KnobSpec", "LabSpec", "load_lab_spec", "parse_lab_spec"]

_LAB_FIELDS: dict[str, Any] = {"name": str, "seeds": list, "checkpoints": int, "prompts": (str, list),
                               "token_scope": str, "prepend_bos": (bool, str), "batch_size": int,
                               "eval_every": int, "truncate": bool, "budgets": list, "checkpoint_every": int,
                               "primary": list, "primary_metrics": list}


@dataclass(frozen=True)
class KnobSpec:
    """One knob of a lab: its levels, the reference level (the base's) and its context."""

    name: str
    levels: tuple[Any, ...]
    reference: Any
    context: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Arm:
    """One trained configuration: an id, its recipe and the (knob, level) it stands for."""

    id: str
    recipe: Recipe
    knob: str
    level: Any


@dataclass(frozen=True)
class LabSpec:
    """A parsed lab spec (see the module docstring)."""

    name: str
    base: Recipe
    knobs: tuple[KnobSpec, ...]
    seeds: tuple[int, ...]
    checkpoints: int = 8
    prompts: Any = "paper25"
    token_scope: str = "all_but_first"
    prepend_bos: Any = True
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
    primary: tuple[tuple[str, Any], ...] = ()
    primary_metrics: tuple[str, ...] = ("last_block_gain", "penultimate_gain")

    @property
    def sha256(self) -> str:
        """SHA-256 of the canonical parsed spec (everything but its file path): every result of the
        lab carries it, and tables refuse results of another spec."""
        canon = {"name": self.name, "base": self.base.to_dict(), "seeds": list(self.seeds),
                 "knobs": [[k.name, list(k.levels), k.reference, [list(c) for c in k.context]] for k in self.knobs],
                 "checkpoints": self.checkpoints, "settings": self.settings(), "eval_every": self.eval_every,
                 "budgets": list(self.budgets), "checkpoint_every": self.checkpoint_every,
                 "primary": [list(p) for p in self.primary], "primary_metrics": list(self.primary_metrics)}
        return hashlib.sha256(json.dumps(canon, sort_keys=True, default=str).encode()).hexdigest()

    def budget_steps(self) -> tuple[int, ...]:
        """The training budgets in steps (the base's ``steps`` when none are declared)."""
        return self.budgets or (self.base.steps,)

    def settings(self) -> dict[str, Any]:
        """Profiling settings, shared by every checkpoint's profile (a study's settings)."""
        return {"prompts": self.prompts, "prepend_bos": self.prepend_bos, "token_scope": self.token_scope,
                "batch_size": self.batch_size, "truncate": self.truncate}

    def knob_recipe(self, knob: KnobSpec, level: Any) -> Recipe:
        ctx = dict(knob.context)
        return replace(self.base, **ctx, **{KNOBS[knob.name].field: level})

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


def _fmt(v: Any) -> str:
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
    import tomllib

    path = Path(path)
    if not path.is_file():
        raise LabSpecError(f"{path}: no such lab spec file")
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LabSpecError(f"{path}: invalid TOML: {e}") from None
    try:
        return parse_lab_spec(data, path=str(path), text=text)
    except LabSpecError as e:
        msg = str(e)
        if msg.startswith(f"{path}"):
            raise
        m = re.search(r"(knob|field) '([\w.]+)'", msg)
        line = _line(text, rf"^\s*(\[knobs\.)?{re.escape(m.group(2).split('.')[-1])}\b") if m else 1
        raise LabSpecError(f"{path}:{line}: {msg}") from None


def parse_lab_spec(data: dict[str, Any], *, path: str | None = None, text: str = "") -> LabSpec:
    """Validate a spec already read into a dict (``{"lab": ..., "base": ..., "knobs": ...}``)."""
    if not isinstance(data, dict):
        raise LabSpecError("a lab spec is a table with [lab], [base] and [knobs]")
    unknown = set(data) - {"lab", "base", "knobs"}
    if unknown:
        raise LabSpecError(f"field '{sorted(unknown)[0]}': unknown section; expected lab, base, knobs")
    lab = data.get("lab", {})
    for k, v in lab.items():
        if k not in _LAB_FIELDS:
            raise LabSpecError(f"field 'lab.{k}': unknown; valid: {', '.join(_LAB_FIELDS)}")
        if not isinstance(v, _LAB_FIELDS[k]) or (isinstance(v, bool) and _LAB_FIELDS[k] is int):
            raise LabSpecError(f"field 'lab.{k}': bad value {v!r}")
    seeds = lab.get("seeds", [0])
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise LabSpecError(f"field 'lab.seeds': {seeds!r}; give distinct integers >= 0, e.g. [1, 2, 3]")
    if lab.get("checkpoints", 8) < 1:
        raise LabSpecError("field 'lab.checkpoints': at least 1 (the last step)")

    base_kw = {k: _recipe_value(k, v, f"field 'base.{k}'") for k, v in data.get("base", {}).items()}
    base = Recipe(**base_kw)
    _check_recipe(base, "field 'base'")

    knobs = []
    for name, entry in data.get("knobs", {}).items():
        if name not in KNOBS:
            raise LabSpecError(f"unknown knob {name!r}; valid knobs: {', '.join(KNOBS)}")
        if isinstance(entry, list):
            levels_raw, ctx_raw = entry, {}
        elif isinstance(entry, dict):
            extra = set(entry) - {"levels", "context"}
            if extra:
                raise LabSpecError(f"knob {name!r}: unknown key {sorted(extra)[0]!r}; use levels and context")
            levels_raw, ctx_raw = entry.get("levels", []), entry.get("context", {})
        else:
            raise LabSpecError(f"knob {name!r}: give a list of levels or a table with levels and context")
        if not isinstance(levels_raw, list) or len(levels_raw) < 2:
            raise LabSpecError(f"knob {name!r}: give at least two levels, one of them the base's value")
        levels = tuple(check_level(name, lv) for lv in levels_raw)
        if len(set(levels)) != len(levels):
            raise LabSpecError(f"knob {name!r}: repeated level in {levels_raw!r}")
        ctx = []
        for f, v in ctx_raw.items():
            if f == KNOBS[name].field:
                raise LabSpecError(f"knob {name!r}: its context cannot set the knob itself")
            ctx.append((f, _recipe_value(f, v, f"knob {name!r}: context field {f!r}")))
        ref_recipe = replace(base, **dict(ctx))
        reference = getattr(ref_recipe, KNOBS[name].field)
        if reference not in levels:
            raise LabSpecError(f"knob {name!r}: levels {list(levels)!r} must include the base's value "
                               f"{reference!r} (the reference every other level is compared with)")
        ks = KnobSpec(name=name, levels=levels, reference=reference, context=tuple(ctx))
        for lv in levels:
            r = replace(ref_recipe, **{KNOBS[name].field: lv})
            _check_recipe(r, f"knob {name!r} level {lv!r}")
        knobs.append(ks)
    budgets = lab.get("budgets", [])
    if budgets and (not all(isinstance(b, int) and not isinstance(b, bool) and b > base.warmup_steps for b in budgets)
                    or len(set(budgets)) != len(budgets) or len(budgets) > 8):
        raise LabSpecError(f"field 'lab.budgets': {budgets!r}; give up to 8 distinct step counts, each larger "
                           f"than base.warmup_steps ({base.warmup_steps}), e.g. [150, 300, 600]")
    every = lab.get("checkpoint_every")
    if every is not None and every < 1:
        raise LabSpecError(f"field 'lab.checkpoint_every': {every!r}; give a number of steps >= 1")
    names = {k.name: k for k in knobs}
    primary = []
    for entry in lab.get("primary", []):
        if not (isinstance(entry, list) and len(entry) == 2 and entry[0] in names):
            raise LabSpecError(f"field 'lab.primary': {entry!r}; give [knob, level] pairs of this spec's knobs, "
                               f"e.g. [\"weight_decay\", 1.0]")
        level = check_level(entry[0], entry[1])
        if level not in names[entry[0]].levels or level == names[entry[0]].reference:
            raise LabSpecError(f"field 'lab.primary': {entry!r}; the level must be one of the knob's non-reference "
                               f"levels {[lv for lv in names[entry[0]].levels if lv != names[entry[0]].reference]!r}")
        primary.append((entry[0], level))
    from thermo_lens.lab.effects import METRICS

    pm = lab.get("primary_metrics", ["last_block_gain", "penultimate_gain"])
    if not pm or any(m not in METRICS for m in pm):
        raise LabSpecError(f"field 'lab.primary_metrics': {pm!r}; choose from {', '.join(METRICS)}")
    spec = LabSpec(name=lab.get("name", Path(path).stem if path else "lab"), base=base, knobs=tuple(knobs),
                   seeds=tuple(seeds), checkpoints=lab.get("checkpoints", 8), prompts=lab.get("prompts", "paper25"),
                   token_scope=lab.get("token_scope", "all_but_first"), prepend_bos=lab.get("prepend_bos", True),
                   batch_size=lab.get("batch_size", 8), eval_every=lab.get("eval_every"),
                   truncate=lab.get("truncate", False), path=path, budgets=tuple(sorted(budgets)),
                   checkpoint_every=every, primary=tuple(primary), primary_metrics=tuple(pm))
    from thermo_lens import prompts as prompt_sets

    try:
        prompt_sets.as_prompt_set(spec.prompts)
    except (KeyError, TypeError, ValueError) as e:
        raise LabSpecError(f"field 'lab.prompts': {e.args[0] if e.args else e}") from None
    if spec.token_scope not in ("last", "all_but_first", "all", "frobenius"):
        raise LabSpecError(f"field 'lab.token_scope': {spec.token_scope!r} is not one of last, all_but_first, all, frobenius")
    return spec


def _recipe_value(name: str, value: Any, where: str) -> Any:
    """A recipe field's value, validated (through its knob when it has one)."""
    valid = [f.name for f in fields(Recipe)]
    if name not in valid:
        raise LabSpecError(f"{where}: unknown recipe field; valid: {', '.join(valid)}")
    knob = next((n for n, kn in KNOBS.items() if kn.field == name), None)
    if knob is not None:
        return check_level(knob, value)
    default = getattr(Recipe(), name)
    if isinstance(value, bool) or not isinstance(value, (int, float) if isinstance(default, float) else type(default)):
        raise LabSpecError(f"{where}: bad value {value!r} (expected {type(default).__name__})")
    return type(default)(value)


def _check_recipe(r: Recipe, where: str) -> None:
    try:
        family_of(r.architecture())
    except ArchitectureError as e:
        raise LabSpecError(f"{where}: {e}") from None
    if r.d_model % r.n_heads:
        raise LabSpecError(f"{where}: d_model {r.d_model} is not divisible by n_heads {r.n_heads}")
    if r.block_size > r.n_ctx:
        raise LabSpecError(f"{where}: block_size {r.block_size} exceeds the context n_ctx {r.n_ctx}")
    if r.steps < 1 or r.batch_size < 1:
        raise LabSpecError(f"{where}: steps and batch_size must be >= 1")
