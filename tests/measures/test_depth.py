"""L*: empirical variants on hand-made traces with known answers, the predicted formula against
hand arithmetic and the paper's own published values, and both error metrics."""

import csv
import math
from pathlib import Path

import numpy as np
from scipy import stats
import pytest
import torch

from thermo_lens.measures.depth import (
    LStarResult,
    empirical_l_star,
    l_star_error,
    l_star_from_traces,
    predicted_l_star,
    trace_derivative,
)
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.measures.sheaf import sheaf_traces

TABLE = Path(__file__).resolve().parents[2] / "thermo_lens" / "data" / "paper_reference_table.csv"


def test_predicted_formula_by_hand():
    assert predicted_l_star(12, 12) == pytest.approx(12 * (0.11 + 0.012 * 12 + 4.9 / 12))
    assert predicted_l_star(12, 12) == pytest.approx(7.948)  # 12 * (0.11 + 0.144 + 0.408333)
    assert predicted_l_star(24, 16) == pytest.approx(16.902)  # 24 * (0.11 + 0.288 + 0.30625)
    assert predicted_l_star(32, 32) == pytest.approx(32 * (0.11 + 0.384 + 0.153125))


def test_predicted_formula_matches_paper_published_values():
    rows = [r for r in csv.DictReader(TABLE.open()) if r["measurement"] == "L_star_predicted"]
    assert rows, "the reference table has no L_star_predicted rows"
    for r in rows:
        assert predicted_l_star(int(r["n_layers"]), int(r["n_heads"])) == pytest.approx(float(r["value"]), abs=5e-4), r["model"]


def test_paper_error_reproduces_published_percentages():
    """The paper's 'L_star_error_pct' is |pred - emp| / L (not APE): e.g. pythia-160m 39.57%."""
    rows = {(r["model"], r["measurement"]): r for r in csv.DictReader(TABLE.open())}
    checked = 0
    for (model, meas), r in rows.items():
        if meas != "L_star_error_pct":
            continue
        pred = float(rows[(model, "L_star_predicted")]["value"])
        emp = float(rows[(model, "L_star_empirical_signchange")]["value"])
        L = int(r["n_layers"])
        assert 100 * l_star_error(pred, emp, "paper", L) == pytest.approx(float(r["value"]), abs=1e-3), model
        checked += 1
    assert checked >= 3
    # and by hand
    assert l_star_error(7.948, 3.2, "paper", 12) == pytest.approx(4.748 / 12)
    assert l_star_error(7.948, 3.2, "ape") == pytest.approx(4.748 / 3.2)
    assert l_star_error(6.0, 8.0, "ape") == pytest.approx(0.25)
    assert math.isnan(l_star_error(5.0, 0.0, "ape"))  # undefined, not inf
    assert math.isnan(l_star_error(5.0, math.nan, "paper", 12))


def test_argmax_abs_gradient_on_hand_traces():
    # np.gradient: [1-0, (3-0)/2, (8-1)/2, (9-3)/2, (9.5-8)/2, 9.5-9] = [1, 1.5, 3.5, 3, 0.75, 0.5]
    T = [0.0, 1.0, 3.0, 8.0, 9.0, 9.5]
    paper = "argmax_abs_gradient"
    np.testing.assert_allclose(trace_derivative(T, paper), [1, 1.5, 3.5, 3, 0.75, 0.5])
    assert empirical_l_star(T, paper) == 2.0
    # falling trace: |dT/dl| counts: [-1, -3.5, -3.25, -0.5] -> layer 1
    assert empirical_l_star([10.0, 9.0, 3.0, 2.5], paper) == 1.0
    # one-sided difference at the first layer wins: [10, 5.5, 1, 1]
    assert empirical_l_star(torch.tensor([0.0, 10.0, 11.0, 12.0]), paper) == 0.0
    # ties go to the shallowest layer
    assert empirical_l_star([0.0, 1.0, 2.0, 3.0], paper) == 0.0


def test_first_turning_point_on_hand_traces():
    assert empirical_l_star([1.0, 2.0, 3.0, 2.0, 1.0], "first_turning_point") == 2.0  # max at layer 2
    assert empirical_l_star([5.0, 3.0, 4.0, 6.0], "first_turning_point") == 1.0  # min at layer 1 (a valley counts)
    # zero differences are skipped: d = [1, 0, 1, -2] -> the turn is at layer 3
    assert empirical_l_star([1.0, 2.0, 2.0, 3.0, 1.0], "first_turning_point") == 3.0
    # d = [1, 0, -1]: plateau at layers 1-2, the sign flips at layer 2
    assert empirical_l_star([1.0, 2.0, 2.0, 1.0], "first_turning_point") == 2.0
    np.testing.assert_allclose(trace_derivative([1.0, 2.0, 2.0, 1.0], "first_turning_point"), [1, 0, -1])
    assert math.isnan(empirical_l_star([1.0, 2.0, 4.0, 8.0], "first_turning_point"))  # monotone


