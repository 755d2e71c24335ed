"""The ``thermo-lens`` command line: a thin layer over the library.

Commands::

    thermo-lens profile [MODEL ...]     profile models (the embedded defaults when none given)
    thermo-lens study SPEC --out DIR    run or resume a many-model study from a spec file
    thermo-lens report DIR              write the report of a study / profile directory
    thermo-lens zoo                     list the embedded default models
    thermo-lens lab SPEC --out DIR      run or resume a heritage lab (controlled training experiments)

Exit codes: 0 success; 1 the run finished but some models failed (see the manifest);
2 bad usage or bad input (the message says what to fix), including files that cannot be read or
written. Errors are printed without a traceback unless ``--debug`` is given. Every option is
checked (:mod:`thermo_lens.core.validate`) before any model is loaded.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Sequence, get_args
from thermo_lens.core.errors import FolderLockedError, ThermoLensInputError, ThermoLensSchemaError
from thermo_lens.core.tokens import BOS_MODES, TOKEN_SCOPES, BosModeName, bos_modes_text

EXIT_OK, EXIT_FAILED_MODELS, EXIT_USAGE = 0, 1, 2
DEFAULT_OUT = "thermo-lens-report"
SUMMARY, REPORT = "summary.csv", "report.html"


class CLIError(ThermoLensInputError):
    """A user-facing error: printed as ``thermo-lens: error: ...`` with exit code 2."""


def _bos(value: str) -> bool | str:
    v = value.lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    if v in get_args(BosModeName):
        return v
    raise argparse.ArgumentTypeError("must be " + bos_modes_text(quote="", bools=("true", "false")))


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1 or n > 1 << 16:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 65536, got {value!r}")
    return n


def _add_measure_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", default="paper25",
                   help="built-in prompt set (see thermo_lens.core.prompts.names()) or a text file with one prompt per line (default: paper25)")
    p.add_argument("--prepend-bos", type=_bos, default="host", metavar="{" + ",".join(str(m).lower() for m in BOS_MODES) + "}",
                   help="host: tokens exactly as model.to_tokens gives them (default); true: prepend BOS; false: none; "
                        "tokenizer: the HF tokenizer's own special tokens as the paper did")
    p.add_argument("--token-scope", default="all_but_first", choices=list(TOKEN_SCOPES),
                   help="tokens entering the residual gain (default: all_but_first)")
    p.add_argument("--batch-size", type=_positive_int, default=8, help="prompts per forward pass (default: 8)")
    p.add_argument("--truncate", action="store_true", help="cut prompts longer than the context instead of failing")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thermo-lens",
        description="Residual gain, head spectral signatures and sheaf Laplacians of TransformerLens models.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("profile", help="profile models (embedded defaults when none given) and write a report",
                       description="Profile models and write per-model JSON, a summary CSV and an HTML report. "
                                   "MODEL is a hub name, a local checkpoint directory or an embedded model name "
                                   "(see `thermo-lens zoo`); with no MODEL, the embedded default models are used.")
    p.add_argument("models", nargs="*", metavar="MODEL")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default: {DEFAULT_OUT})")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16", "float64"], help="model dtype (default: the checkpoint's)")
    p.add_argument("--device", help="device, e.g. cpu or cuda (default: the bridge's choice)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    _add_measure_args(p)

    p = sub.add_parser("study", help="run or resume a many-model study from a spec file",
                       description="Run a study spec (TOML or YAML). Each model's profile is written to DIR as soon as it "
                                   "is done; rerunning resumes; failures are recorded in DIR/manifest.json.")
    p.add_argument("spec", help="study spec file (.toml, .yaml)")
    _add_run_options(p, "study directory", "where models run")

    p = sub.add_parser("report", help="write the report of a study/profile directory",
                       description="Write DIR/report.html (self-contained, offline) and DIR/summary.csv from the profiles in DIR.")
    p.add_argument("dir", help="study or profile directory (with manifest.json)")
    p.add_argument("--output", default=None, help="report file, in an existing folder (default: DIR/report.html)")

    sub.add_parser("zoo", help="list the embedded default models", description="List the embedded models with their recipes and final losses.")

    p = sub.add_parser("lab", help="run or resume a heritage lab: train toy models that differ in one knob",
                       description="Train every arm x seed of a lab spec (TOML) with log-spaced checkpoints, profile every "
                                   "checkpoint, and write DIR/runs.csv, DIR/effects.csv, DIR/figures/ and DIR/report.html. "
                                   "Rerunning resumes; failures are recorded in DIR/train/ and DIR/profiles/manifest.json.")
    p.add_argument("spec", help="lab spec file (.toml)")
    _add_run_options(p, "lab directory", "where runs train")
    p.add_argument("--update", action="store_true",
                   help="accept a changed spec for an existing lab directory (arms whose recipe changed are trained "
                        "anew; finished runs of the others are kept); without it a different spec is refused")
    return parser


def _add_run_options(p: argparse.ArgumentParser, out_help: str, executor_help: str) -> None:
    """The options of the resumable commands (``study``, ``lab``): output folder, executor, report."""
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument("--executor", choices=["local", "ray"], default="local", help=f"{executor_help} (default: local)")
    p.add_argument("--ray-address", default=None, help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")


def _prompts_arg(value: str) -> str | list[str]:
    from thermo_lens.core import prompts

    if value in prompts.names() and not Path(value).is_file():
        return value
    path = Path(value)
    if os.path.lexists(path):
        from thermo_lens.core.safe_io import safe_read_text

        text = safe_read_text(path, 64 << 20, what="prompt file")
        lines = [l.strip() for l in text.splitlines() if l.strip()]
        if not lines:
            raise CLIError(f"{value}: the prompt file has no prompts")
        return lines
    if path.suffix or os.sep in value or "/" in value:  # meant as a file
        raise CLIError(f"--prompts {_printable(value, 200)}: no such file (give a text file with one prompt per line, or a "
                       f"built-in prompt set: {', '.join(prompts.names())})")
    try:
        prompts.get(value)
    except KeyError as e:
        raise CLIError(f"--prompts: {_printable(e.args[0] if e.args else e)}; and no file named "
                       f"{_printable(repr(value), 200)} exists") from None
    return value


def _say(message: str, *, err: bool = False) -> None:
    """Print a message; control characters in it (from a path, a spec key, a model name, a
    manifest edited by hand) are escaped, so nothing the user's input holds drives the terminal."""
    from thermo_lens.core.safe_io import printable

    print(printable(message, keep_newlines=True), file=sys.stderr if err else sys.stdout)


