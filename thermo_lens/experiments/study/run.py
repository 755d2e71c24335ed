"""Running (or resuming) a study: :func:`run_study`, and :func:`profile_one`, what each model's task does.

One run at a time per folder (an exclusive lock on ``DIR/.lock``); a model is skipped only when
its recorded result is accepted (:func:`thermo_lens.experiments.study.manifest.check_entry`) and its weights
are the ones measured (:mod:`thermo_lens.experiments.study.fingerprint`); everything else is profiled, each
result written atomically as soon as it is done, each failure recorded while the study goes on.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.safe_io import FolderLock, FolderLockedError, atomic_write_bytes, remove_stale_temps
from thermo_lens.experiments.study.executors import check_executor, describe, probe_ray, run_local, run_ray
from thermo_lens.experiments.study.fingerprint import checkpoint_fingerprint, weights_changed
from thermo_lens.experiments.study.folder import prepare_out
from thermo_lens.experiments.study.manifest import check_entry, model_record, read_manifest, settings_key, sha256, write_manifest
from thermo_lens.experiments.study.spec import ModelSpec, StudySpec
from thermo_lens.experiments.study.spec_file import load_spec

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

__all__ = ["StudyOutcome", "StudyLockedError", "run_study", "profile_one", "load_model", "model_fingerprint"]

ProfileFn = Callable[[ModelSpec, dict[str, Any]], str]
FingerprintFn = Callable[[ModelSpec, "Mapping[str, Any] | None"], "dict[str, Any] | None"]


class StudyLockedError(FolderLockedError):
    """Another run holds the study directory."""


@dataclass(frozen=True)
class StudyOutcome:
    """What a run did: ids computed now, skipped (already done), and failed (with errors)."""

    out_dir: str
    done: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: dict[str, str]

    @property
    def ok(self) -> bool:
        return not self.failed


def model_fingerprint(model: ModelSpec, previous: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The checkpoint fingerprint of a model as :func:`load_model` loads it
    (:func:`thermo_lens.experiments.study.fingerprint.checkpoint_fingerprint`)."""
    return checkpoint_fingerprint(model.zoo, None if model.zoo else str(model.name), previous)


def run_study(
    spec: StudySpec | str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    executor: str = "local",
    ray_address: str | None = None,
    progress: bool | None = None,
    profile_fn: ProfileFn | None = None,
    fingerprint: FingerprintFn | Literal["auto"] | None = "auto",
) -> StudyOutcome:
    """Run (or resume) a study into ``out_dir``; see :mod:`thermo_lens.experiments.study`.

    Args:
        spec: a :class:`StudySpec` or the path of a spec file.
        out_dir: the study directory: new, empty, or one a study wrote before (created if needed;
            a folder of other files is refused, :mod:`thermo_lens.experiments.study.folder`).
        executor: ``"local"`` or ``"ray"``.
        ray_address: for ``"ray"``: ``None`` starts a local Ray (``ray.init()``); an address
            (``"auto"``, ``"HOST:PORT"``, ``"ray://HOST:10001"``) joins a cluster, which must
            answer within :data:`thermo_lens.experiments.study.executors.RAY_CONNECT_TIMEOUT` seconds.
        progress: progress bar over models (default: on when stderr is a terminal).
        profile_fn: ``(ModelSpec, settings) -> JSON text``; default :func:`profile_one` (loads
            and profiles).
        fingerprint: ``(ModelSpec, previous fingerprint) -> fingerprint`` of the weights a model's
            result is measured on; a result is reused only while it is unchanged. ``"auto"``:
            :func:`model_fingerprint` with the default ``profile_fn``, none with a custom one
            (whose names mean what its loader makes of them). ``None``: no fingerprints.

    Returns:
        :class:`StudyOutcome`. Failures of single models are recorded in the manifest, never
        raised. The manifest lists the spec's models as current (``study.models``); entries of
        models no longer in the spec stay, marked ``stale``, with their files.

    Raises:
        StudyLockedError: another run uses ``out_dir``.
        StudyManifestError: ``out_dir`` holds a corrupt manifest.
        thermo_lens.experiments.study.folder.StudyFolderError: ``out_dir`` is empty, a file, a dangling link
            or a folder of files thermo-lens did not write.
        thermo_lens.experiments.study.executors.StudyExecutorError: a bad executor or Ray address, or a Ray
            cluster that does not answer.
        thermo_lens.core.safe_io.SafeIOError: the folder is not writable, or the disk is full.
    """
    fingerprint_fn = (model_fingerprint if profile_fn is None else None) if fingerprint == "auto" else fingerprint
    profile_fn = profile_fn or profile_one
    if not isinstance(spec, StudySpec):
        spec = load_spec(spec)
    check_executor(executor, ray_address)
    if executor == "local":
        _check_local_devices(spec)
    else:
        probe_ray(ray_address)
    out = prepare_out(out_dir)
    with FolderLock(out, what="thermo-lens study run", error=StudyLockedError):
        remove_stale_temps(out)  # left by a killed run; nobody else writes here while we hold the lock
        book = _Book(out, read_manifest(out), spec, executor, fingerprint_fn)
        todo, skipped = book.plan()
        from tqdm.auto import tqdm

        show = progress if progress is not None else sys.stderr.isatty()
        bar = tqdm(total=len(todo), desc=f"study {spec.name}", unit="model", disable=not show)
        if executor == "local":
            run_local(todo, spec.settings(), profile_fn, book.start, book.record, bar)
        else:
            run_ray(todo, spec.settings(), profile_fn, book.start, book.record, bar, ray_address)
        bar.close()
    return StudyOutcome(out_dir=str(out), done=tuple(book.done), skipped=tuple(skipped), failed=book.failed)


