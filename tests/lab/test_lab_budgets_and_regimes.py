"""Heritage lab v2: budgets, matched validation loss, the declared primary family, intervals that
invert their test, regime flips decided by intervals, one spec hash on every result."""

from __future__ import annotations

import itertools
import pathlib

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from thermo_lens.experiments.lab import effects
from thermo_lens.experiments.lab.recipe import LabSpecError
from thermo_lens.experiments.lab.spec import parse_lab_spec
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
    # no declared family (a plan's secondary amendment): every row secondary, nothing adjusted
    none = effects.budget_effects_frame(_runs(), comps, budgets=(100, 200), metrics=("last_block_gain",))
    assert (none["family"] == "secondary").all() and none["pvalue_holm"].isna().all()


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
    from thermo_lens.experiments.lab.run import _run_infos

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

    from thermo_lens.experiments.lab.run import run_lab, write_tables
    from thermo_lens.experiments.lab.spec import load_lab_spec

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
    from thermo_lens.experiments.lab.report_section import lab_section
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


# ------------------------------------------------------------------ regime per arm and budget

V2 = pathlib.Path(__file__).resolve().parents[2] / "results" / "heritage-lab-v2"
#: the arms as the lab folder's README names them
NAMES = {"base": "base", "weight_decay=0": "weight decay 0", "weight_decay=0.9": "weight decay 0.9",
         "optimizer=adamw-b2=0.999": "AdamW b2 0.999", "optimizer=sgd-momentum": "SGD (lr 1.0)"}


def _synthetic_runs(tmp_path):
    """Three arms x 12 seeds x budgets 1200/2400 with known regimes; one interrupted run."""
    rows = []
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.002, size=12)
    centre = {("base", 1200): 1.02, ("base", 2400): 0.97,        # expander, then dampener
              ("wd", 1200): 1.02, ("wd", 2400): 1.03,            # expander both: flips at 2400
              ("b2", 1200): 1.0, ("b2", 2400): 0.96}             # undetermined, then dampener
    for (arm, budget), c in centre.items():
        for seed in range(1, 13):
            last = budget if not (arm == "b2" and budget == 2400 and seed == 12) else budget - 400  # interrupted
            for step in (0, last):
                rows.append({"arm": arm, "seed": seed, "budget": budget, "step": step,
                             "last_block_gain": c + noise[seed - 1] if step == last else 1.5,
                             "penultimate_gain": 1.1})
    path = tmp_path / "runs-long.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_regimes_on_a_synthetic_lab(tmp_path):
    from thermo_lens.experiments.lab import regimes

    runs = regimes.read_runs([_synthetic_runs(tmp_path)])
    reg = regimes.arm_regimes(runs, min_seeds=12).set_index(["metric", "arm", "budget"])
    g = reg.loc["last_block_gain"]
    assert g.loc[("base", 1200), "regime"] == "expander" and g.loc[("base", 2400), "regime"] == "dampener"
    assert g.loc[("b2", 1200), "regime"] == "undetermined"
    # the interrupted run is left out, so 11 seeds: no claim, however tight the interval
    assert g.loc[("b2", 2400), "n_seeds"] == 11 and g.loc[("b2", 2400), "n_unfinished"] == 1
    assert g.loc[("b2", 2400), "regime"] == "incomplete" and g.loc[("b2", 2400), "t_ci_high"] < 1
    # an independent computation of one interval: mean +- t_{0.975, 11} sd / sqrt(12)
    v = 1.02 + np.random.default_rng(0).normal(0, 0.002, size=12)
    half = stats.t.ppf(0.975, 11) * v.std(ddof=1) / np.sqrt(12)
    assert g.loc[("base", 1200), "t_ci_low"] == pytest.approx(v.mean() - half)
    flips = regimes.knob_flips(regimes.arm_regimes(runs, min_seeds=12)).set_index(["metric", "budget", "arm"])
    f = flips.loc["last_block_gain"]
    assert f.loc[(2400, "wd"), "flips"] is True and f.loc[(1200, "wd"), "flips"] is False
    assert f.loc[(1200, "b2"), "flips"] is None and f.loc[(2400, "b2"), "flips"] is None
    text = regimes.format_regimes(regimes.arm_regimes(runs, min_seeds=12),
                                  regimes.knob_flips(regimes.arm_regimes(runs, min_seeds=12)))
    assert "budget 2400: reference dampener; flipped by wd; cannot tell for b2" in text
    assert "(1 unfinished)" in text