def _printable(text: object, limit: int = 300) -> str:
    """One line of at most ``limit`` characters without control characters (a manifest may have
    been edited by hand; nothing it holds should drive the terminal)."""
    line = str(text).splitlines()[0] if str(text) else ""
    return "".join(c if c.isprintable() else "?" for c in line[:limit])


def _print_status(contents, recomputed: Sequence[str] = (), *, runs: bool = False) -> None:
    """One line per current model (status, error, why a result is not used, why it was recomputed
    now), then the stale ids and the count of results left out. ``runs``: the folder collects
    separate ``profile`` runs, so results not in this run are "from earlier runs", not stale."""
    from thermo_lens.experiments import study

    entries = contents.manifest.get("models", {})
    for mid in contents.manifest.get("study", {}).get("models") or list(entries):
        entry = entries.get(mid) if isinstance(entries.get(mid), dict) else {}
        status = entry.get("status")
        line = f"  {_printable(mid, 100):<28} {_printable(status, 30)}"
        if status == "failed" and entry.get("error"):
            line += f": {_printable(entry['error'])}"
        elif mid in contents.problems:
            line += f" but not used: {_printable(contents.problems[mid])}"
        elif mid in recomputed and entry.get("note"):
            line += f"; {_printable(entry['note'])}"
        _say(line)
    if contents.stale:
        shown = ", ".join(_printable(s, 100) for s in contents.stale[:10]) + (" ..." if len(contents.stale) > 10 else "")
        if runs:
            _say(f"  also in this folder from earlier profile runs (kept on disk; this run's summary and report "
                 f"cover only this run's models): {shown}")
        else:
            _say(f"  stale (from an earlier spec; kept on disk, left out of the summary and report): {shown}")
    if contents.problems:
        _say(f"thermo-lens: {len(contents.problems)} result(s) left out; rerun the same command to recompute them "
             f"(see {study.MANIFEST})", err=True)


def _run(spec, args: argparse.Namespace, executor: str = "local", ray_address: str | None = None, *,
         runs: bool = False) -> int:
    """Run or resume ``spec`` into ``args.out``, print what became of each model, write the
    summary and (unless ``--no-report``) the report; the exit code."""
    from thermo_lens.experiments import study

    outcome = study.run_study(spec, args.out, executor=executor, ray_address=ray_address, progress=None)
    if outcome.skipped:
        _say(f"  resumed: {len(outcome.skipped)} model(s) already done")
    contents = study.read_study(args.out)
    _print_status(contents, recomputed=outcome.done, runs=runs)
    _write_outputs(args.out, contents, args.no_report)
    if outcome.failed:
        _say(f"thermo-lens: {len(outcome.failed)} model(s) failed; see {Path(args.out) / study.MANIFEST}", err=True)
        return EXIT_FAILED_MODELS
    return EXIT_OK


