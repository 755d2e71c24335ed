"""MkDocs hooks: the pages' generated parts, from the same sources the package and the benchmarks keep.

A page asks for a generated part with a marker line ``<!-- generated: NAME -->``:

- ``definitions``: the definitions page, ``thermo_lens.definitions.render()`` (the page that ships
  in the package, with its metric table generated from the registry);
- ``perf:<table>``: a performance table generated from the stored benchmark results
  (``benchmarks/results/*.json``), each with the machine and the date it was measured on.

Every generator is a plain function of the stored files, so ``tests/docs/test_docs.py`` checks the
same output the site shows. Run ``python docs/hooks.py NAME`` to print one part.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARKER = re.compile(r"^<!-- generated: ([\w:-]+) -->$", flags=re.M)


# ----------------------------------------------------------------------------- stored results
def _date_of(path: Path) -> str:
    m = re.search(r"(\d{4}-\d{2}-\d{2})", path.name)
    if not m:
        raise ValueError(f"{path.name}: a results file's name carries its date (YYYY-MM-DD)")
    return m.group(1)


def cpu_results(results: Path = RESULTS) -> tuple[Path, dict[str, Any]]:
    """The newest CPU results file (``cpu-*.json``) and its content."""
    files = sorted(results.glob("cpu-*.json"), key=_date_of)
    if not files:
        raise FileNotFoundError(f"no cpu-*.json in {results}")
    return files[-1], json.loads(files[-1].read_text(encoding="utf-8"))


def gpu_results(results: Path = RESULTS) -> tuple[Path, str, dict[str, Any]]:
    """The newest GPU results file (``gpu-*.json``), the name of its current run (the file's first;
    earlier runs stay in the file for the record) and that run."""
    files = sorted(results.glob("gpu-*.json"), key=_date_of)
    if not files:
        raise FileNotFoundError(f"no gpu-*.json in {results}")
    data = json.loads(files[-1].read_text(encoding="utf-8"))
    name = next(iter(data))
    return files[-1], name, data[name]


# ----------------------------------------------------------------------------- formatting
def _x(v: float) -> str:
    return f"{v:.2f}x"


def _spread(d: dict[str, float]) -> str:
    return f"{_x(d['median'])} [{d['min']:.2f}..{d['max']:.2f}] (min/min {_x(d['min_over_min'])})"


def _mib(d: dict[str, float]) -> str:
    return f"{d['median']:.1f} MiB [{d['min']:.1f}-{d['max']:.1f}]"


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _caption(what: dict[str, Any], machine: str, path: Path, dates: set[str]) -> str:
    when = ", ".join(sorted(dates))
    return (f"*Machine: {machine}. Measured: {when}. `{what['script']}`: {what['setup']}. "
            f"Source: `benchmarks/results/{path.name}`.*")


def _cpu_table(key: str, header: list[str], row: Callable[[dict[str, Any]], list[str]]) -> str:
    path, data = cpu_results()
    what = data[key]
    rows = [row(r) + [r["date"]] for r in what["rows"]]
    return _table(header + ["measured"], rows) + "\n\n" + _caption(what, data["machine"], path, {r["date"] for r in what["rows"]})


def perf_cpu_profile() -> str:
    return _cpu_table(
        "profile_vs_bare",
        ["model", "bare, same batches", "warm, no attribution", "warm (default)", "cold (default)", "spectral alone, cold"],
        lambda r: [r["model"], f"{r['bare_s']:.2f} s", _spread(r["warm_no_attribution"]), f"**{_spread(r['warm'])}**",
                   f"**{_spread(r['cold'])}**", f"{r['spectral_cold_s']:.2f} s ({_x(r['spectral_cold_ratio'])})"])


def perf_cpu_last_block() -> str:
    return _cpu_table(
        "profile_vs_last_block",
        ["model", "warm, no attribution", "warm (default)", "cold (default)", "thermo-lens' hooks, inside one run",
         "attribution's `s W_O^T` matmul alone"],
        lambda r: [r["model"], _x(r["warm_no_attribution"]), _x(r["warm"]), _x(r["cold"]),
                   f"{r['hooks_pct']:.1f}% (attribution {r['hooks_attribution_pct']:.1f}%, the rest {r['hooks_rest_pct']:.1f}%)",
                   f"{r['attribution_matmul_pct']:.1f}%"])


def perf_cpu_spectral() -> str:
    return _cpu_table(
        "spectral",
        ["geometry", "floor", "signature", "per-head, OV, QK", "whole-layer (Lanczos steps)", "peak RSS growth"],
        lambda r: [r["geometry"], f"{r['floor_s']:.2f} s", f"{r['signature_s']:.2f} s, **{r['ratio']:.1f}x**",
                   _x(r["per_head_ratio"]),
                   f"{r['layer_ratio']:.1f}x" + (f" ({r['lanczos_steps']})" if r["lanczos_steps"] is not None else ""),
                   f"{r['peak_rss_MiB']} MiB"])


def perf_cpu_streaming() -> str:
    return _cpu_table(
        "streaming",
        ["prompts", "peak RSS growth, median [range]", "the pass keeps for the results", "the returned profile holds",
         "beyond both, median [range]"],
        lambda r: [f"{r['prompts']:,}", _mib(r["peak_MiB"]), f"{r['pass_keeps_MiB']:g} MiB", f"{r['profile_holds_MiB']:g} MiB",
                   _mib(r["beyond_MiB"])])


def perf_cpu_sweeps() -> str:
    def ratio(r: dict[str, Any]) -> str:
        lo, hi = r["ratio_min"], r["ratio_max"]
        return f"{lo:.1f}x" if lo == hi else f"{lo:.1f}-{hi:.1f}x"

    return _cpu_table(
        "sweeps", ["sweep", "vocabulary", "faster by", "work bound"],
        lambda r: [r["sweep"], r["vocabulary"], ratio(r), "-" if r["work_bound"] is None else f"{r['work_bound']:.2f}x"])


def _gpu_caption(path: Path, run_name: str, run: dict[str, Any]) -> str:
    v = run["versions"]
    c = run["ceilings"]
    return (f"*Machine: {run['device']}. Measured: {_date_of(path)} (run `{run_name}` of the file). `python benchmarks/gpu.py`: bf16 "
            f"weights generated on the device, wall seconds around a synchronised device, medians of 3; torch "
            f"{v['torch']}, transformers {v['transformers']}, TransformerLens {v['transformer_lens']}; ceilings "
            f"measured in the same run: copy {c['copy_GBps'] / 1000:.1f} TB/s, matmul {c['bf16_TFLOPs']:.0f} TFLOP/s "
            f"bf16 and {c['fp32_TFLOPs']:.0f} TFLOP/s float32. Source: `benchmarks/results/{path.name}`.*")


def perf_gpu_spectral() -> str:
    path, name, run = gpu_results()
    rows = []
    for spectrum, r in run["spectral_7b"].items():
        lz = r["layers"]["lanczos"]
        rows.append([f"LLaMA-7B geometry, 32 layers, {spectrum} weights", f"**{r['ours_s']:.2f} s**", f"{r['per_head_s']:.2f} s",
                     f"{lz['s']:.2f} s, {r['lanczos_steps_per_matrix']:.1f} steps", f"{r['head_max_rel_err']:.1e}",
                     f"{r['mem_MiB']:.0f} MiB"])
    header = ["weights", "signature", "per-head, OV, QK", "whole-layer (Lanczos)", "max rel. err (heads)", "device memory"]
    return _table(header, rows) + "\n\n" + _gpu_caption(path, name, run)


def perf_gpu_profile() -> str:
    path, name, run = gpu_results()
    parts = []
    for geometry, g in run["profile"].items():
        rows = [[method, f"{m['s']:.2f} s", _x(m["vs_same"])] for method, m in g["methods"].items()]
        parts.append(f"**{geometry}**, bf16, {g['prompts']} prompts ({g['tokens']:,} tokens), batches of {g['batch_size']}; "
                     f"peak device memory beyond the weights {g['mem_bare_MiB']:.0f} MiB bare, "
                     f"{g['mem_profile_MiB']:.0f} MiB profiled.\n\n" + _table(["method", "wall s", "vs bare, same batches"], rows))
    return "\n\n".join(parts) + "\n\n" + _gpu_caption(path, name, run)


def definitions() -> str:
    """The definitions page, as the package ships it (its metric table regenerated from the registry)."""
    from thermo_lens import definitions as d

    return d.render()


GENERATORS: dict[str, Callable[[], str]] = {
    "definitions": definitions,
    "perf:cpu-profile": perf_cpu_profile,
    "perf:cpu-last-block": perf_cpu_last_block,
    "perf:cpu-spectral": perf_cpu_spectral,
    "perf:cpu-streaming": perf_cpu_streaming,
    "perf:cpu-sweeps": perf_cpu_sweeps,
    "perf:gpu-spectral": perf_gpu_spectral,
    "perf:gpu-profile": perf_gpu_profile,
}


def expand(markdown: str) -> str:
    """``markdown`` with every ``<!-- generated: NAME -->`` line replaced by its generated part."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in GENERATORS:
            raise KeyError(f"unknown generated part {name!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:  # the MkDocs hook
    return expand(markdown)


if __name__ == "__main__":
    for arg in sys.argv[1:] or sorted(GENERATORS):
        print(GENERATORS[arg]() + "\n")
