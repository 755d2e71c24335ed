"""Errors echo what was given at a readable length: a 1 MB input is cut, never printed in full."""

from __future__ import annotations

import pytest

import thermo_lens as tl
from thermo_lens import zoo
from thermo_lens.core.errors import MAX_MESSAGE, ThermoLensError, ThermoLensInputError, readable

BIG = "x" * 10**6


def test_readable_cuts_long_runs_and_long_messages_and_keeps_short_ones():
    short = "unknown token_scope 'abc'; choose one of last, all"
    assert readable(short) == short
    got = readable(f"unknown measure {BIG!r}; choose one of a, b")
    assert len(got) < 400 and got.startswith("unknown measure 'xxx") and got.endswith("choose one of a, b")
    assert "characters cut)" in got  # says how much of the run it cut
    many = " ".join(["word"] * 10**5)  # long, but no long run: the middle of the message goes
    assert len(readable(many)) < MAX_MESSAGE + 100 and "characters cut" in readable(many)
    assert len(str(ThermoLensInputError(f"bad {BIG}"))) < 400
    assert str(ThermoLensError("a", "b")) == "('a', 'b')"  # other arguments as Python gives them


@pytest.mark.parametrize("case", ["hook", "sweep_hook", "sweep_measure", "spectral", "run", "scope"])
def test_errors_on_a_huge_input_stay_short(bridge, case):
    m = bridge("gpt2")
    calls = {
        "hook": lambda: tl.residual_gain(m, "hi there", fwd_hooks=[(BIG, lambda x, hook: x)]),
        "sweep_hook": lambda: tl.ablation_sweep(m, ["a b", "c d"], BIG),
        "sweep_measure": lambda: tl.ablation_sweep(m, ["a b", "c d"], "attn.hook_z", measure=BIG),
        "spectral": lambda: tl.spectral_signature(m, layer_norm_method=BIG),
        "run": lambda: tl.run(m, "hi there", [BIG]),
        "scope": lambda: tl.residual_gain(m, "hi there", token_scope=BIG),
    }
    with pytest.raises(ThermoLensError) as e:
        calls[case]()
    assert len(str(e.value)) < 2000 and "cut" in str(e.value)


def test_an_unknown_zoo_name_is_cut_too():
    with pytest.raises(KeyError) as e:
        zoo.path(BIG)
    assert len(str(e.value)) < 2000 and "gpt2-tiny-wd" in str(e.value)