def _write_summary(out_dir: str | Path, profiles: dict) -> None:
    from thermo_lens.measures.profile import profiles_frame
    from thermo_lens.core.safe_io import atomic_write_text, neutralise_formulas

    frame = neutralise_formulas(profiles_frame(profiles.values()))
    atomic_write_text(Path(out_dir) / SUMMARY, frame.to_csv(index=False))
    _say(f"wrote {Path(out_dir) / SUMMARY}")


def _write_outputs(out_dir: str, contents, no_report: bool, output: str | None = None) -> None:
    """summary.csv and the report, holding the folder's lock (no study run writes meanwhile), after
    removing temporary files a killed earlier write left behind."""
    from thermo_lens.core.safe_io import FolderLock, remove_stale_temps

    with FolderLock(out_dir, what="thermo-lens run"):
        remove_stale_temps(out_dir)
        _write_outputs_locked(out_dir, contents, no_report, output)


def _write_outputs_locked(out_dir: str, contents, no_report: bool, output: str | None) -> None:
    import warnings

    if not contents.profiles:
        _remove_outputs(out_dir)
        return
    _write_summary(out_dir, contents.profiles)
    if no_report:
        return
    try:
        from thermo_lens.report import write_report
    except ImportError:
        return
    from thermo_lens.experiments.lab.report_section import lab_dir_of, lab_section

    lab_dir = lab_dir_of(out_dir)  # a lab's train/ folder: its report has the lab's section too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # left-out results were listed above
        path = write_report(out_dir, output=output, sections=[lab_section(lab_dir)] if lab_dir else ())
    _say(f"wrote {path}")


def _remove_outputs(out_dir: str) -> None:
    """No model of the current spec has a result: an earlier summary and report describe other
    models, so they go (the folder is thermo-lens'; the results themselves stay)."""
    removed = []
    for name in (SUMMARY, REPORT):
        path = Path(out_dir) / name
        if os.path.lexists(path) and not path.is_dir():
            os.unlink(path)  # a planted link is removed, never followed
            removed.append(name)
    gone = f"; the earlier {' and '.join(removed)} described other models and were removed" if removed else ""
    _say(f"thermo-lens: no model of this spec has a result: no {SUMMARY} or {REPORT} written{gone}", err=True)


def cmd_profile(args: argparse.Namespace) -> int:
    from thermo_lens import zoo
    from thermo_lens.experiments import study

    study.output_path(args.out)
    models = list(args.models) or list(zoo.DEFAULT)
    from thermo_lens.experiments.study.sources import check_model_name

    for m in models:  # before anything loads: a typo or an offline hub fails in a second, not after retries
        check_model_name(m, "MODEL")
    prompts = _prompts_arg(args.prompts)
    options = {k: v for k, v in (("dtype", args.dtype), ("device", args.device)) if v is not None}
    specs: list = []
    seen: set[str] = set()
    for m in models:
        model = study.model_from_name(m, seen, **options)
        seen.add(model.id.lower())
        specs.append(model)
    spec = study.StudySpec.from_models(
        specs, name="profile", prompts=prompts, prepend_bos=args.prepend_bos,
        token_scope=args.token_scope, batch_size=args.batch_size, truncate=args.truncate,
    )
    _say(f"thermo-lens: profiling {len(spec.models)} model(s) into {args.out}/")
    return _run(spec, args, runs=True)


def cmd_study(args: argparse.Namespace) -> int:
    from thermo_lens.experiments import study

    study.output_path(args.out)
    spec = study.load_spec(args.spec)
    _say(f"thermo-lens: study {spec.name!r}: {len(spec.models)} model(s) into {args.out}/ ({args.executor})")
    return _run(spec, args, args.executor, args.ray_address)


def cmd_report(args: argparse.Namespace) -> int:
    from thermo_lens.experiments import study

    d = study.output_path(args.dir, "study folder")
    if not d.is_dir():
        raise CLIError(f"{d} is not a folder; give the study or profile folder")
    if not os.path.lexists(d / study.MANIFEST):
        raise CLIError(f"{d}: no {study.MANIFEST} here; run `thermo-lens profile --out {d}` or `thermo-lens study SPEC --out {d}` first")
    if args.output is not None:
        _check_output(study.output_path(args.output, "--output file"))
    contents = study.read_study(d)
    running = _still_running(d, contents)
    if running:
        raise CLIError(running)
    if not contents.profiles:
        _print_status(contents)
        raise CLIError(f"{d}: no finished model profiles to report (see {d / study.MANIFEST})")
    if contents.problems or contents.stale:
        _print_status(contents, runs=contents.manifest.get("study", {}).get("name") == "profile")
    try:
        _write_outputs(str(d), contents, no_report=False, output=args.output)
    except FolderLockedError:  # it started meanwhile
        raise CLIError(_still_running(d, study.read_study(d)) or f"{d} is in use by another thermo-lens run") from None
    return EXIT_OK