def test_l_star_from_layer_trace_array():
    T = np.array([0.0, 1.0, 3.0, 8.0, 9.0, 9.5])
    r = l_star_from_traces(T, n_layers=6, n_heads=4, variant="argmax_abs_gradient")
    assert isinstance(r, LStarResult)
    assert r.empirical == 2.0 and r.variant == "argmax_abs_gradient" and r.paper_rule_empirical == 2.0
    assert r.predicted == pytest.approx(6 * (0.11 + 0.072 + 4.9 / 4))
    assert r.ape == pytest.approx(abs(r.predicted - 2) / 2)
    assert r.paper_error == pytest.approx(abs(r.predicted - 2) / 6)
    assert r.error("paper") == r.paper_error and r.error("ape") == r.ape
    assert "0-based" in r.layer_indexing and r.per_prompt is None
    df = r.to_frame()
    assert len(df) == 6 and df.loc[df.is_l_star, "layer"].tolist() == [2]
    np.testing.assert_allclose(df.derivative, [1, 1.5, 3.5, 3, 0.75, 0.5])
    r2 = LStarResult.from_json(r.to_json())
    assert r2.empirical == r.empirical and torch.equal(r2.layer_trace, r.layer_trace)
    # [prompt, layer]: mean over prompts, and one L* per prompt
    per = np.array([[1.0, 2.0, 3.0, 2.0], [1.0, 0.0, 1.0, 0.0]])
    rs = l_star_from_traces(per, n_heads=2, variant="first_turning_point")
    np.testing.assert_allclose(rs.layer_trace, [1.0, 1.0, 2.0, 1.0])
    assert rs.per_prompt.tolist() == [2.0, 1.0] and rs.empirical == 2.0
    mono = l_star_from_traces([1.0, 2.0, 3.0], n_heads=2, variant="first_turning_point")
    assert math.isnan(mono.empirical) and math.isnan(mono.ape) and "monotone" in mono.note
    zero = l_star_from_traces([0.0, 10.0, 11.0], n_heads=2, variant="argmax_abs_gradient")
    assert zero.empirical == 0.0 and math.isnan(zero.ape) and "undefined" in zero.note
    assert "empirical L* = 0" in repr(zero)


def test_l_star_from_sheaf_traces(bridge):
    t = sheaf_traces(bridge("gpt2"), ["The capital of France is Paris", "Water boils at", "the early bird"])
    r = t.l_star()
    torch.testing.assert_close(r.layer_trace, t.mean_layer_trace)
    assert (r.n_layers, r.n_heads) == (3, 4)
    T = t.mean_layer_trace.numpy()
    assert r.variant == "steepest_step" and r.empirical == float(np.argmax(np.abs(np.diff(T))) + 1)
    assert r.paper_rule_empirical == float(np.argmax(np.abs(np.gradient(T))))
    assert r.predicted == pytest.approx(predicted_l_star(3, 4))
    assert r.per_prompt.shape == (3,)
    assert r.source["trace_formula"] == "off_diagonal_mass" and r.source["prepend_bos"] is True
    with pytest.raises(ThermoLensInputError, match="n_heads=8 disagrees"):
        l_star_from_traces(t, n_heads=8)
    assert LStarResult.from_json(r.to_json()).source == r.source


def test_bad_inputs():
    with pytest.raises(ThermoLensInputError, match="unknown L\\* variant"):
        empirical_l_star([1.0, 2.0], "argmax")
    with pytest.raises(ThermoLensInputError, match="1-D"):
        empirical_l_star(np.ones((2, 3, 4)))
    with pytest.raises(ThermoLensInputError, match="at least 3"):
        empirical_l_star([1.0, 2.0], "first_sign_change")
    with pytest.raises(ThermoLensInputError, match="NaN/inf at layer"):
        empirical_l_star([1.0, float("nan"), 2.0])
    with pytest.raises(ThermoLensInputError, match="n_layers=5"):
        l_star_from_traces([1.0, 2.0, 3.0], n_layers=5, n_heads=2)
    with pytest.raises(ThermoLensInputError, match="pass n_heads"):
        l_star_from_traces([1.0, 2.0, 3.0])
    with pytest.raises(ThermoLensInputError, match="positive integer"):
        predicted_l_star(12, 0)
    with pytest.raises(ThermoLensInputError, match="'ape' or 'paper'"):
        l_star_error(1.0, 2.0, "mape")
    with pytest.raises(ThermoLensInputError, match="needs n_layers"):
        l_star_error(1.0, 2.0, "paper")


