"""Freeze the heritage lab's two training corpora into fixed files (run once; the output is committed).

Usage (from the repository root, in a *fresh* interpreter: importing thermo-lens or its
dependencies first changes one stdlib docstring, see below)::

    python recipes/freeze_corpora.py --out thermo_lens/experiments/lab/corpora

Writes ``<name>.jsonl.gz`` (one JSON string per document, in order; gzip with mtime 0) and
``index.json`` (per corpus: file, sha256 of the uncompressed JSONL, sha256 of the text
``"\\n\\n".join(documents)``, document counts, validation split, description, licence).

Corpora:

``stdlib-docstrings``
    The docstring corpus the embedded zoo was trained on (``recipes/docstring_corpus.py``, which
    was ``thermo_lens/zoo/corpus.py``): English prose about code. Its text sha256 is checked
    against the one recorded in the zoo's ``recipe.json``; it matches only when built on CPython
    3.11.7 *before* anything imports ``torch``/``transformer_lens`` (one of those replaces
    ``inspect.getsourcefile``'s docstring, which drops one document), which is why the corpus is
    now a file and not rebuilt from the running Python.
``stdlib-code``
    Python source code of the same stdlib modules with docstrings removed (``ast.parse`` ->
    drop docstring expressions -> ``ast.unparse``): one document per top-level function or class,
    in module order, truncated to about the size of ``stdlib-docstrings``. Code, not prose.

Both are derived from the CPython standard library (PSF License Agreement, which permits
redistribution of derived works with its notice; see ``thermo_lens/experiments/lab/corpora/NOTICE``).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib
import inspect
import json
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import docstring_corpus  # noqa: E402  (before any heavy import: see the module docstring)

ZOO_CORPUS_SHA256 = "3593b6eab0d4200567c0cf2c905732c4bb3e3adcb6a51e069dbbac7102fb6c74"
VAL_FRACTION = 0.05


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]


def code_documents(modules: tuple[str, ...], max_chars: int) -> tuple[list[str], list[str]]:
    docs, used, total, seen = [], [], 0, set()
    for name in modules:
        mod = importlib.import_module(name)
        try:
            src = inspect.getsource(mod)
        except (OSError, TypeError):
            continue
        tree = ast.parse(src)
        _strip_docstrings(tree)
        used.append(name)
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            text = ast.unparse(node).strip()
            if len(text) < 20 or text in seen:
                continue
            seen.add(text)
            docs.append(text)
            total += len(text) + 2
            if total >= max_chars:
                return docs, used
    return docs, used


def _write(out: Path, name: str, docs: list[str], meta: dict) -> dict:
    jsonl = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")
    (out / f"{name}.jsonl.gz").write_bytes(gzip.compress(jsonl, compresslevel=9, mtime=0))
    n_val = max(1, int(round(len(docs) * VAL_FRACTION)))
    text = "\n\n".join(docs)
    return {
        "file": f"{name}.jsonl.gz",
        "sha256": hashlib.sha256(jsonl).hexdigest(),
        "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "n_documents": len(docs),
        "n_val_documents": n_val,
        "n_chars": len(text),
        "split": f"last {n_val} documents ({VAL_FRACTION:.0%}, in order) held out for validation",
        "frozen_with": f"recipes/freeze_corpora.py on {platform.python_implementation()} {platform.python_version()}",
        "licence": "derived from the CPython standard library, PSF License Agreement (see NOTICE)",
        **meta,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE.parent / "thermo_lens" / "lab" / "corpora")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    a = docstring_corpus.build_corpus()
    if a.sha256 != ZOO_CORPUS_SHA256:
        print(f"warning: docstring corpus sha256 {a.sha256} != the zoo's {ZOO_CORPUS_SHA256} "
              f"(Python {platform.python_version()}); the frozen file will not be the zoo's corpus",
              file=sys.stderr)
    index = {
        "stdlib-docstrings": _write(args.out, "stdlib-docstrings", list(a.documents), {
            "description": "Docstrings of a fixed sorted list of pure-Python stdlib modules (module, public "
                           "classes/functions, their methods; inspect.cleandoc, whitespace-normalised, "
                           "de-duplicated, >= 20 chars): English prose about code. The embedded zoo's corpus.",
            "character": "prose",
            "matches_zoo_recipe_sha256": a.sha256 == ZOO_CORPUS_SHA256,
            "modules": list(a.modules),
        }),
    }
    docs, used = code_documents(docstring_corpus.MODULES, max_chars=len(a.text))
    index["stdlib-code"] = _write(args.out, "stdlib-code", docs, {
        "description": "Python source of the same stdlib modules, docstrings removed (ast.unparse, so no "
                       "comments and normalised layout): one document per top-level function or class, "
                       "in module order, cut at the size of stdlib-docstrings. Code, not prose.",
        "character": "code",
        "modules": used,
    })
    assert index["stdlib-docstrings"]["n_val_documents"] == a.n_val_documents
    (args.out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    for k, v in index.items():
        print(k, v["n_documents"], v["n_chars"], v["text_sha256"][:16], (args.out / v["file"]).stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
