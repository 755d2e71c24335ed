"""Many-model studies: a spec file in, one directory of per-model profiles and a manifest out.

A study spec (TOML, or YAML where PyYAML is installed) lists models and the measurement
settings::

    [study]
    name = "heritage"
    prompts = "paper25"          # a built-in prompt set (thermo_lens.core.prompts) or a list
    prepend_bos = "host"         # "host" (as model.to_tokens) / true / false / "tokenizer"
    token_scope = "all_but_first"
    batch_size = 8

    [[models]]
    name = "EleutherAI/pythia-160m"   # hub name, local checkpoint directory, or zoo name
    lab = "EleutherAI"
    family = "Pythia"
    dtype = "float16"                 # optional
    device_map = "auto"               # optional, for models larger than one device
    num_gpus = 1                      # optional, what a Ray task asks for

    [[models]]
    zoo = "gpt2-tiny-wd"              # an embedded model (thermo_lens.zoo)
    lab = "thermo-lens zoo"
    twin_of = "gpt2-tiny-nowd"        # optional: base model of a fine-tuned/twin pair

Running a study (:func:`run_study`, or ``thermo-lens study SPEC --out DIR``):

* ``DIR`` is new, empty, or a folder a study wrote before (it holds a thermo-lens
  ``manifest.json``); a folder of other files, an empty name, a file or a dangling link is refused
  before anything is written (:mod:`thermo_lens.experiments.study.folder`);
* each model's :class:`~thermo_lens.measures.profile.ThermoProfile` is written to ``DIR/<id>.json``
  atomically (a temporary file in ``DIR`` + rename, never through a symlink:
  :mod:`thermo_lens.core.safe_io`) as soon as it is done, and ``DIR/manifest.json`` records every
  model's status (``done`` with the file's SHA-256 and the fingerprint of the weights it was
  measured on, or ``failed`` with its error) (:mod:`thermo_lens.experiments.study.manifest`);
* an ``id`` names a file, so it is a slug (letters, digits, ``. _ - + =``) and never a
  reserved name (``manifest``, ``summary``, ``report``, ``lock``); ids derived from names are
  slugged, and in ``thermo-lens profile a/tiny b/tiny`` made unique (``tiny``, ``tiny-2``);
* the manifest is the source of truth for the current spec: models no longer in the spec keep
  their files but are marked ``stale`` and left out of summaries and reports;
* rerunning resumes: a model is skipped only when the manifest says done *and* its file is
  ``<id>.json``, matches the recorded SHA-256, names the same model, has the same settings, and
  the model's checkpoint still holds the weights it was measured on (a local folder's files by
  content, a hub model's cached revision: :mod:`thermo_lens.experiments.study.fingerprint`); a missing,
  corrupt or edited file or replaced weights are detected and recomputed, never silently used;
* a failing model (load error, unknown name, OOM, NaN) is recorded and the study goes on;
* every option is validated (:mod:`thermo_lens.core.validate`) when the spec is read, before any
  model is loaded; spec files are read with limits (1 MiB, 32 levels, 200,000 values with YAML
  aliases expanded) and a key given twice is an error (:mod:`thermo_lens.experiments.study.spec_file`);
* one run at a time per directory: a second concurrent run is refused (an exclusive lock on
  ``DIR/.lock``, removed when the run ends; temporary files of a killed run are removed by the
  next one);
* executors: ``"local"`` (in this process, one model after another) and ``"ray"`` (one model
  per Ray task, each asking for its ``num_gpus``; ``ray.init()`` locally or
  ``ray.init(address=...)`` on a cluster, which must answer within 10 s:
  :mod:`thermo_lens.experiments.study.executors`). Results are written only by the driver.

Reading a study: :func:`read_study` and :func:`load_profiles` (:mod:`thermo_lens.experiments.study.read`).
"""

from __future__ import annotations

from thermo_lens.core.safe_io import atomic_write_bytes as _atomic_write  # noqa: F401 - the lab's old import (moves to safe_io)
from thermo_lens.experiments.study.executors import StudyExecutorError
from thermo_lens.experiments.study.fingerprint import checkpoint_fingerprint, weights_changed
from thermo_lens.experiments.study.folder import StudyFolderError, output_path
from thermo_lens.experiments.study.manifest import MANIFEST, StudyManifestError, read_manifest
from thermo_lens.experiments.study.read import StudyContents, load_profiles, read_study
from thermo_lens.experiments.study.run import StudyLockedError, StudyOutcome, load_model, model_fingerprint, profile_one, run_study
from thermo_lens.experiments.study.spec import ModelSpec, StudySpec, StudySpecError, default_id, model_from_name
from thermo_lens.experiments.study.spec_file import load_spec

__all__ = [
    "ModelSpec",
    "StudySpec",
    "StudySpecError",
    "StudyLockedError",
    "StudyManifestError",
    "StudyFolderError",
    "StudyExecutorError",
    "StudyOutcome",
    "StudyContents",
    "MANIFEST",
    "output_path",
    "load_spec",
    "model_from_name",
    "default_id",
    "run_study",
    "profile_one",
    "load_model",
    "model_fingerprint",
    "checkpoint_fingerprint",
    "weights_changed",
    "read_manifest",
    "load_profiles",
    "read_study",
]