# ---------------------------------------------------------------- the notebook's v3 rule vs the turning point

def _notebook_v3_by_hand(T):
    """The released notebook's rule as its strict loop: the first i with d_i > 0 and d_{i+1} < 0
    (d = diff T), L* = i + 1; else the peak argmax T."""
    d = np.diff(np.asarray(T, dtype=float))
    for i in range(len(d) - 1):
        if d[i] > 0 and d[i + 1] < 0:
            return float(i + 1)
    return float(np.argmax(T))


def test_notebook_v3_rule_is_a_strict_scan_a_plateau_does_not_trip_it():
    T = [1.0, 2.0, 2.0, 3.0, 5.0, 4.0]  # d = [1, 0, 1, 2, -1]: the only strict + -> - turn is at layer 4
    assert empirical_l_star(T, "notebook_v3_first_peak") == 4.0
    vectorised = float(np.where(np.diff(np.sign(np.diff(T))) < 0)[0][0] + 1)
    assert vectorised == 1.0  # what the old one-liner gave: it fired on the + -> 0 step of the plateau
    r = l_star_from_traces(T, n_heads=4, variant="notebook_v3_first_peak")
    assert r.empirical == 4.0 and r.note == "" and not r.paper_rule


def test_notebook_v3_rule_takes_the_first_peak_not_a_valley():
    T = [5.0, 3.0, 2.0, 4.0, 6.0, 5.0]
    assert empirical_l_star(T, "notebook_v3_first_peak") == 4.0      # the peak at layer 4
    assert empirical_l_star(T, "first_turning_point") == 2.0         # the valley at layer 2
    # no + -> - turn: falls back to the peak argmax T and says so
    mono = [0.0, 1.0, 3.0, 8.0, 9.0, 9.5]
    assert empirical_l_star(mono, "notebook_v3_first_peak") == 5.0
    r = l_star_from_traces(mono, n_heads=4, variant="notebook_v3_first_peak")
    assert "fell back to the peak" in r.note and r.empirical == 5.0
    rng = np.random.default_rng(0)
    traces = np.vstack([rng.random((300, 12)), rng.integers(0, 3, (300, 12)).astype(float)])  # ties: plateaus
    assert all(empirical_l_star(t, "notebook_v3_first_peak") == _notebook_v3_by_hand(t) for t in traces)
    disagree = np.mean([empirical_l_star(t, "notebook_v3_first_peak") != empirical_l_star(t, "first_turning_point")
                        for t in traces[:300]])
    assert 0.3 < disagree < 0.7  # the two rules are different rules


def test_old_names_are_deprecated_aliases():
    with pytest.warns(DeprecationWarning, match="first_turning_point"):
        assert empirical_l_star([5.0, 3.0, 2.0, 4.0, 6.0, 5.0], "first_sign_change") == 2.0
    with pytest.warns(DeprecationWarning):
        r = l_star_from_traces([[1.0, 2.0, 1.0, 0.0]], n_heads=2, variant="first_sign_change")
    assert r.variant == "first_turning_point"
    with pytest.warns(DeprecationWarning, match="not the paper's"):
        assert empirical_l_star([1.0, 2.0, 2.0, 3.0, 5.0, 4.0], "paper_v3_sign_change") == 4.0  # now strict
    with pytest.warns(DeprecationWarning):
        assert l_star_from_traces([1.0, 2.0, 1.0], n_heads=2, variant="paper_v3_sign_change").variant == \
            "notebook_v3_first_peak"


def test_only_the_appendix_e_rule_is_called_the_papers():
    from thermo_lens.measures.depth import L_STAR_RULES, PAPER_L_STAR_RULE

    assert PAPER_L_STAR_RULE == "argmax_abs_gradient"
    assert [n for n, r in L_STAR_RULES.items() if r.paper] == ["argmax_abs_gradient"]
    assert "appendix E" in L_STAR_RULES["argmax_abs_gradient"].provenance
    assert not any("paper" in n for n, r in L_STAR_RULES.items() if not r.paper)
    assert "not the paper's text" in L_STAR_RULES["notebook_v3_first_peak"].provenance
    r = l_star_from_traces([0.0, 1.0, 3.0, 8.0], n_heads=4, variant="argmax_abs_gradient")
    assert r.variant == "argmax_abs_gradient" and r.paper_rule and "the paper's rule" in repr(r)
    d = l_star_from_traces([0.0, 1.0, 3.0, 8.0], n_heads=4)  # the default is not the paper's, and says so
    assert d.variant == "steepest_step" and not d.paper_rule and "not the paper's rule" in repr(d)
    assert "the paper's rule (argmax_abs_gradient, appendix E): L* = 3" in repr(d)  # np.gradient [1, 1.5, 3.5, 5]
    assert "appendix E" in r.provenance and LStarResult.from_json(r.to_json()).provenance == r.provenance
    n = l_star_from_traces([0.0, 1.0, 3.0, 8.0], n_heads=4, variant="first_turning_point")
    assert "not the paper's rule" in repr(n)


