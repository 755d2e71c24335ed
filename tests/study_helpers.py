"""Shared by the study tests: a real profile relabelled per model (so a study runs without loading
a model), the CLI called in-process, and spec files written from dicts."""

import dataclasses
import functools
import json

from thermo_lens import cli, zoo

PROMPTS = ["The capital of France is", "Water freezes at"]


@functools.cache
def template():
    """One real profile of an embedded model, computed once per test session."""
    import thermo_lens

    return thermo_lens.profile(zoo.load("gpt2-tiny-wd"), PROMPTS, progress=False)


def fake_profile(calls: list, side_effect=None):
    """A ``profile_one`` stand-in: records the model id in ``calls`` and returns the template
    relabelled as that model with the study's settings; ``side_effect(model)`` runs first."""
    def fake(model, settings):
        calls.append(model.id)
        if side_effect is not None:
            side_effect(model)
        base = template()
        meta = {**base.meta, "name": model.id, "token_scope": settings["token_scope"],
                "prepend_bos": settings["prepend_bos"], "lab": model.lab, "family": model.family}
        return dataclasses.replace(base, meta=meta).to_json()

    return fake


def run_cli(args, capsys):
    """``thermo-lens ARGS`` in-process: ``(exit code, stdout, stderr)``; never a traceback."""
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def write_spec(path, models, study_extra=""):
    """A TOML study spec at ``path`` with the test prompts and ``models`` (dicts of fields)."""
    text = f'[study]\nname = "t"\nprompts = {json.dumps(PROMPTS)}\n{study_extra}\n'
    for m in models:
        text += "\n[[models]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in m.items())
    path.write_text(text)
    return path


def tree(root):
    """Every path under ``root``, relative, sorted (what a command wrote)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))
