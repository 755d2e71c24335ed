"""Heritage lab v2: budgets, matched validation loss, the declared primary family, intervals that
invert their test, regime flips decided by intervals, one spec hash on every result."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from thermo_lens.lab import effects
from thermo_lens.lab.recipe import LabSpecError
from thermo_lens.lab.spec import parse_lab_spec
from thermo_lens.stats import holm


def _brute_p(d, shift=0.0):
    x = np.asarray(d, float) - shift
    obs = abs(x.mean())
    hits = [abs(np.mean(np.array(s) * x)) >= obs - 1e-12 for s in itertools.product([1, -1], repeat=len(x))]
    return np.mean(hits)


@pytest.mark.parametrize("seed", range(4))
def test_sign_flip_p_is_exact_and_matches_scipy(seed):
    d = np.random.default_rng(seed).normal(0.3, 1.0, size=8)
    p = effects.sign_flip_pvalue(d)
    assert p == pytest.approx(_brute_p(d))
    ref = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf,
                                 alternative="two-sided").pvalue
    assert p == pytest.approx(ref)


def test_interval_inverts_the_test():
    rng = np.random.default_rng(7)
    for _ in range(5):
        d = rng.normal(rng.uniform(-1, 1), 1.0, size=int(rng.integers(7, 13)))
        lo, hi = effects.sign_flip_interval(d)
        assert lo < d.mean() < hi
        # inside: the test does not reject; just outside: it does
        assert effects.sign_flip_pvalue(d, lo + 1e-6) > 0.05 and effects.sign_flip_pvalue(d, hi - 1e-6) > 0.05
        assert effects.sign_flip_pvalue(d, lo - 1e-3) <= 0.05 and effects.sign_flip_pvalue(d, hi + 1e-3) <= 0.05
        # so 0 is outside exactly when p < 0.05
        assert (lo > 0 or hi < 0) == (effects.sign_flip_pvalue(d) <= 0.05)


def test_interval_is_unbounded_below_six_seeds():
    assert effects.sign_flip_interval([0.1, 0.2, 0.3, 0.4, 0.5]) == (float("-inf"), float("inf"))


def test_regime_flip_is_decided_by_intervals_not_point_estimates():
    assert effects.regime_of([1.10, 1.12, 1.09, 1.11]) == "expander"
    assert effects.regime_of([0.90, 0.92, 0.91, 0.93]) == "dampener"
    assert effects.regime_of([0.98, 1.03, 0.99, 1.01]) == "undetermined"  # mean > 1, CI contains 1
    assert effects.flip_by_intervals("expander", "dampener") is True
    assert effects.flip_by_intervals("expander", "expander") is False
    assert effects.flip_by_intervals("expander", "undetermined") is None


def _runs():
    """Two arms x 6 seeds x budgets 100/200, checkpoints every 50 steps, known answers."""
    rows = []
    for arm, shift in (("base", 0.0), ("wd=1", 0.05)):
        for seed in range(1, 7):
            for budget in (100, 200):
                for step in range(0, budget + 1, 50):
                    loss = 5.0 - step / 100 - (0.2 if arm == "base" else 0.0)
                    rows.append({"arm": arm, "seed": seed, "budget": budget, "step": step,
                                 "run": f"{arm}__seed{seed}__b{budget}", "val_loss": loss,
                                 "last_block_gain": 1.0 + step / 1000 + shift + seed * 1e-3,
                                 "penultimate_gain": 1.2 - shift})
    return pd.DataFrame(rows)


def test_budget_effects_family_and_matched_loss():
    comps = [("weight_decay", 0.1, 1.0, "base", "wd=1")]
    eff = effects.budget_effects_frame(_runs(), comps, budgets=(100, 200), primary=[("weight_decay", 1.0)],
                                       metrics=("last_block_gain", "penultimate_gain", "val_loss"))
    prim = eff.loc[eff["family"] == "primary"]
    assert set(prim["metric"]) == {"last_block_gain", "penultimate_gain"} and set(prim["budget"]) == {200}
    assert (prim["basis"] == "budget").all()
    np.testing.assert_allclose(prim["pvalue_holm"], holm(prim["pvalue"]))
    assert eff.loc[eff["family"] == "secondary", "pvalue_holm"].isna().all()
    g = eff.set_index(["basis", "budget", "metric"])
    assert g.loc[("budget", 200, "last_block_gain"), "effect"] == pytest.approx(0.05)
    assert g.loc[("budget", 200, "penultimate_gain"), "effect"] == pytest.approx(-0.05)
    # matched loss: target = the worse arm's final loss (wd=1: 3.0), which base reaches at step 180
    m = g.loc[("matched_loss", 200, "last_block_gain")]
    assert m["matched_val_loss"] == pytest.approx(3.0)
    # base at step 180 has G = 1 + 0.18, wd=1 at step 200 has 1 + 0.2 + 0.05: difference 0.07
    assert m["effect"] == pytest.approx(0.07)
    assert g.loc[("budget", 200, "last_block_gain"), "flips_regime"] is False  # both expanders


def test_spec_budgets_primary_and_hash():
    data = {"lab": {"seeds": [1, 2], "budgets": [300, 150], "checkpoint_every": 50,
                    "primary": [["weight_decay", 0.9]]},
            "base": {"n_layers": 2, "d_model": 32, "steps": 300, "warmup_steps": 20},
            "knobs": {"weight_decay": [0.1, 0.9]}}
    spec = parse_lab_spec(data)
    assert spec.budgets == (150, 300) and spec.primary == (("weight_decay", 0.9),)
    assert len(spec.sha256) == 64 and spec.sha256 == parse_lab_spec(data).sha256
    changed = {**data, "lab": {**data["lab"], "budgets": [150, 600]}}
    assert parse_lab_spec(changed).sha256 != spec.sha256
    from thermo_lens.lab.run import _run_infos

    ids = [i.run_id for i in _run_infos(spec)]
    assert len(ids) == 2 * 2 * 2 and "base__seed1__b150" in ids and "weight_decay=0.9__seed2__b300" in ids
    for bad, msg in (({"budgets": [10]}, "warmup"), ({"primary": [["weight_decay", 0.1]]}, "non-reference"),
                     ({"primary": [["optimizer", "sgd-momentum"]]}, "knob"), ({"checkpoint_every": 0}, r"steps in \[1, "),
                     ({"primary_metrics": ["nope"]}, "choose from")):
        with pytest.raises(LabSpecError, match=msg):
            parse_lab_spec({**data, "lab": {**data["lab"], **bad}})


MICRO = """
[lab]
name = "micro-v2"
seeds = [1, 2]
budgets = [12, 24]
checkpoints = 2
checkpoint_every = 8
prompts = ["The cat sat on the mat.", "Gains of the residual stream."]
primary = [["weight_decay", 0.9]]
[base]
n_layers = 2
d_model = 16
n_heads = 2
d_mlp = 32
n_ctx = 32
block_size = 16
batch_size = 4
vocab_size = 300
steps = 24
warmup_steps = 2
[knobs]
weight_decay = [0.1, 0.9]
"""


@pytest.mark.slow
def test_a_lab_with_budgets_end_to_end(tmp_path):
    import json

    from thermo_lens.lab.run import run_lab, write_tables
    from thermo_lens.lab.spec import load_lab_spec

    spec_file = tmp_path / "micro.toml"
    spec_file.write_text(MICRO)
    out = tmp_path / "lab"
    res = run_lab(spec_file, out, report=False)
    assert res.ok, res.failed
    spec = load_lab_spec(spec_file)
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["budget"]) == {12, 24} and set(runs["spec_sha256"]) == {spec.sha256}
    assert sorted(runs.loc[runs["budget"] == 24, "step"].unique()) == [0, 8, 16, 24]
    assert json.loads((out / "lab.json").read_text())["spec_sha256"] == spec.sha256
    eff = pd.read_csv(out / "effects.csv")
    assert set(eff["basis"]) == {"budget", "matched_loss"}
    prim = eff.loc[eff["family"] == "primary"]
    assert len(prim) == 2 and (prim["budget"] == 24).all() and prim["pvalue_holm"].notna().all()
    assert (out / "figures" / "per_seed_weight_decay_0.9.html").is_file()
    # the report's lab section shows the declared family and says how intervals and flips are decided
    from thermo_lens.lab.report_section import lab_section
    from thermo_lens.report import write_report

    write_report(out / "train", tmp_path / "r.html", panel=False, sections=[lab_section(out)])
    page = (tmp_path / "r.html").read_text()
    assert "Declared primary family" in page and "inverts the exact two-sided sign-flip test" in page
    # Tables written for a changed spec hold exactly its runs, tagged by it: a seed added but not yet
    # trained has no rows, the kept runs' rows carry the new spec's SHA-256; a dropped seed's rows go.
    from dataclasses import replace

    before = pd.read_csv(out / "runs.csv")
    wider = replace(load_lab_spec(spec_file), seeds=(*spec.seeds, 99))
    write_tables(out, wider)
    after = pd.read_csv(out / "runs.csv")
    assert set(after["spec_sha256"]) == {wider.sha256}
    assert after.drop(columns="spec_sha256").equals(before.drop(columns="spec_sha256"))
    narrower = replace(load_lab_spec(spec_file), seeds=spec.seeds[:1])
    write_tables(out, narrower)
    after = pd.read_csv(out / "runs.csv")
    assert set(after["seed"]) == {spec.seeds[0]} and len(after) == (before["seed"] == spec.seeds[0]).sum()