def _check_local_devices(spec: StudySpec) -> None:
    """Every model runs here: its device must exist here, checked before any load."""
    from thermo_lens.core import validate as V

    for m in spec.models:
        try:
            V.device(m.device)
            V.device_map(m.device_map)
        except ThermoLensInputError as e:
            raise ThermoLensInputError(f"model {V.excerpt(m.id, 60)}: {e}") from None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class _Book:
    """The manifest of one run: which models to profile, and what became of each."""

    def __init__(self, out: Path, manifest: dict[str, Any], spec: StudySpec, executor: str,
                 fingerprint: FingerprintFn | None):
        self.out, self.manifest, self.spec, self.fingerprint = out, manifest, spec, fingerprint
        self.settings = spec.settings()
        current = [m.id for m in spec.models]
        manifest["thermo_lens_manifest"] = 2
        manifest["study"] = {"name": spec.name, "spec": spec.path, "settings": self.settings,
                             "executor": executor, "models": current}
        self.entries: dict[str, Any] = manifest.setdefault("models", {})
        for mid, entry in self.entries.items():
            if mid in current:
                entry.pop("stale", None)
            else:
                entry["stale"] = True  # kept on disk, left out of summaries and reports
        self.done: list[str] = []
        self.failed: dict[str, str] = {}
        self.weights: dict[str, Any] = {}  # fingerprints taken before each model was profiled

    def plan(self) -> tuple[list[ModelSpec], list[str]]:
        """``(to profile, skipped)``; writes the manifest with the new ones pending."""
        todo, skipped = [], []
        for m in self.spec.models:
            previous = self.entries.get(m.id)
            key = settings_key(self.settings, model_record(m))
            prof, why = check_entry(self.out, m.id, previous, self.settings, key)
            if prof is not None and isinstance(previous, dict):
                why = self._weights_unchanged(m, previous)
                if why is None:
                    skipped.append(m.id)
                    continue
            todo.append(m)
            self.entries[m.id] = {"status": "pending", "source": m.source, "lab": m.lab, "family": m.family,
                                  "model": model_record(m), "settings_key": key}
            if isinstance(previous, dict) and previous.get("status") == "done":
                self.entries[m.id]["note"] = f"previous result not used ({why}): recomputed"
        self.write()
        return todo, skipped

    def _weights_unchanged(self, m: ModelSpec, entry: dict[str, Any]) -> str | None:
        """``None`` when the recorded result may be reused (and its fingerprint is refreshed),
        else why not."""
        if self.fingerprint is None:
            return None
        now = self.fingerprint(m, entry.get("weights"))
        why = weights_changed(entry.get("weights"), now)
        if why is None and now is not None and now.get("digest"):
            entry["weights"] = now  # an older manifest adopts it; a touched file's new stat is kept
        return why

    def write(self) -> None:
        write_manifest(self.out, self.manifest)

    def start(self, models: list[ModelSpec]) -> None:
        for m in models:
            if self.fingerprint is not None:
                self.weights[m.id] = self.fingerprint(m, None)
            self.entries[m.id].update(status="running", started=_now())
        self.write()

    def record(self, m: ModelSpec, text: str | None, error: str | None, seconds: float, tb: str | None) -> None:
        entry = self.entries[m.id]
        entry.update(finished=_now(), seconds=round(seconds, 3))
        if tb is not None:
            entry["traceback"] = tb
        if error is None:
            error = self._save(m, text, entry)
        if error is not None:
            entry.update(status="failed", error=error)
            self.failed[m.id] = error
        self.write()

    def _save(self, m: ModelSpec, text: str | None, entry: dict[str, Any]) -> str | None:
        """Write the result and mark it done; returns the error that kept it from being saved."""
        try:
            weights = self._weights_after(m)
            from thermo_lens.measures.profile import ThermoProfile

            if not isinstance(text, str) or not text.lstrip().startswith("{"):
                raise TypeError(f"the profile function returned {type(text).__name__}, not profile JSON text")
            ThermoProfile.from_json(text)  # never write a result that does not read back
            data = text.encode()
            fname = f"{m.id}.json"
            atomic_write_bytes(self.out / fname, data)
            entry.update(status="done", file=fname, sha256=sha256(data), error=None, weights=weights)
            self.done.append(m.id)
            return None
        except Exception as e:  # noqa: BLE001 - recorded, the study goes on
            return f"result could not be saved: {describe(e)}"

    def _weights_after(self, m: ModelSpec) -> dict[str, Any] | None:
        """The fingerprint to record: the one taken before the profile, unless the checkpoint
        changed meanwhile (then the result is refused); a hub model's revision as now cached."""
        if self.fingerprint is None:
            return None
        before = self.weights.get(m.id)
        after = self.fingerprint(m, before)
        if before is not None and before.get("kind") != "hub":
            why = weights_changed(before, after)
            if why is not None:
                raise RuntimeError(f"{why} while it was being profiled; rerun to profile the new weights")
        return after


