"""Reading a study folder: the accepted profiles of the current spec's models, and why others are not.

A result is accepted only when its manifest entry, file name, SHA-256, recorded model id and
settings all agree (:func:`thermo_lens.experiments.study.manifest.check_entry`) and, where the checkpoint is
there to compare with, its weights are still the ones measured
(:mod:`thermo_lens.experiments.study.fingerprint`). Nothing is written.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thermo_lens.core import validate as V
from thermo_lens.core.safe_io import printable
from thermo_lens.experiments.study.fingerprint import checkpoint_fingerprint, weights_changed
from thermo_lens.experiments.study.manifest import check_entry, read_manifest

__all__ = ["StudyContents", "read_study", "load_profiles"]


@dataclass(frozen=True)
class StudyContents:
    """A study folder as the manifest describes it.

    Attributes:
        profiles: id -> ThermoProfile, the accepted results of the current spec's models.
        stale: ids of results from an earlier spec (kept on disk, left out of summaries/reports).
        failed: id -> error of current models that failed.
        problems: id -> why a current model's recorded result was not accepted (missing,
            corrupt, edited, another model's file, other settings, changed weights): rerun the
            study to recompute.
        manifest: the manifest itself.
    """

    profiles: dict[str, Any]
    stale: tuple[str, ...]
    failed: dict[str, str]
    problems: dict[str, str]
    manifest: dict[str, Any]


def read_study(out_dir: str | os.PathLike) -> StudyContents:
    """Read a study folder: accepted profiles, stale ids, failures and problems (never raises for
    one bad result; raises :class:`~thermo_lens.experiments.study.manifest.StudyManifestError` for a bad manifest)."""
    out = Path(out_dir)
    manifest = read_manifest(out)
    entries = manifest.get("models", {})
    study = manifest.get("study", {})
    current = study.get("models")
    current = list(entries) if current is None else current
    settings = study.get("settings") if isinstance(study.get("settings"), dict) else None
    profiles, failed, problems = {}, {}, {}
    for mid in current:
        entry = entries.get(mid)
        if not isinstance(entry, dict):
            problems[mid] = "listed in the study but has no manifest entry"
            continue
        if entry.get("status") == "failed":
            failed[mid] = str(entry.get("error") or "failed")
            continue
        if entry.get("status") != "done":
            problems[mid] = f"status {V.excerpt(entry.get('status'), 30)}: not finished"
            continue
        prof, why = check_entry(out, mid, entry, settings)
        if prof is not None:
            why = _weights_problem(entry)
        if why is None:
            profiles[mid] = prof
        else:
            problems[mid] = why
    stale = tuple(mid for mid in entries if mid not in current)
    return StudyContents(profiles, stale, failed, problems, manifest)


def _weights_problem(entry: dict[str, Any]) -> str | None:
    """Why the checkpoint an accepted result was measured on has changed since, if it is here to
    compare with (a study folder read on another machine is taken as measured)."""
    recorded, model = entry.get("weights"), entry.get("model")
    if not isinstance(recorded, dict) or not recorded.get("digest") or not isinstance(model, dict):
        return None
    zoo, name = model.get("zoo"), model.get("name")
    if not isinstance(zoo, (str, type(None))) or not isinstance(name, (str, type(None))) or (zoo is None) == (name is None):
        return None
    if zoo is not None:
        from thermo_lens import zoo as zoo_models

        if zoo not in zoo_models.names():
            return None
    why = weights_changed(recorded, checkpoint_fingerprint(zoo, name, recorded), strict=False)
    return None if why is None else f"{why}; rerun the study to profile the new weights"


def load_profiles(out_dir: str | os.PathLike, *, strict: bool = False) -> dict[str, Any]:
    """The accepted profiles of a study directory's current models, by model id.

    A result is accepted only when its manifest entry, file name, SHA-256, recorded model id,
    settings and (where the checkpoint is here) weights all agree (see :func:`read_study`).
    Results that are not accepted are left out with a warning (``strict=True``: a
    ``RuntimeError``); stale results of models no longer in the spec are left out silently.
    """
    contents = read_study(out_dir)
    if contents.problems:
        msg = "; ".join(f"{k}: {v}" for k, v in list(contents.problems.items())[:20])
        msg = printable(f"{Path(out_dir)}: results left out ({msg}); rerun the study to recompute them")
        if strict:
            raise RuntimeError(msg)
        warnings.warn(msg, stacklevel=2)
    return contents.profiles
