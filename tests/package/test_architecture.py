"""The package's shape: folders that show the layers, one import direction, no cycles, one error base.

The layers, lowest first. A module's layer is its folder's (the longest folder prefix below); a
module may import its own layer and the layers below it, never one above, not even inside a
function: a deferred import still ties the two modules together.

0. core/               errors, validation, host adapters, tokens, the model view, the pass, results,
                       provenance, the metric and measurement registries, safe I/O, offloaded weights;
   stats/              exact tests, paired differences; zoo/ and testing (embedded and test checkpoints)
1. measures/           gain, anisotropy, attribution, sheaf, spectral, depth, write norms, SAE
                       comparison, robustness, profile, head ablation
   experiments/sweeps  patching and ablation sweeps (compositions of the pass and the measures)
2. paper/, laws/       the paper's definitions and numbers, cross-model laws
3. views/, definitions figures, the definitions page
4. experiments/study   resumable multi-model studies (reading and writing their folders)
5. report              the offline HTML report (of profiles or a study folder; extra sections plug in)
6. experiments/lab     the heritage lab (trains models, runs studies, writes reports)
7. cli                 the command line

``thermo_lens/__init__.py`` is the package's front door and may re-export from any layer;
``thermo_lens/_moved.py`` keeps the module paths from before the folders importable for a release.
Plug-ins point the other way: a result's ``.plot()`` finds the figure that views registered for
it (``thermo_lens.core.result.register_plot``), so results never import views.

Reads the source only: cheap, no model.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import thermo_lens

ROOT = Path(thermo_lens.__file__).parent

#: Folder (or top-level module) -> layer. A new top-level module or folder must be added here.
LAYERS: dict[str, int] = {
    "core": 0, "stats": 0, "zoo": 0, "testing": 0, "_lazy": 0, "_moved": 0,
    "measures": 1, "experiments": 1, "experiments.sweeps": 1,
    "paper": 2, "laws": 2,
    "views": 3, "definitions": 3,
    "experiments.study": 4,
    "report": 5,
    "experiments.lab": 6,
    "cli": 7,
}

# Known upward imports still being removed. Must only shrink: a new entry is a defect.
KNOWN_UPWARD: set[tuple[str, str]] = set()
# Known cycles still being removed; must only shrink.
KNOWN_CYCLES: list[list[str]] = [
]

#: `Any` annotations in the package; the count may only go down.
ANY_CEILING = 58


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = f
    return out


def _edges() -> set[tuple[str, str]]:
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges = set()
    for m, f in mods.items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = m.split(".")[: len(m.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                if t.startswith("thermo_lens"):
                    r = resolve(t)
                    if r and r != m:
                        edges.add((m, r))
    return edges


def _layer(module: str) -> int | None:
    parts = module.split(".")[1:]
    if not parts:
        return None  # the package's front door
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    return None


def test_every_module_has_a_layer():
    missing = sorted({m.split(".")[1] for m in _modules() if "." in m and _layer(m) is None})
    assert not missing, f"add these folders or modules to LAYERS (and to the docstring's table): {missing}"


def test_the_top_level_is_folders():
    # Modules live in the folder of their layer; the top level holds the front door, the command line,
    # the report, the definitions page and the test checkpoints. A new top-level module is a defect.
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")
    assert top == ["_lazy", "_moved", "cli", "definitions", "report", "testing"], top
    folders = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert folders == ["core", "experiments", "laws", "measures", "paper", "stats", "views", "zoo"], folders


def test_any_annotations_only_shrink():
    # `Any` says nothing to a reader or a type checker.
    n = sum(len(re.findall(r"(?::|->) Any\b", f.read_text(encoding="utf-8"))) for f in ROOT.rglob("*.py"))
    assert n <= ANY_CEILING, f"{n} `Any` annotations (ceiling {ANY_CEILING}): type the new ones"


@pytest.mark.slow
def test_no_upward_import():
    upward = {(a, b) for a, b in _edges()
              if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)}  # type: ignore[operator]
    new = sorted(upward - KNOWN_UPWARD)
    assert not new, "imports that run upward (core -> measures -> paper -> views -> study -> report -> lab -> cli): " + \
        ", ".join(f"{a} -> {b}" for a, b in new)
    gone = sorted(KNOWN_UPWARD - upward)
    assert not gone, f"fixed, so remove from KNOWN_UPWARD: {gone}"


@pytest.mark.slow
def test_no_import_cycle():
    graph: dict[str, set[str]] = {}
    for a, b in _edges():
        if _layer(a) is not None and _layer(b) is not None:
            graph.setdefault(a, set()).add(b)
    # Tarjan's strongly connected components, iteratively.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        cycles.append(sorted(comp))
    new = [c for c in cycles if c not in KNOWN_CYCLES]
    assert not new, "import cycles: " + "; ".join(" <-> ".join(c) for c in new)
    gone = [c for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"fixed, so remove from KNOWN_CYCLES: {gone}"


def _public_exceptions() -> list[type]:
    import importlib

    found = {}
    for m in sorted(_modules()):
        try:
            mod = importlib.import_module(m)
        except ImportError:  # an optional dependency (ray ...) missing here
            continue
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.startswith("thermo_lens") \
                    and not name.startswith("_"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


@pytest.mark.slow
def test_every_public_exception_subclasses_thermo_lens_error():
    from thermo_lens.core.errors import ThermoLensError, ThermoLensWarning

    excs = _public_exceptions()
    assert len(excs) >= 10
    bad = [e.__qualname__ for e in excs if issubclass(e, Exception) and not issubclass(e, (ThermoLensError, Warning))]
    assert not bad, f"exceptions outside ThermoLensError: {bad}"
    warns = [e.__qualname__ for e in excs if issubclass(e, Warning) and not issubclass(e, ThermoLensWarning)]
    assert not warns, f"warnings outside ThermoLensWarning: {warns}"
    # Each also subclasses a built-in besides Exception, so `except ValueError` and friends work.
    plain = [e.__qualname__ for e in excs if issubclass(e, ThermoLensError) and e is not ThermoLensError
             and not issubclass(e, (ValueError, TypeError, RuntimeError, ArithmeticError, OSError))]
    assert not plain, f"exceptions without a matching built-in base: {plain}"


def test_pre_release_aliases_are_gone():
    # 0.1.0 had no users to keep old paths for: one name per thing.
    import importlib

    import thermo_lens.measures.gain

    for name in ("paper_metric", "PAPER_METRICS", "PaperMetric", "TOKEN_SCOPES", "collect_for_scope"):
        assert not hasattr(thermo_lens.measures.gain, name) or name == "TOKEN_SCOPES" and "TOKEN_SCOPES" not in thermo_lens.measures.gain.__all__
    with pytest.raises(ImportError):
        importlib.import_module("thermo_lens.reference")
    with pytest.raises(ImportError):
        importlib.import_module("thermo_lens.hooks")
