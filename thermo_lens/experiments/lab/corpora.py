"""The heritage lab's training corpora: fixed files shipped with thermo-lens, verified by SHA-256.

A corpus is an ordered list of documents; the last ``n_val_documents`` are the held-out
validation slice. The files never change with the running Python (they were frozen once by
``recipes/freeze_corpora.py`` in the repository), and every load checks the SHA-256 recorded in
``corpora/index.json``, so a model trained today on ``stdlib-docstrings`` saw exactly the text the
embedded zoo saw.

``stdlib-docstrings``  English prose about code (docstrings of ~120 stdlib modules); the zoo's corpus.
``stdlib-code``        Python source of the same modules, docstrings removed: code, not prose.

>>> from thermo_lens.experiments.lab import corpora
>>> corpora.names()
['stdlib-code', 'stdlib-docstrings']
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from thermo_lens.core.errors import ThermoLensInputError

__all__ = ["Corpus", "CorpusError", "CORPORA_DIR", "names", "load", "describe"]

CORPORA_DIR = Path(__file__).resolve().parent / "corpora"


class CorpusError(ThermoLensInputError):
    """Unknown corpus name, or a corpus file that does not match its recorded SHA-256."""


@dataclass(frozen=True)
class Corpus:
    """An ordered list of documents and its held-out tail."""

    name: str
    documents: tuple[str, ...]
    n_val_documents: int
    sha256: str

    @property
    def train_documents(self) -> tuple[str, ...]:
        return self.documents[: len(self.documents) - self.n_val_documents]

    @property
    def val_documents(self) -> tuple[str, ...]:
        return self.documents[len(self.documents) - self.n_val_documents :]

    @property
    def text_sha256(self) -> str:
        """SHA-256 of ``"\\n\\n".join(documents)`` (what the zoo's ``recipe.json`` records)."""
        return hashlib.sha256("\n\n".join(self.documents).encode("utf-8")).hexdigest()


@lru_cache(maxsize=1)
def _index() -> dict[str, dict[str, Any]]:
    return json.loads((CORPORA_DIR / "index.json").read_text())


def names() -> list[str]:
    """Sorted names of the shipped corpora."""
    return sorted(_index())


def describe(name: str) -> dict[str, Any]:
    """The index entry of ``name``: file, sha256, text_sha256, counts, description, licence."""
    if name not in _index():
        raise CorpusError(f"unknown corpus {name!r}; available: {', '.join(names())}")
    return dict(_index()[name])


@lru_cache(maxsize=4)
def load(name: str) -> Corpus:
    """Read and verify corpus ``name``.

    Raises:
        CorpusError: unknown name (the message lists the corpora) or a SHA-256 mismatch.
    """
    entry = describe(name)
    path = CORPORA_DIR / entry["file"]
    raw = gzip.decompress(path.read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != entry["sha256"]:
        raise CorpusError(f"{path}: SHA-256 {digest} does not match the recorded {entry['sha256']}; "
                          "the corpus file was altered (reinstall thermo-lens)")
    docs = tuple(json.loads(line) for line in raw.decode("utf-8").splitlines())
    return Corpus(name=name, documents=docs, n_val_documents=int(entry["n_val_documents"]), sha256=digest)
