"""The ``thermo-lens`` command line: a thin layer over the library.

Commands::

    thermo-lens profile [MODEL ...]     profile models (the embedded defaults when none given)
    thermo-lens study SPEC --out DIR    run or resume a many-model study from a spec file
    thermo-lens report DIR              write the report of a study / profile directory
    thermo-lens zoo                     list the embedded default models

Exit codes: 0 success; 1 the run finished but some models failed (see the manifest);
2 bad usage or bad input (the message says what to fix). Errors are printed without a
traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

EXIT_OK, EXIT_FAILED_MODELS, EXIT_USAGE = 0, 1, 2
DEFAULT_OUT = "thermo-lens-report"


class CLIError(Exception):
    """A user-facing error: printed as ``thermo-lens: error: ...`` with exit code 2."""


def _bos(value: str) -> bool | str:
    v = value.lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    if v == "tokenizer":
        return "tokenizer"
    raise argparse.ArgumentTypeError("must be true, false or tokenizer")


def _add_measure_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", default="paper25",
                   help="built-in prompt set (see thermo_lens.prompts.names()) or a text file with one prompt per line (default: paper25)")
    p.add_argument("--prepend-bos", type=_bos, default=True, metavar="{true,false,tokenizer}",
                   help="prepend BOS (TransformerLens style), none, or the HF tokenizer's own special tokens as the paper did (default: true)")
    p.add_argument("--token-scope", default="all_but_first", choices=["last", "all_but_first", "all", "frobenius"],
                   help="tokens entering the residual gain (default: all_but_first)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per forward pass (default: 8)")
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
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], help="model dtype (default: the checkpoint's)")
    p.add_argument("--device", help="device, e.g. cpu or cuda (default: the bridge's choice)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    _add_measure_args(p)

    p = sub.add_parser("study", help="run or resume a many-model study from a spec file",
                       description="Run a study spec (TOML or YAML). Each model's profile is written to DIR as soon as it "
                                   "is done; rerunning resumes; failures are recorded in DIR/manifest.json.")
    p.add_argument("spec", help="study spec file (.toml, .yaml)")
    p.add_argument("--out", required=True, help="study directory")
    p.add_argument("--executor", choices=["local", "ray"], default="local", help="where models run (default: local)")
    p.add_argument("--ray-address", default=None, help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")

    p = sub.add_parser("report", help="write the report of a study/profile directory",
                       description="Write DIR/report.html (self-contained, offline) and DIR/summary.csv from the profiles in DIR.")
    p.add_argument("dir", help="study or profile directory (with manifest.json)")
    p.add_argument("--output", default=None, help="report file (default: DIR/report.html)")

    sub.add_parser("zoo", help="list the embedded default models", description="List the embedded models with their recipes and final losses.")
    return parser


def _prompts_arg(value: str) -> object:
    path = Path(value)
    if path.is_file():
        lines = [l.strip() for l in path.read_text().splitlines() if l.strip()]
        if not lines:
            raise CLIError(f"{value}: the prompt file has no prompts")
        return lines
    from thermo_lens import prompts

    try:
        prompts.get(value)
    except KeyError as e:
        raise CLIError(f"--prompts: {e.args[0] if e.args else e}") from None
    return value


def _finish(outcome, out_dir: str, no_report: bool) -> int:
    from thermo_lens import study

    manifest = study.read_manifest(out_dir)
    for mid, entry in manifest.get("models", {}).items():
        status = entry.get("status")
        line = f"  {mid:<28} {status}"
        if status == "failed":
            line += f": {entry.get('error', '').splitlines()[0] if entry.get('error') else ''}"
        print(line)
    _write_outputs(out_dir, no_report)
    if outcome.failed:
        print(f"thermo-lens: {len(outcome.failed)} model(s) failed; see {Path(out_dir) / study.MANIFEST}", file=sys.stderr)
        return EXIT_FAILED_MODELS
    return EXIT_OK


def _write_outputs(out_dir: str, no_report: bool) -> None:
    from thermo_lens import study

    profiles = study.load_profiles(out_dir)
    if profiles:
        from thermo_lens.profile import profiles_frame

        frame = profiles_frame(profiles.values())
        frame.to_csv(Path(out_dir) / "summary.csv", index=False)
        print(f"wrote {Path(out_dir) / 'summary.csv'}")
    if not no_report:
        try:
            from thermo_lens.report import write_report
        except ImportError:
            return
        path = write_report(out_dir)
        print(f"wrote {path}")


def cmd_profile(args: argparse.Namespace) -> int:
    from thermo_lens import study, zoo

    models = list(args.models) or list(zoo.DEFAULT)
    specs = []
    for m in models:
        if m in zoo.names() and not Path(m).exists():
            specs.append(m)
            continue
        specs.append(study.ModelSpec(id=study._slug(m), name=m, dtype=args.dtype, device=args.device))
    if args.dtype or args.device:
        specs = [s if isinstance(s, study.ModelSpec) else
                 study.ModelSpec(id=s, zoo=s, lab="thermo-lens zoo", dtype=args.dtype, device=args.device)
                 for s in specs]
    spec = study.StudySpec.from_models(
        specs, name="profile", prompts=_prompts_arg(args.prompts), prepend_bos=args.prepend_bos,
        token_scope=args.token_scope, batch_size=args.batch_size, truncate=args.truncate,
    )
    print(f"thermo-lens: profiling {len(spec.models)} model(s) into {args.out}/")
    outcome = study.run_study(spec, args.out, progress=None)
    return _finish(outcome, args.out, args.no_report)


def cmd_study(args: argparse.Namespace) -> int:
    from thermo_lens import study

    spec = study.load_spec(args.spec)
    print(f"thermo-lens: study {spec.name!r}: {len(spec.models)} model(s) into {args.out}/ ({args.executor})")
    outcome = study.run_study(spec, args.out, executor=args.executor, ray_address=args.ray_address)
    if outcome.skipped:
        print(f"  resumed: {len(outcome.skipped)} model(s) already done")
    return _finish(outcome, args.out, args.no_report)


def cmd_report(args: argparse.Namespace) -> int:
    from thermo_lens import study

    d = Path(args.dir)
    if not (d / study.MANIFEST).is_file():
        raise CLIError(f"{d}: no {study.MANIFEST} here; run `thermo-lens profile --out {d}` or `thermo-lens study SPEC --out {d}` first")
    profiles = study.load_profiles(d)
    if not profiles:
        raise CLIError(f"{d}: no finished model profiles yet (see {d / study.MANIFEST})")
    from thermo_lens.profile import profiles_frame

    profiles_frame(profiles.values()).to_csv(d / "summary.csv", index=False)
    print(f"wrote {d / 'summary.csv'}")
    try:
        from thermo_lens.report import write_report
    except ImportError:
        return EXIT_OK
    print(f"wrote {write_report(d, output=args.output)}")
    return EXIT_OK


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
        print(line)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    handlers = {"profile": cmd_profile, "study": cmd_study, "report": cmd_report, "zoo": cmd_zoo}
    from thermo_lens.model import ThermoLensInputError
    from thermo_lens.study import StudyLockedError, StudySpecError

    try:
        return handlers[args.command](args)
    except (CLIError, StudySpecError, StudyLockedError, ThermoLensInputError, FileNotFoundError) as e:
        if args.debug:
            raise
        print(f"thermo-lens: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("thermo-lens: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
