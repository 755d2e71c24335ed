"""Run (or resume) a lab: train every arm x seed, profile every checkpoint, tabulate, test.

``run_lab(spec, out_dir)`` (or ``thermo-lens lab SPEC --out DIR``) drives the study machinery
(:func:`thermo_lens.experiments.study.run_study`) twice, so a lab is resumable and fail-soft exactly like a
study: atomic result files, a manifest with SHA-256s, one run at a time per directory, a rerun that
continues, a failure recorded and the rest carried on, and the local or Ray executor:

1. ``DIR/train/``: one study "model" per run (arm x seed). Its task trains the run (resuming from
   ``train_state.pt`` when interrupted), saving log-spaced checkpoints under ``DIR/runs/``, and
   returns the profile of the last checkpoint;
2. ``DIR/profiles/``: one study "model" per checkpoint of every trained run, profiled with the
   same battery (gain under every named definition, spectral signature, sheaf traces, L*); each
   profile's ``meta["lab"]`` carries the arm, knob, level, seed, step and validation loss.

Then ``DIR/runs.csv`` (one row per run and checkpoint), ``DIR/effects.csv`` (per knob, level and
metric: the seed-paired effect, 95% CI, permutation p-value, regime flip;
:mod:`thermo_lens.experiments.lab.effects`), ``DIR/figures/*.html`` and ``DIR/report.html`` are written from
whatever has finished. A run directory is named by its recipe's hash, so editing a spec retrains
exactly the arms whose recipe changed.

The lab folder is guarded like a study's (:mod:`thermo_lens.experiments.study.folder`, :mod:`thermo_lens.core.safe_io`):

* the spec is checked in full (:func:`~thermo_lens.experiments.lab.spec.check_lab_spec`) before anything is
  built or written;
* ``DIR`` must be new, empty, or a lab folder (it holds a thermo-lens ``lab.json``); a folder of
  other files, an empty name, a file and a dangling link are refused;
* ``lab.json`` records the spec's fingerprint (:func:`~thermo_lens.experiments.lab.spec.spec_fingerprint`); a
  different spec on an existing lab folder is refused before anything is written, unless
  ``update=True`` (``--update``) says the lab is meant to change;
* one run at a time (an exclusive lock on ``DIR/.lock``);
* every subfolder (``train/``, ``profiles/``, ``runs/``, ``tokenizers/``, ``figures/``) is made
  without following a symbolic link, and every file is written atomically through
  :func:`~thermo_lens.core.safe_io.atomic_write_bytes`, so a link planted inside ``DIR`` is refused or
  replaced, never written through.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.experiments.lab.recipe import FieldValue, Recipe
from thermo_lens.experiments.lab.run_record import TABLES_RECORD
from thermo_lens.experiments.lab.spec import LabSpec, canonical_spec, check_lab_spec, load_lab_spec, spec_fingerprint
from thermo_lens.core.safe_io import FolderLock, FolderLockedError, SafeIOError, atomic_write_bytes, make_folder, printable

if TYPE_CHECKING:
    import pandas as pd

    from thermo_lens.experiments.study import ModelSpec

__all__ = ["LabOutcome", "LabFolderError", "LabLockedError", "run_lab", "runs_frame", "write_tables", "LAB_JSON"]

LAB_JSON = "lab.json"
_LAB_JSON_LIMIT = 64 << 20


class LabFolderError(ThermoLensInputError):
    """The lab folder cannot be used: a folder of other files, or a lab of another spec."""


class LabLockedError(FolderLockedError):
    """Another lab run holds the lab folder."""

GAIN_COLUMNS = ("last_block_gain", "penultimate_gain", "first_block_gain", "geometric_mean_gain",
                "total_amplification", "max_block_gain")


@dataclass(frozen=True)
class LabOutcome:
    """What a lab run did: trained/profiled now, skipped (already done), failed (with errors)."""

    out_dir: str
    trained: tuple[str, ...]
    profiled: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: dict[str, str]

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass(frozen=True)
class _RunInfo:
    run_id: str
    arm: str
    knob: str
    level: FieldValue
    seed: int
    recipe: dict[str, Any]
    base: dict[str, Any]
    run_dir: str            # relative to the lab directory


def _run_infos(spec: LabSpec) -> list[_RunInfo]:
    out = []
    for budget in spec.budget_steps():
        for arm in spec.arms():
            recipe = replace(arm.recipe, steps=budget)
            for seed in spec.seeds:
                # A lab with declared budgets names each run by its budget (a run is one complete schedule).
                rid = f"{arm.id}__seed{seed}" + (f"__b{budget}" if spec.budgets else "")
                out.append(_RunInfo(rid, arm.id, arm.knob, arm.level, seed, recipe.to_dict(), spec.base.to_dict(),
                                    f"runs/{arm.id}__seed{seed}__{recipe.hash}"))
    return out


def _every(every: int | None, steps: int) -> tuple[int, ...]:
    """The steps before ``steps`` that are multiples of ``every`` (the lab's ``checkpoint_every``)."""
    return tuple(range(every, steps, every)) if every else ()


def _checkpoints(spec: LabSpec, steps: int) -> list[int]:
    """Every checkpoint of a run of ``steps``: log-spaced, plus every ``checkpoint_every`` steps."""
    from thermo_lens.experiments.lab.train import checkpoint_steps

    return sorted(set(checkpoint_steps(steps, spec.checkpoints)) | set(_every(spec.checkpoint_every, steps)))


@dataclass(frozen=True)
class _Task:
    """The study ``profile_fn`` of both passes (picklable, for Ray)."""

    lab_dir: str
    runs: dict[str, _RunInfo]
    n_checkpoints: int
    eval_every: int | None
    mode: str                   # "train" | "profile"
    checkpoint_every: int | None = None
    spec_sha256: str = ""

    def _train(self, info: _RunInfo) -> dict[str, Any]:
        from thermo_lens.experiments.lab.train import train_run

        run_dir = make_folder(self.lab_dir, *Path(info.run_dir).parts)  # never through a planted link
        extra = _every(self.checkpoint_every, Recipe(**info.recipe).steps)
        return train_run(Recipe(**info.recipe), info.seed, run_dir, base=Recipe(**info.base),
                         n_checkpoints=self.n_checkpoints, extra_checkpoints=extra,
                         tokenizer_cache=make_folder(self.lab_dir, "tokenizers"), eval_every=self.eval_every)

    def __call__(self, model: ModelSpec, settings: dict[str, Any]) -> str:
        from thermo_lens.experiments.lab.run_record import checkpoint_problem, read_record
        from thermo_lens.experiments.lab.train import step_dir_name

        def problem(step: int) -> str | None:
            run_dir = Path(self.lab_dir) / info.run_dir
            return checkpoint_problem(run_dir, step_dir_name(step), read_record(run_dir))

        if self.mode == "train":
            info = self.runs[model.id]
            step = Recipe(**info.recipe).steps
            if problem(step) is not None:
                step = max(self._train(info)["checkpoints"])  # else: trained already (e.g. a settings change)
        else:
            rid, _, step_s = model.id.rpartition("__step")
            info, step = self.runs[rid], int(step_s)
        if problem(step) is not None:  # deleted, replaced or linked since: finish (or redo) the run first
            self._train(info)
        why = problem(step)
        if why is not None:
            raise SafeIOError(f"run {printable(info.run_id)}: checkpoint {step_dir_name(step)} is not the one "
                              f"training wrote ({why}); it is not profiled")
        return _profile_checkpoint(model, settings, Path(self.lab_dir) / info.run_dir / step_dir_name(step), info,
                                   step, self.spec_sha256)


def _profile_checkpoint(model: ModelSpec, settings: dict[str, Any], ckpt: Path, info: _RunInfo, step: int,
                        spec_sha256: str = "") -> str:
    """The profile of the checkpoint folder ``ckpt`` (checked against the run's record by the
    caller), its ``meta["lab"]`` naming the run; ``metrics.json`` is read checked again."""
    import torch

    from thermo_lens.experiments.lab.run_record import read_checkpoint_file, read_record
    from thermo_lens.measures.profile import ThermoProfile
    from thermo_lens.experiments.study import profile_one

    torch.set_num_threads(1)
    text = profile_one(replace(model, name=str(ckpt), threads=1), settings)
    prof = ThermoProfile.from_json(text)
    metrics = json.loads(read_checkpoint_file(ckpt.parent, f"{ckpt.name}/metrics.json", read_record(ckpt.parent),
                                              1 << 20))
    meta = dict(prof.meta, source=f"{info.run_dir}/{ckpt.name}")
    meta["lab"] = {"run": info.run_id, "arm": info.arm, "knob": info.knob, "level": info.level, "seed": info.seed,
                   "step": step, "tokens_seen": metrics["tokens_seen"], "val_loss": metrics["val_loss"],
                   "recipe_hash": Recipe(**info.recipe).hash, "family": _family(info),
                   "budget": Recipe(**info.recipe).steps, "spec_sha256": spec_sha256}
    return replace(prof, meta=meta).to_json()


def _family(info: _RunInfo) -> str:
    return Recipe(**info.recipe).architecture().family


def run_lab(spec: LabSpec | str | os.PathLike, out_dir: str | os.PathLike, *, executor: str = "local",
            ray_address: str | None = None, progress: bool | None = None, report: bool = True,
            update: bool = False) -> LabOutcome:
    """Run or resume the lab ``spec`` into ``out_dir`` (see the module docstring).

    Args:
        spec: a :class:`~thermo_lens.experiments.lab.spec.LabSpec` or the path of a lab spec (TOML).
        out_dir: the lab directory (created if needed).
        executor: ``"local"`` or ``"ray"`` (one run, then one checkpoint, per Ray task).
        ray_address: for Ray: ``None`` starts a local Ray; an address joins a cluster.
        progress: progress bars (default: when stderr is a terminal).
        report: also write ``report.html`` (the study report of the final checkpoints with a
            heritage-lab section).
        update: accept a spec other than the one ``out_dir`` was made with (default: refused).

    Returns:
        :class:`LabOutcome`; failures of single runs are recorded in the manifests, never raised.

    Raises:
        LabSpecError: a field of the spec is out of range (nothing is written).
        LabFolderError: ``out_dir`` holds other files, or a lab of another spec (nothing is written).
        thermo_lens.experiments.study.folder.StudyFolderError: ``out_dir`` is empty, a file or a dangling link.
        LabLockedError: another lab run uses ``out_dir``.
        thermo_lens.core.safe_io.SafeIOError: a link planted inside ``out_dir``, or a write failed (disk
            full...), naming the file.
    """
    if not isinstance(spec, LabSpec):
        spec = load_lab_spec(spec)
    check_lab_spec(spec)  # also a LabSpec built in code: nothing is built or written before this passes
    from thermo_lens.experiments.study.executors import check_executor, probe_ray

    check_executor(executor, ray_address)
    if executor == "ray":
        probe_ray(ray_address)  # an unreachable cluster is refused before anything is written
    out = _prepare_lab_out(out_dir)
    with FolderLock(out, what="thermo-lens lab run", error=LabLockedError):
        from thermo_lens.core.safe_io import remove_stale_temps

        remove_stale_temps(out)
        _check_lab_json(out, spec, update)
        for sub in ("train", "profiles", "runs", "tokenizers"):
            make_folder(out, sub)
        _write_lab_json(out, spec)
        return _run_locked(spec, out, executor, ray_address, progress, report)


def _prepare_lab_out(out_dir: str | os.PathLike[str]) -> Path:
    """The lab folder: new, empty, or a lab folder (see the module docstring); created if needed."""
    from thermo_lens.experiments.study.folder import check_out, foreign_entries, make_out

    out = check_out(out_dir, "lab folder")
    if out.is_dir() and not os.path.lexists(out / LAB_JSON):
        if os.path.lexists(out / "manifest.json"):
            raise LabFolderError(f"{printable(out)} is the folder of a study or profile run, not of a lab; choose a new "
                                 f"or empty folder, or the folder of an earlier lab (with its {LAB_JSON})")
        foreign = foreign_entries(out)
        if foreign:
            names = ", ".join(printable(n)[:60] for n in sorted(foreign)[:5]) + (" ..." if len(foreign) > 5 else "")
            raise LabFolderError(f"lab folder {printable(out)} already holds files thermo-lens did not write ({names}); "
                                 f"choose a new or empty folder, or the folder of an earlier lab (with its {LAB_JSON})")
    return make_out(out)


def _read_lab_json(out: Path) -> dict[str, Any] | None:
    """The lab folder's ``lab.json`` (``None`` when there is none); a link, a corrupt file or one
    thermo-lens did not write is refused."""
    from thermo_lens.experiments.lab.run_record import read_json_record

    path = out / LAB_JSON
    return read_json_record(path, _LAB_JSON_LIMIT, "lab record", lambda data: {"arms", "base", "knobs"} <= set(data),
                            lambda: LabFolderError(f"{printable(path)} is not a thermo-lens lab record; choose a new "
                                                   "or empty lab folder"))


def _check_lab_json(out: Path, spec: LabSpec, update: bool) -> None:
    """Refuse a lab folder whose ``lab.json`` was written for another spec (unless ``update``)."""
    old = _read_lab_json(out)
    if old is None or update:
        return
    recorded = old.get("spec_sha256")
    if recorded is None or recorded == spec_fingerprint(spec):  # a lab from before fingerprints adopts it
        return
    was = old.get("canonical_spec") if isinstance(old.get("canonical_spec"), dict) else {}
    now = canonical_spec(spec)
    changed = [k for k in now if was.get(k) != now[k]] if was else []
    what = f" (changed: {', '.join(changed)})" if changed else ""
    raise LabFolderError(
        f"lab folder {printable(out)} holds the lab {printable(str(old.get('name', '?'))[:80])!r} of another spec{what}; "
        "choose a new lab folder, or rerun with --update (run_lab(..., update=True)) to change this lab: arms whose "
        "recipe changed are trained anew, finished runs of the others are kept")


def _write_lab_json(out: Path, spec: LabSpec) -> None:
    atomic_write_bytes(out / LAB_JSON, json.dumps({
        "thermo_lens_lab": 1, "name": spec.name, "spec": spec.path, "spec_sha256": spec_fingerprint(spec),
        "canonical_spec": canonical_spec(spec), "seeds": list(spec.seeds), "checkpoints": spec.checkpoints,
        "budgets": list(spec.budgets), "checkpoint_every": spec.checkpoint_every,
        "primary": [list(p) for p in spec.primary], "primary_metrics": list(spec.primary_metrics),
        "settings": spec.settings(), "base": spec.base.to_dict(),
        "knobs": [{"name": k.name, "levels": list(k.levels), "reference": k.reference, "context": dict(k.context)}
                  for k in spec.knobs],
        "arms": [{"id": a.id, "knob": a.knob, "level": a.level, "recipe_hash": a.recipe.hash,
                  "family": a.recipe.architecture().family, "differs_from_base": {k: list(v) for k, v in
                                                                                spec.base.differences(a.recipe).items()}}
                 for a in spec.arms()],
        "comparisons": [dict(zip(("knob", "reference", "level", "reference_arm", "arm"), c)) for c in spec.comparisons()],
    }, indent=2, default=str).encode() + b"\n")


def _run_locked(spec: LabSpec, out: Path, executor: str, ray_address: str | None, progress: bool | None,
                report: bool) -> LabOutcome:
    from thermo_lens.experiments.study import ModelSpec, StudySpec, read_manifest, run_study

    infos = _run_infos(spec)
    runs = {i.run_id: i for i in infos}
    settings = spec.settings()

    def models(ids_steps: Sequence[tuple[_RunInfo, int | None]]) -> tuple[ModelSpec, ...]:
        ms = []
        for info, step in ids_steps:
            mid = info.run_id if step is None else f"{info.run_id}__step{step:06d}"
            ms.append(ModelSpec(id=mid, name=info.run_dir, lab=info.arm, family=info.knob,
                                twin_of=None if info.arm == "base" else "base__seed" + info.run_id.rpartition("__seed")[2],
                                threads=1))
        return tuple(ms)

    train_spec = StudySpec(name=f"{spec.name}: training", models=models([(i, None) for i in infos]), **settings)
    task = _Task(str(out.resolve()), runs, spec.checkpoints, spec.eval_every, "train",
                 checkpoint_every=spec.checkpoint_every, spec_sha256=spec.sha256)
    t = run_study(train_spec, out / "train", executor=executor, ray_address=ray_address, progress=progress,
                  profile_fn=task)
    trained_ok = [i for i in infos if read_manifest(out / "train")["models"].get(i.run_id, {}).get("status") == "done"]
    pairs = [(i, s) for i in trained_ok for s in _checkpoints(spec, Recipe(**i.recipe).steps)]
    failed = dict(t.failed)
    p_done: tuple[str, ...] = ()
    p_skipped: tuple[str, ...] = ()
    if pairs:
        prof_spec = StudySpec(name=f"{spec.name}: checkpoints", models=models(pairs), **settings)
        p = run_study(prof_spec, out / "profiles", executor=executor, ray_address=ray_address, progress=progress,
                      profile_fn=replace(task, mode="profile"))
        failed.update(p.failed)
        p_done, p_skipped = p.done, p.skipped
    write_tables(out, spec)
    if report and trained_ok:
        from thermo_lens.experiments.lab.report_section import lab_section
        from thermo_lens.report import write_report

        try:
            write_report(out / "train", out / "report.html", title=f"thermo-lens heritage lab: {spec.name}",
                         panel=False, sections=[lab_section(out)])
        except Exception as e:  # noqa: BLE001 - the tables are the result; the report is a view
            failed["report.html"] = f"{type(e).__name__}: {e}"
    return LabOutcome(out_dir=str(out), trained=t.done, profiled=p_done, skipped=tuple(t.skipped) + tuple(p_skipped),
                      failed=failed)


def runs_frame(lab_dir: str | os.PathLike) -> pd.DataFrame:
    """One row per trained run and checkpoint, from the finished checkpoint profiles of ``lab_dir``.

    Columns: ``knob, level, arm, seed, step, tokens_seen, val_loss``, every named gain summary
    (``last_block_gain`` = G_L, ``penultimate_gain`` = G_{L-1}, ...; token scope and BOS as in the
    lab's settings), ``regime`` (decided by ``last_block_gain``'s 95% CI across prompts),
    ``W_V_norm``, ``W_O_norm`` (means over heads of the spectral norms) and ``W_V_W_O_ratio`` (mean
    over heads of ||W_V^h||_2 / ||W_O^h||_2), ``mean_trace`` (sheaf), ``family``, ``run``,
    ``recipe_hash``.
    """
    import pandas as pd

    from thermo_lens.experiments.study import load_profiles

    d = Path(lab_dir) / "profiles"
    profiles = load_profiles(d) if (d / "manifest.json").is_file() else {}
    rows = []
    for prof in profiles.values():
        lab = prof.meta.get("lab") or {}
        g, s = prof.gain, prof.spectral
        row = {"knob": lab.get("knob"), "level": lab.get("level"), "arm": lab.get("arm"), "seed": lab.get("seed"),
               "step": lab.get("step"), "tokens_seen": lab.get("tokens_seen"), "val_loss": lab.get("val_loss")}
        for name in GAIN_COLUMNS:
            row[name] = float(g.summaries[name].mean)
        row.update({"regime": g.regime, "regime_by": g.regime_by,
                    "W_V_W_O_ratio": float(s.ratio.mean()), "W_V_norm": float(s.W_V_norm.mean()),
                    "W_O_norm": float(s.W_O_norm.mean()), "mean_trace": float(prof.sheaf.mean_layer_trace.mean()),
                    "token_scope": prof.meta.get("token_scope"), "prepend_bos": prof.meta.get("prepend_bos"),
                    "family": lab.get("family"), "run": lab.get("run"), "recipe_hash": lab.get("recipe_hash"),
                    "budget": lab.get("budget"), "spec_sha256": lab.get("spec_sha256", "")})
        rows.append(row)
    cols = ["knob", "level", "arm", "seed", "step", "tokens_seen", "val_loss", *GAIN_COLUMNS, "regime", "regime_by",
            "W_V_W_O_ratio", "W_V_norm", "W_O_norm", "mean_trace", "token_scope", "prepend_bos", "family", "run",
            "recipe_hash", "budget", "spec_sha256"]
    df = pd.DataFrame(rows, columns=cols)
    return df.sort_values(["arm", "seed", "budget", "step"], kind="stable").reset_index(drop=True)


def current_rows(runs: pd.DataFrame, spec: LabSpec) -> pd.DataFrame:
    """The rows of ``runs`` (:func:`runs_frame`) that belong to ``spec``, tagged by it.

    A row belongs when its run is one of the spec's (arm x seed x budget), trained from the same
    recipe, at one of the spec's checkpoints of that run. Its spec-given columns (knob, level,
    arm, seed, family, budget, ``spec_sha256``) are rewritten from ``spec``: a run kept across
    ``--update`` (its recipe unchanged) is the run a fresh lab of the new spec would train, so its
    rows are the same. Rows of runs the spec no longer has (a dropped seed, arm or budget) are
    left out.
    """
    infos = {i.run_id: i for i in _run_infos(spec)}
    keep, tags = [], []
    for idx, row in runs.iterrows():
        info = infos.get(row["run"])
        if info is None:
            continue
        recipe = Recipe(**info.recipe)
        if row["recipe_hash"] != recipe.hash or row["step"] not in _checkpoints(spec, recipe.steps):
            continue
        keep.append(idx)
        tags.append({"knob": info.knob, "level": info.level, "arm": info.arm, "seed": info.seed,
                     "family": _family(info), "budget": recipe.steps, "spec_sha256": spec.sha256})
    out = runs.loc[keep].reset_index(drop=True)
    for col in ("knob", "level", "arm", "seed", "family", "budget", "spec_sha256"):
        out[col] = [t[col] for t in tags] if tags else out[col]
    return out.sort_values(["arm", "seed", "budget", "step"], kind="stable").reset_index(drop=True)


def write_tables(lab_dir: str | os.PathLike, spec: LabSpec) -> None:
    """``runs.csv``, ``effects.csv`` and ``figures/`` from what has finished in ``lab_dir``: exactly
    the rows of ``spec``'s runs, tagged by it (:func:`current_rows`), so after ``--update`` the
    tables are those a fresh lab of the new spec writes; ``tables.json`` records their SHA-256 for
    the report, which reads them back."""
    from thermo_lens.experiments.lab import effects, views

    out = Path(lab_dir)
    runs = current_rows(runs_frame(out), spec)
    tables = {"runs.csv": runs.to_csv(index=False, float_format="%.10g").encode()}
    atomic_write_bytes(out / "runs.csv", tables["runs.csv"])
    if spec.budgets or spec.primary:
        eff = effects.budget_effects_frame(runs, spec.comparisons(), budgets=spec.budget_steps(),
                                           primary=spec.primary, primary_metrics=spec.primary_metrics)
    else:
        eff = effects.effects_frame(runs, spec.comparisons())
    tables["effects.csv"] = eff.to_csv(index=False, float_format="%.10g").encode()
    atomic_write_bytes(out / "effects.csv", tables["effects.csv"])
    import hashlib

    # What the report's lab section checks before it reads the tables back (TABLES_RECORD).
    atomic_write_bytes(out / TABLES_RECORD, json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in tables.items()},
                                                       indent=1).encode() + b"\n")
    if len(runs):
        figs = make_folder(out, "figures")
        # With budgets, trajectories follow the longest budget's runs (one schedule per line).
        longest = runs.loc[runs["budget"] == max(spec.budget_steps())] if spec.budgets else runs
        figures = [("trajectories_last_block_gain", views.gain_trajectories(longest, "last_block_gain")),
                   ("trajectories_penultimate_gain", views.gain_trajectories(longest, "penultimate_gain"))]
        if len(eff) and "basis" in eff.columns:
            figures.append(("effects", views.effect_sizes(eff.loc[(eff["basis"] == "budget")
                                                                 & (eff["budget"] == max(spec.budget_steps()))])))
            for *_, ref_arm, arm in spec.comparisons():
                figures.append((f"per_seed_{arm}".replace("=", "_"), views.per_seed_effects(runs, ref_arm, arm)))
        elif len(eff):  # a lab without knobs (one arm) has no effects
            figures.append(("effects", views.effect_sizes(eff)))
        for name, fig in figures:
            html = fig.to_html(include_plotlyjs="cdn", full_html=True)
            atomic_write_bytes(figs / f"{name}.html", html.encode())