def test_regime_table_of_the_v2_lab_agrees_with_its_effects_table():
    """The script's regimes are effects.csv's reference_regime / level_regime, cell by cell, and at
    150 and 300 steps every arm is a determined expander that no knob flips."""
    import runpy

    from thermo_lens.experiments.lab import regimes

    runs = regimes.read_runs([V2 / "runs.csv"])
    reg = regimes.arm_regimes(runs, min_seeds=12)
    eff = pd.read_csv(V2 / "effects.csv")
    eff = eff.loc[(eff["basis"] == "budget") & eff["metric"].isin(list(regimes.REGIME_METRICS))]
    r = reg.set_index(["metric", "arm", "budget"])["regime"]
    for _, row in eff.iterrows():
        assert r[(row["metric"], row["reference_arm"], row["budget"])] == row["reference_regime"]
        assert r[(row["metric"], row["arm"], row["budget"])] == row["level_regime"]
    early = reg.loc[reg["budget"] < 600]
    assert len(early) == 2 * 5 * 2 and (early["regime"] == "expander").all()
    flips = regimes.knob_flips(reg)
    assert (flips.loc[flips["budget"] < 600, "flips"] == False).all()  # noqa: E712
    b2 = reg.set_index(["metric", "arm", "budget"]).loc[("last_block_gain", "optimizer=adamw-b2=0.999", 600)]
    assert (round(b2["t_ci_low"], 4), round(b2["t_ci_high"], 4)) == (1.0044, 1.0243)
    text = runpy.run_path(str(V2 / "regime_table.py"), run_name="not_main")["main"]([str(V2 / "runs.csv")])
    assert "budget 300: reference expander, every arm a determined expander; not flipped by any knob" in text


@pytest.mark.slow
def test_the_v2_readme_numbers_are_the_csvs():
    """readme_numbers.py recomputes every quoted effect from runs.csv (and asserts it equals
    effects.csv); the README's regime table and primary rows are those numbers."""
    import runpy

    from thermo_lens.experiments.lab import regimes

    out = runpy.run_path(str(V2 / "readme_numbers.py"), run_name="not_main")["main"]()
    tab = out["table"].set_index(["basis", "budget", "arm", "metric"])
    readme = (V2 / "README.md").read_text()
    for arm in ("weight_decay=0.9", "optimizer=adamw-b2=0.999", "optimizer=sgd-momentum"):
        for m in ("last_block_gain", "penultimate_gain"):
            r = tab.loc[("budget", 600, arm, m)]
            cell = (f"| {r['effect']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | "
                    f"[{r['t_ci_low']:+.3f}, {r['t_ci_high']:+.3f}] |")
            assert cell in readme, cell
            assert f"| {r['detectable_05']:.3f} / {r['detectable_holm']:.3f} |" in readme
    late = tab.loc[("budget", 300, "weight_decay=0.9", "penultimate_gain")]
    assert (round(late["effect"], 4), round(late["p"], 4), late["n_negative"], round(late["holm"], 3)) == (
        -0.0167, 0.0044, 11, 0.018)
    reg = regimes.arm_regimes(regimes.read_runs([V2 / "runs.csv"]), min_seeds=12).set_index(["metric", "arm", "budget"])
    for arm, name in NAMES.items():
        cells = []
        for m in ("last_block_gain", "penultimate_gain"):
            for b in (150, 300, 600):
                r = reg.loc[(m, arm, b)]
                dig = 4 if arm == "optimizer=adamw-b2=0.999" and b == 600 else 3
                word = "**undetermined**" if r["regime"] == "undetermined" else r["regime"]
                cells.append(f"{word} [{r['t_ci_low']:.{dig}f}, {r['t_ci_high']:.{dig}f}]"
                             + (f", {r['n_below_1']} <1" if r["n_below_1"] else ""))
        assert f"| {name} | " + " | ".join(cells) + " |" in readme, name

    # the docs' findings page (the README links to it) quotes the same numbers
    top = (V2.parents[1] / "docs" / "findings.md").read_text()
    wd = [tab.loc[("budget", 600, "weight_decay=0.9", m)] for m in ("last_block_gain", "penultimate_gain")]
    b2 = [tab.loc[("budget", 600, "optimizer=adamw-b2=0.999", m)] for m in ("last_block_gain", "penultimate_gain")]
    assert f"{wd[0]['detectable_05']:.3f} / {wd[1]['detectable_05']:.3f} for weight decay 0.9" in top
    assert f"{b2[0]['detectable_05']:.3f} / {b2[1]['detectable_05']:.3f} for b2" in top
    assert (f"{wd[0]['detectable_holm']:.3f} / {wd[1]['detectable_holm']:.3f} and {b2[0]['detectable_holm']:.3f} / "
            f"{b2[1]['detectable_holm']:.3f} at the Holm level") in top
    r = reg.loc[("last_block_gain", "optimizer=adamw-b2=0.999", 600)]
    assert f"b2 G_L [{r['t_ci_low']:.4f}, {r['t_ci_high']:.4f}]" in top
    assert f"by -{abs(late['effect']):.3f} [{late['ci_low']:.3f}, {late['ci_high']:.3f}] at 300 steps" in top