# ---------------------------------------------------------------------------- one model
def load_model(model: ModelSpec) -> TransformerBridge:
    """Boot the model a :class:`ModelSpec` names (zoo, local directory or hub) as a bridge."""
    import torch

    kwargs: dict[str, Any] = {}
    if model.dtype and model.dtype != "auto":
        kwargs["dtype"] = model.dtype if isinstance(model.dtype, torch.dtype) else getattr(torch, model.dtype)
    if model.device_map is not None:
        kwargs["device_map"] = model.device_map
    elif model.device:
        kwargs["device"] = model.device
    if model.zoo:
        from thermo_lens import zoo

        return zoo.load(model.zoo, **kwargs)
    from thermo_lens.core.host import import_bridge

    TransformerBridge = import_bridge("loading a study model by name")

    if model.trust_remote_code:
        kwargs["trust_remote_code"] = True
    name = str(model.name)
    name = os.path.expanduser(name) if name.startswith("~") else name
    return TransformerBridge.boot_transformers(name, **kwargs)


def profile_one(model: ModelSpec, settings: dict[str, Any]) -> str:
    """Load one model and profile it; returns the profile's JSON text (used by every executor)."""
    import torch

    from thermo_lens.core import prompts as prompt_sets
    from thermo_lens.measures.profile import profile

    if model.threads:
        torch.set_num_threads(model.threads)
    bridge = load_model(model)
    try:
        prompt_set = prompt_sets.as_prompt_set(settings.get("prompts", "paper25"))
        result = profile(
            bridge,
            prompt_set,
            prepend_bos=settings.get("prepend_bos", "host"),
            token_scope=settings.get("token_scope", "all_but_first"),
            batch_size=settings.get("batch_size", 8),
            truncate=settings.get("truncate", False),
            name=model.id,
            lab=model.lab,
            family=model.family,
            twin_of=model.twin_of,
            source=model.source,
            progress=False,
        )
        return result.to_json()
    finally:
        del bridge