def _still_running(d: Path, contents) -> str | None:
    """The message for ``report`` on a folder a study run holds (its lock is taken): which study,
    how many of its models are unfinished, which; ``None`` when no run holds it."""
    from thermo_lens.core.safe_io import FolderLock

    try:
        with FolderLock(d, what="thermo-lens run"):
            return None
    except FolderLockedError as e:
        held = str(e)
    study_rec = contents.manifest.get("study", {}) if isinstance(contents.manifest.get("study"), dict) else {}
    entries = contents.manifest.get("models", {})
    current = study_rec.get("models") or list(entries)
    unfinished = [m for m in current if not (isinstance(entries.get(m), dict) and entries[m].get("status") in
                                             ("done", "failed"))]
    names = ", ".join(_printable(m, 60) for m in unfinished[:8]) + (" ..." if len(unfinished) > 8 else "")
    pid = re.search(r"\(pid ([^)]*)\)", held)
    return (f"the study {_printable(study_rec.get('name', '?'), 80)!r} in {_printable(d, 200)} is still running"
            f"{f' (pid {pid.group(1)})' if pid else ''}: {len(unfinished)} of {len(current)} model(s) unfinished"
            f"{f' ({names})' if names else ''}; run `thermo-lens report {_printable(d, 200)}` again when it ends")


def _check_output(out: Path) -> None:
    """``report --output``: a file in an existing folder (no folders are created)."""
    if out.is_dir():
        return
    parent = out.parent
    if not parent.exists():
        raise CLIError(f"--output {out}: folder {parent} does not exist; create it first")
    if not parent.is_dir():
        raise CLIError(f"--output {out}: {parent} is a file, not a folder")


def cmd_zoo(args: argparse.Namespace) -> int:
    from thermo_lens import zoo

    for name in zoo.names():
        info = zoo.info(name)
        arch = info.get("architecture", {}).get("model_class", "?")
        res, train = info.get("results", {}), info.get("training", {})
        loss = res.get("final_val_loss")
        loss_txt = f"{loss:.3f}" if isinstance(loss, (int, float)) else "?"
        line = (f"{name:<16} {arch:<20} {info.get('n_params', 0) / 1e3:.0f}k params, "
                f"weight_decay {train.get('weight_decay')}, val loss {loss_txt}")
        if info.get("matched_with"):
            line += f"  (matched with {info['matched_with']}: differs only in {info['differs_in']})"
        _say(line)
    return EXIT_OK


def cmd_lab(args: argparse.Namespace) -> int:
    from thermo_lens.experiments import study
    from thermo_lens.experiments.lab import load_lab_spec, run_lab

    study.output_path(args.out, "lab folder")
    spec = load_lab_spec(args.spec)
    arms = spec.arms()
    budgets = f" x {len(spec.budgets)} budgets ({', '.join(map(str, spec.budgets))} steps)" if spec.budgets else ""
    _say(f"thermo-lens: lab {spec.name!r}: {len(arms)} arms x {len(spec.seeds)} seeds{budgets} into {args.out}/ "
         f"({args.executor})")
    outcome = run_lab(spec, args.out, executor=args.executor, ray_address=args.ray_address, report=not args.no_report,
                      progress=None, update=args.update)
    if outcome.skipped:
        _say(f"  resumed: {len(outcome.skipped)} run(s)/checkpoint(s) already done")
    for name, err in outcome.failed.items():
        _say(f"  {name:<40} failed: {err.splitlines()[0] if err else ''}")
    _say(f"wrote {Path(args.out) / 'runs.csv'} and {Path(args.out) / 'effects.csv'}")
    return EXIT_FAILED_MODELS if outcome.failed else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    handlers = {"profile": cmd_profile, "study": cmd_study, "report": cmd_report, "zoo": cmd_zoo, "lab": cmd_lab}
    report_error: type[Exception] = CLIError
    try:
        from thermo_lens.report import ReportError as report_error
    except ImportError:  # pragma: no cover - without plotly
        pass

    from thermo_lens.experiments.lab.recipe import LabSpecError

    try:
        return handlers[args.command](args)
    except (CLIError, ThermoLensInputError, ThermoLensSchemaError, FolderLockedError, report_error, LabSpecError,
            OSError) as e:
        if args.debug:
            raise
        msg = _os_error(e) if isinstance(e, OSError) else str(e)
        _say(f"thermo-lens: error: {msg[:2000]}", err=True)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("thermo-lens: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a bug, not a user error: say so, briefly
        if args.debug:
            raise
        _say(f"thermo-lens: internal error: {type(e).__name__}: {str(e)[:1000]}\n"
             "  rerun with --debug for the traceback and report it", err=True)
        return EXIT_FAILED_MODELS


def _os_error(e: OSError) -> str:
    from thermo_lens.core.safe_io import os_error_reason

    where = f" {e.filename}" if e.filename else ""
    return f"cannot access{where}: {os_error_reason(e)}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