def test_the_amendments_regimes_agree_with_its_effects_table_and_nothing_in_it_is_primary():
    """Amendment 1 (1200 / 2400 steps): every arm and budget has all 12 seeds, the regimes are
    effects-long.csv's reference_regime / level_regime cell by cell, no row claims to be primary, and
    the flips at 2400 steps are the ones the README states."""
    import runpy

    from thermo_lens.experiments.lab import regimes

    runs = regimes.read_runs([V2 / "runs-long.csv"])
    reg = regimes.arm_regimes(runs, min_seeds=12)
    assert set(reg["budget"]) == {1200, 2400} and (reg["n_seeds"] == 12).all() and (reg["n_unfinished"] == 0).all()
    eff = pd.read_csv(V2 / "effects-long.csv")
    assert (eff["family"] == "secondary").all() and eff["pvalue_holm"].isna().all()
    both = eff.loc[(eff["basis"] == "budget") & eff["metric"].isin(list(regimes.REGIME_METRICS))]
    assert len(both) == 4 * 2 * 2
    r = reg.set_index(["metric", "arm", "budget"])["regime"]
    for _, row in both.iterrows():
        assert r[(row["metric"], row["reference_arm"], row["budget"])] == row["reference_regime"]
        assert r[(row["metric"], row["arm"], row["budget"])] == row["level_regime"]
    flips = regimes.knob_flips(reg).set_index(["metric", "budget", "arm"])["flips"]
    g = flips.loc["last_block_gain"]
    assert g[(2400, "optimizer=sgd-momentum")] is True
    assert g[(2400, "weight_decay=0.9")] is False and g[(2400, "optimizer=adamw-b2=0.999")] is False
    assert g[(2400, "weight_decay=0")] is None and all(g[(1200, arm)] is None for arm in NAMES if arm != "base")
    assert all(v is None for v in flips.loc["penultimate_gain"])  # the reference is undetermined there
    # the same seeds: every run starts from v2's initial weights (step-0 gains equal to the CSV's rounding)
    v2 = pd.read_csv(V2 / "runs.csv")
    long = pd.read_csv(V2 / "runs-long.csv")
    start = [d.loc[d["step"] == 0].groupby(["arm", "seed"])["last_block_gain"].first() for d in (v2, long)]
    assert np.abs(start[0] - start[1]).max() < 1e-7
    text = runpy.run_path(str(V2 / "regime_table.py"), run_name="not_main")["main"](
        [str(V2 / "runs.csv"), str(V2 / "runs-long.csv")])
    assert "budget 2400: reference dampener; flipped by optimizer=sgd-momentum" in text