def test_one_account_of_l_star_definitions_and_docstring():
    """definitions.md §4 (also the docs' definitions page) and depth's docstring carry the registry's
    text (regenerate the page with ``python -m thermo_lens.measures.depth --write``)."""
    import re

    import thermo_lens.measures.depth as depth
    from thermo_lens.measures.depth.__main__ import render
    from thermo_lens.measures.depth.rules import L_STAR_RULES, RULES_BEGIN

    root = Path(__file__).resolve().parents[2]
    flat = lambda s: re.sub(r"\s+", " ", s)  # noqa: E731
    for path, indent in ((root / "thermo_lens" / "definitions.md", ""),):
        text = path.read_text(encoding="utf-8")
        assert RULES_BEGIN in text, f"{path.name} lost its L* markers"
        assert render(text, indent) == text, f"{path.name}: run python -m thermo_lens.measures.depth --write"
    doc = flat(depth.__doc__)
    for r in L_STAR_RULES.values():
        assert flat(r.definition) in doc, r.name
    section4 = (root / "thermo_lens" / "definitions.md").read_text(encoding="utf-8").split("## 4.")[1].split("## 5.")[0]
    assert "which the paper also used" not in section4 and "appendix E" in section4


def test_per_prompt_mean_beside_mean_trace_and_baselines():
    per = np.array([[5.0, 3.0, 2.0, 4.0, 6.0, 5.0], [1.0, 4.0, 2.0, 1.0, 0.0, 0.0]])
    r = l_star_from_traces(per, n_heads=64, variant="notebook_v3_first_peak")
    # per prompt: 4 and 1; their mean 2.5 (the paper's aggregation); mean trace [3,3.5,2,2.5,3,2.5] -> 1
    assert r.per_prompt.tolist() == [4.0, 1.0] and r.per_prompt_mean == 2.5
    assert r.aggregations == {"mean_trace": 1.0, "per_prompt_mean": 2.5}
    assert r.baselines == {"half_depth": 3.0}
    be = r.baseline_errors("paper")
    assert be["half_depth"] == pytest.approx(abs(3.0 - 1.0) / 6) and be["eq6"] == pytest.approx(r.paper_error)
    assert "half_depth = 3" in repr(r)
    r2 = LStarResult.from_json(r.to_json())
    assert r2.baselines == r.baselines and r2.per_prompt_mean == 2.5


def test_prediction_beyond_depth_warns():
    from thermo_lens.paper.lstar import LStarBeyondDepthWarning

    with pytest.warns(LStarBeyondDepthWarning, match="91.7"):
        assert predicted_l_star(80, 64) == pytest.approx(80 * (0.11 + 0.012 * 80 + 4.9 / 64))
    assert predicted_l_star(80, 64, warn=False) == pytest.approx(91.725)
    r = l_star_from_traces([0.0, 1.0, 3.0], n_heads=2)  # tiny model: 3 (0.11 + 0.036 + 2.45) > 3
    assert r.warnings and "outside the network" in repr(r)


# ---------------------------------------------------------------- the default rule: steepest_step


