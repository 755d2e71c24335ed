"""The package's shape: one import direction, no cycles, one error base.

The layers, lowest first (a module may import its own layer and the layers below it, never one
above, not even inside a function: a deferred import still ties the two modules together):

0. core      errors, validation, hosts, tokens, the model view, the forward pass, results,
             provenance, statistics, the metric and measurement registries, safe I/O, offloaded weights
1. measures  gain, anisotropy, attribution, sheaf, spectral, L* from traces, paired differences,
             SAE comparison, sweeps, profile
2. paper     the paper's definitions and numbers, cross-model laws
3. views     figures, the definitions page
4. study     resumable multi-model studies (reading and writing their folders)
5. report    the offline HTML report (of profiles or a study folder; extra sections plug in)
6. lab       the heritage lab (trains models, runs studies, writes reports)
7. cli       the command line

``thermo_lens/__init__.py`` is the package's front door and may re-export from any layer.
Plug-ins point the other way: a result's ``.plot()`` finds the figure that views registered for
it (``thermo_lens.result.register_plot``), so results never import views.

Reads the source only: cheap, no model.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import thermo_lens

ROOT = Path(thermo_lens.__file__).parent

LAYERS: dict[str, int] = {
    # 0: core
    "errors": 0, "_lazy": 0, "attached": 0, "validate": 0, "settings": 0, "host": 0, "hosts": 0, "tokens": 0,
    "inputs": 0,
    "prompts": 0, "model": 0, "layout": 0, "result": 0, "provenance": 0, "safe_io": 0, "stats": 0,
    "registry": 0, "hooks": 0, "packed": 0, "passes": 0, "interventions": 0, "zoo": 0, "testing": 0, "measure": 0,
    "offload": 0, "cache_match": 0, "census": 0, "products": 0,
    # 1: measures
    "gain": 1, "anisotropy": 1, "attribution": 1, "sheaf": 1, "spectral": 1, "depth": 1, "paired": 1,
    "sae": 1, "robustness": 1, "profile": 1, "sweeps": 1, "ablation": 1, "write_norm": 1, "measures": 1,
    # 2: paper and laws
    "paper": 2, "laws": 2, "reference": 2,
    # 3: views
    "views": 3, "definitions": 3,
    # 4-7: study, report, lab, cli
    "study": 4, "report": 5, "lab": 6, "cli": 7,
}

# Known upward imports still being removed (issue 20). Must only shrink: a new entry is a defect.
KNOWN_UPWARD: set[tuple[str, str]] = set()
# Known cycles still being removed (issue 20); must only shrink.
KNOWN_CYCLES: list[list[str]] = [
]


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
    parts = module.split(".")
    if len(parts) == 1:
        return None  # the package's front door
    return LAYERS.get(parts[1])


def test_every_module_has_a_layer():
    missing = sorted({m.split(".")[1] for m in _modules() if "." in m and _layer(m) is None})
    assert not missing, f"add these modules to LAYERS (and to the docstring's table): {missing}"


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
    from thermo_lens.errors import ThermoLensError, ThermoLensWarning

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

    import thermo_lens.gain

    for name in ("paper_metric", "PAPER_METRICS", "PaperMetric", "TOKEN_SCOPES", "collect_for_scope"):
        assert not hasattr(thermo_lens.gain, name) or name == "TOKEN_SCOPES" and "TOKEN_SCOPES" not in thermo_lens.gain.__all__
    with pytest.raises(ImportError):
        importlib.import_module("thermo_lens.reference")
    with pytest.raises(ImportError):
        importlib.import_module("thermo_lens.hooks")