@pytest.mark.slow
def test_the_amendments_readme_numbers_are_the_csvs():
    """The README's Amendment 1 tables (regimes and effects) and the findings page's sentences on it are
    readme_numbers.py's recomputation, which asserts it equals effects-long.csv."""
    import runpy

    from thermo_lens.experiments.lab import regimes

    out = runpy.run_path(str(V2 / "readme_numbers.py"), run_name="not_main")["main"]()
    tab = out["long_table"].set_index(["basis", "budget", "arm", "metric"])
    readme = (V2 / "README.md").read_text()
    reg = regimes.arm_regimes(regimes.read_runs([V2 / "runs-long.csv"]), min_seeds=12).set_index(
        ["metric", "arm", "budget"])
    for arm, name in NAMES.items():
        cells = []
        for m in ("last_block_gain", "penultimate_gain"):
            for b in (1200, 2400):
                r = reg.loc[(m, arm, b)]
                word = r["regime"] if r["regime"] == "expander" else f"**{r['regime']}**"
                cells.append(f"{word} {r['mean']:.3f} [{r['t_ci_low']:.4f}, {r['t_ci_high']:.4f}]"
                             + (f", {r['n_below_1']} <1" if r["n_below_1"] else ""))
        assert f"| {name} | " + " | ".join(cells) + " |" in readme, name

    def fmt_p(p):
        return f"{p:.5f}".rstrip("0") if p < 0.001 else f"{p:.2g}"

    for arm in ("weight_decay=0.9", "weight_decay=0", "optimizer=adamw-b2=0.999", "optimizer=sgd-momentum"):
        cells = []
        for m in ("last_block_gain", "penultimate_gain"):
            for b in (1200, 2400):
                r = tab.loc[("budget", b, arm, m)]
                cells.append(f"{r['effect']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}], p = {fmt_p(r['p'])}")
        assert " | ".join(cells) + " |" in readme, arm
    # the matched-loss sentences, and the robustness note's Holm over the 16 regime-metric rows
    wd = tab.loc[("matched_loss", 2400, "weight_decay=0.9", "last_block_gain")]
    assert f"{wd['effect']:.3f} [{wd['ci_low']:.3f},\n  {wd['ci_high']:.3f}]" in readme
    sgd = tab.loc[("matched_loss", 2400, "optimizer=sgd-momentum", "last_block_gain")]
    assert sgd["n"] == 5 and sgd["p"] == 2 / 32 and f"only {int(sgd['n'])} SGD seeds reach {out['long_target']:.3f}" in readme
    h = out["long_table"].dropna(subset=["holm16"])
    small = h.loc[h["holm16"] < 0.012]
    assert set(small["arm"]) == {"weight_decay=0.9", "optimizer=sgd-momentum", "weight_decay=0"}
    assert small.loc[small["arm"] == "weight_decay=0", ["budget", "metric"]].values.tolist() == [[2400, "last_block_gain"]]
    assert (h.loc[h["holm16"] >= 0.012, "holm16"] == 1.0).all()
    # the findings page
    top = (V2.parents[1] / "docs" / "findings.md").read_text()
    base = reg.loc[("last_block_gain", "base", 2400)]
    assert f"determined dampener at 2400 ({base['mean']:.3f} [{base['t_ci_low']:.4f}, {base['t_ci_high']:.4f}]" in top
    sgd2400 = reg.loc[("last_block_gain", "optimizer=sgd-momentum", 2400)]
    assert f"G_L {sgd2400['mean']:.3f} [{sgd2400['t_ci_low']:.4f}, {sgd2400['t_ci_high']:.4f}]" in top
    for b in (1200, 2400):
        r = tab.loc[("budget", b, "weight_decay=0.9", "last_block_gain")]
        assert f"{r['effect']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] at {b}" in top
    means = [reg.loc[("last_block_gain", a, 2400), "mean"] for a in ("weight_decay=0", "base", "weight_decay=0.9")]
    assert "doses order G_L: {:.3f} / {:.3f} / {:.3f}".format(*means) in top
