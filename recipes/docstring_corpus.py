"""The builder of the zoo's docstring corpus (was ``thermo_lens/zoo/corpus.py``; kept for the record).

The corpus is now the fixed file ``thermo_lens/experiments/lab/corpora/stdlib-docstrings.jsonl.gz``, frozen by
``recipes/freeze_corpora.py`` with this builder; nothing in the package rebuilds it.

The corpus is the docstrings of a fixed, sorted list of pure-Python
standard-library modules (module docstrings, public classes and functions
defined in that module, and the methods defined directly on those classes),
gathered with :func:`inspect.cleandoc`, whitespace-normalised and
de-duplicated.  Nothing is downloaded; building it takes well under a second.

Determinism caveat: stdlib docstrings change between Python *versions* (and a
module missing from a stripped-down install is skipped), so the exact text --
and therefore its sha256 -- depends on the interpreter.  The recipe records
the Python version, the list of modules actually used and the sha256 of the
text each checkpoint was trained on.  Modules whose members differ by platform
or by C-accelerator build (``socket``, ``ssl``, ``os``, ``decimal``, ...)
are deliberately left out, so the same Python version gives the same text on
Linux, macOS and Windows.

Split: the documents keep their fixed order; the last
:data:`VAL_FRACTION` of the documents (by count, at least one) form the
held-out validation slice, the rest the training slice.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import platform
import re
import sys
import warnings
from dataclasses import dataclass, field

#: Fixed list of standard-library modules whose docstrings make up the corpus.
#: Kept sorted; the order of documents follows this list.
MODULES: tuple[str, ...] = tuple(
    sorted(
        """
        abc argparse ast asyncio.events asyncio.futures asyncio.locks asyncio.queues
        asyncio.streams asyncio.tasks base64 bdb calendar cmd codecs collections
        collections.abc concurrent.futures configparser contextlib copy copyreg csv
        dataclasses difflib dis email.headerregistry email.message email.parser
        email.policy email.utils enum filecmp fileinput fnmatch fractions ftplib
        functools getopt gettext glob graphlib gzip heapq hmac html html.parser
        http.client http.cookiejar http.cookies http.server imaplib importlib
        importlib.metadata inspect ipaddress json json.decoder json.encoder keyword
        linecache logging logging.config logging.handlers mailbox mimetypes netrc
        numbers optparse pathlib pdb pickletools pkgutil poplib pprint profile pstats
        py_compile pydoc queue quopri random reprlib rlcompleter runpy sched secrets
        shelve shlex shutil smtplib socketserver statistics string symtable sysconfig
        tabnanny tarfile tempfile textwrap threading timeit tokenize tomllib trace
        traceback types typing unittest.case unittest.loader unittest.mock
        unittest.result unittest.runner unittest.suite urllib.parse urllib.request
        urllib.response uuid warnings wave weakref xml.dom.minidom
        xml.etree.ElementTree zipapp zipfile
        """.split()
    )
)

#: Fraction of documents (taken from the end) held out for validation.
VAL_FRACTION = 0.05

#: Documents are joined with this separator in :attr:`Corpus.text`; the
#: tokenizer/recipe uses ``<|endoftext|>`` tokens between documents instead.
DOC_SEPARATOR = "\n\n"

_MIN_DOC_CHARS = 20


def _clean(doc: object) -> str | None:
    if not isinstance(doc, str):
        return None
    doc = inspect.cleandoc(doc)
    doc = doc.replace("\r\n", "\n").replace("\r", "\n")
    doc = re.sub(r"[ \t\f\v]+", " ", doc)  # collapse runs of horizontal whitespace
    doc = re.sub(r" *\n *", "\n", doc)  # no leading/trailing spaces on lines
    doc = re.sub(r"\n{3,}", "\n\n", doc)  # at most one blank line
    doc = doc.strip()
    return doc if len(doc) >= _MIN_DOC_CHARS else None


def _module_docs(modname: str, mod: object) -> list[str]:
    out: list[object] = [getattr(mod, "__doc__", None)]
    members = vars(mod)
    for name in sorted(members):
        if name.startswith("_"):
            continue
        obj = members[name]
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if getattr(obj, "__module__", None) != modname:
            continue  # re-exports / C accelerators: counted where defined, or not at all
        out.append(obj.__doc__)
        if inspect.isclass(obj):
            attrs = vars(obj)
            for aname in sorted(attrs):
                if aname.startswith("_") and aname != "__init__":
                    continue
                attr = attrs[aname]
                if isinstance(attr, (staticmethod, classmethod)):
                    attr = attr.__func__
                elif isinstance(attr, property):
                    attr = attr.fget
                if inspect.isfunction(attr):
                    out.append(attr.__doc__)
    return [d for d in (_clean(x) for x in out) if d is not None]


@dataclass(frozen=True)
class Corpus:
    """The gathered corpus: ordered documents plus provenance."""

    documents: tuple[str, ...]
    modules: tuple[str, ...]
    skipped_modules: tuple[str, ...]
    python_version: str
    n_val_documents: int = field(default=0)

    @property
    def text(self) -> str:
        return DOC_SEPARATOR.join(self.documents)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def train_documents(self) -> tuple[str, ...]:
        return self.documents[: len(self.documents) - self.n_val_documents]

    @property
    def val_documents(self) -> tuple[str, ...]:
        return self.documents[len(self.documents) - self.n_val_documents :]

    def describe(self) -> dict:
        """JSON-serialisable provenance (recorded in each ``recipe.json``)."""
        train_chars = sum(map(len, self.train_documents))
        val_chars = sum(map(len, self.val_documents))
        return {
            "description": (
                "Docstrings (inspect.cleandoc, whitespace-normalised, de-duplicated, >= "
                f"{_MIN_DOC_CHARS} chars) of a fixed sorted list of pure-Python stdlib "
                "modules: module docstrings, public classes/functions defined in the module, "
                "and methods defined directly on those classes. Text depends on the Python "
                "version."
            ),
            "builder": "recipes/docstring_corpus.py build_corpus (was thermo_lens.zoo.corpus)",
            "python_version": self.python_version,
            "python_implementation": platform.python_implementation(),
            "sha256": self.sha256,
            "n_documents": len(self.documents),
            "n_chars": len(self.text),
            "modules": list(self.modules),
            "skipped_modules": list(self.skipped_modules),
            "split": (
                f"last {VAL_FRACTION:.0%} of documents (in module order) held out for validation"
            ),
            "n_train_documents": len(self.train_documents),
            "n_val_documents": self.n_val_documents,
            "train_chars": train_chars,
            "val_chars": val_chars,
        }


def build_corpus(modules: tuple[str, ...] = MODULES, val_fraction: float = VAL_FRACTION) -> Corpus:
    """Gather the corpus from the running interpreter's standard library."""
    docs: list[str] = []
    seen: set[str] = set()
    used: list[str] = []
    skipped: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for modname in modules:
            try:
                mod = importlib.import_module(modname)
            except Exception:  # pragma: no cover - stripped-down installs
                skipped.append(modname)
                continue
            used.append(modname)
            for d in _module_docs(modname, mod):
                if d not in seen:
                    seen.add(d)
                    docs.append(d)
    n_val = max(1, int(round(len(docs) * val_fraction)))
    return Corpus(
        documents=tuple(docs),
        modules=tuple(used),
        skipped_modules=tuple(skipped),
        python_version=".".join(map(str, sys.version_info[:3])),
        n_val_documents=n_val,
    )


if __name__ == "__main__":  # pragma: no cover
    import json

    c = build_corpus()
    print(json.dumps({k: v for k, v in c.describe().items() if k != "modules"}, indent=2))