def test_steepest_step_on_a_plateau_and_at_the_ends():
    from thermo_lens.measures.depth import DEFAULT_L_STAR_RULE, L_STAR_RULES

    assert DEFAULT_L_STAR_RULE == "steepest_step" and not L_STAR_RULES[DEFAULT_L_STAR_RULE].paper
    # the plateau: the largest change, 5, is between layers 3 and 4; the paper's rule says 0
    plateau = [0.0, 3.0, 3.0, 3.0, 8.0, 8.0]
    assert empirical_l_star(plateau) == 4.0 and empirical_l_star(plateau, "argmax_abs_gradient") == 0.0
    np.testing.assert_allclose(trace_derivative(plateau), [3, 0, 0, 5, 0])
    # the steepest step at either end of the stack: layer 1 (step 0 -> 1) or layer L-1 (step L-2 -> L-1)
    assert empirical_l_star([0.0, 5.0, 5.5, 6.0, 6.2, 6.3]) == 1.0
    assert empirical_l_star([0.0, 0.1, 0.2, 0.3, 0.4, 3.0]) == 5.0
    assert empirical_l_star([9.0, 2.0, 1.5, 1.2]) == 1.0            # falling counts by |d|
    assert empirical_l_star(torch.tensor([1.0, 1.1, 1.2, -4.0])) == 3.0
    assert empirical_l_star([0.0, 7.0]) == 1.0                      # two layers: one step
    assert empirical_l_star([0.0, 1.0, 2.0, 3.0]) == 1.0            # ties: the shallowest step
    # L* is never layer 0 (it names the deeper layer of a step) and always an index of the trace
    rng = np.random.default_rng(5)
    for _ in range(200):
        t = rng.normal(size=int(rng.integers(2, 30)))
        ls = empirical_l_star(t)
        assert 1 <= ls <= t.size - 1 and abs(t[int(ls)] - t[int(ls) - 1]) == np.max(np.abs(np.diff(t)))


def test_a_flat_trace_has_no_l_star_and_says_why():
    from thermo_lens.measures.depth import l_star_note

    for flat in ([3.0, 3.0, 3.0, 3.0], [0.0, 0.0, 0.0], [1e6, 1e6 * (1 + 1e-16), 1e6]):
        assert math.isnan(empirical_l_star(flat)) and "flat" in l_star_note(flat)
        # the paper's rule is kept as written (np.argmax gives 0), with a note that it is a convention
        assert empirical_l_star(flat, "argmax_abs_gradient") == 0.0
        assert "convention" in l_star_note(flat, "argmax_abs_gradient")
    r = l_star_from_traces([2.0, 2.0, 2.0, 2.0], n_heads=4)
    assert math.isnan(r.empirical) and math.isnan(r.ape) and "flat" in r.note and "undefined" in repr(r)
    assert r.paper_rule_empirical == 0.0 and "convention" in r.paper_rule_note
    assert not r.to_frame()["is_l_star"].any()
    # a small but real step is not flat
    assert empirical_l_star([1.0, 1.0, 1.0 + 1e-9, 1.0 + 1e-9]) == 2.0 and l_star_note([1.0, 2.0]) == ""


def _chi2_uniform(counts):
    counts = np.asarray(counts, dtype=float)
    return stats.chisquare(counts).pvalue


def test_under_a_random_walk_the_default_l_star_is_uniform_and_the_papers_is_not():
    """Random walks of 12 layers (independent N(0, 1) steps): every step is equally likely to be the
    steepest, so steepest_step's L* must be uniform over 1 .. 11. Pearson's chi-square goodness-of-fit
    test over 20,000 walks (fixed seed) must not reject at 0.001; the same test on the paper's rule
    (uniform over its 12 layers 0 .. 11 would be its unbiased counterpart) must reject, since it lands on
    layer 0 or 11 with probability ~0.39 instead of 2/12. A bias of that kind and a fraction of its size
    is detected: the test has the power to fail a biased rule."""
    rng = np.random.default_rng(20261127)
    walks = np.cumsum(rng.normal(size=(20_000, 12)), axis=1)
    ls = np.array([empirical_l_star(w) for w in walks[:2_000]])          # the function itself ...
    vec = np.argmax(np.abs(np.diff(walks, axis=1)), axis=1) + 1           # ... and vectorised, on all
    assert np.array_equal(ls, vec[:2_000])
    counts = np.bincount(vec, minlength=12)
    assert counts[0] == 0
    p_default = _chi2_uniform(counts[1:])
    assert p_default > 1e-3, p_default
    paper = np.array([empirical_l_star(w, "argmax_abs_gradient") for w in walks[:2_000]])
    pvec = np.argmax(np.abs(np.gradient(walks, axis=1)), axis=1)
    assert np.array_equal(paper, pvec[:2_000])
    ends = np.mean((pvec == 0) | (pvec == 11))
    assert 0.37 < ends < 0.41                                              # the audit's 0.39
    assert _chi2_uniform(np.bincount(pvec, minlength=12)) < 1e-100
    # power: a rule that moves just 3% of the probability to the end steps fails the same test
    biased = vec.copy()
    move = rng.random(vec.size) < 0.03
    biased[move] = rng.choice([1, 11], size=int(move.sum()))
    assert _chi2_uniform(np.bincount(biased, minlength=12)[1:]) < 1e-3
