"""L*: empirical variants on hand-made traces with known answers, the predicted formula against
hand arithmetic and the paper's own published values, and both error metrics."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from thermo_lens.depth import (
    LStarResult,
    empirical_l_star,
    l_star_error,
    l_star_from_traces,
    predicted_l_star,
    trace_derivative,
)
from thermo_lens.errors import ThermoLensInputError
from thermo_lens.sheaf import sheaf_traces

TABLE = Path(__file__).resolve().parents[1] / "thermo_lens" / "data" / "paper_reference_table.csv"


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
    np.testing.assert_allclose(trace_derivative(T), [1, 1.5, 3.5, 3, 0.75, 0.5])
    assert empirical_l_star(T) == 2.0
    # falling trace: |dT/dl| counts: [-1, -3.5, -3.25, -0.5] -> layer 1
    assert empirical_l_star([10.0, 9.0, 3.0, 2.5]) == 1.0
    # one-sided difference at the first layer wins: [10, 5.5, 1, 1]
    assert empirical_l_star(torch.tensor([0.0, 10.0, 11.0, 12.0])) == 0.0
    # ties go to the shallowest layer
    assert empirical_l_star([0.0, 1.0, 2.0, 3.0]) == 0.0


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
    r = l_star_from_traces(T, n_layers=6, n_heads=4)
    assert isinstance(r, LStarResult)
    assert r.empirical == 2.0 and r.variant == "argmax_abs_gradient"
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
    zero = l_star_from_traces([0.0, 10.0, 11.0], n_heads=2)
    assert zero.empirical == 0.0 and math.isnan(zero.ape) and "undefined" in zero.note
    assert "empirical L* = 0" in repr(zero)


def test_l_star_from_sheaf_traces(bridge):
    t = sheaf_traces(bridge("gpt2"), ["The capital of France is Paris", "Water boils at", "the early bird"])
    r = t.l_star()
    torch.testing.assert_close(r.layer_trace, t.mean_layer_trace)
    assert (r.n_layers, r.n_heads) == (3, 4)
    assert r.empirical == float(np.argmax(np.abs(np.gradient(t.mean_layer_trace.numpy()))))
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
    from thermo_lens.depth import L_STAR_RULES, PAPER_L_STAR_RULE

    assert PAPER_L_STAR_RULE == "argmax_abs_gradient"
    assert [n for n, r in L_STAR_RULES.items() if r.paper] == ["argmax_abs_gradient"]
    assert "appendix E" in L_STAR_RULES["argmax_abs_gradient"].provenance
    assert not any("paper" in n for n, r in L_STAR_RULES.items() if not r.paper)
    assert "not the paper's text" in L_STAR_RULES["notebook_v3_first_peak"].provenance
    r = l_star_from_traces([0.0, 1.0, 3.0, 8.0], n_heads=4)
    assert r.variant == "argmax_abs_gradient" and r.paper_rule and "the paper's rule" in repr(r)
    assert "appendix E" in r.provenance and LStarResult.from_json(r.to_json()).provenance == r.provenance
    n = l_star_from_traces([0.0, 1.0, 3.0, 8.0], n_heads=4, variant="first_turning_point")
    assert "not the paper's rule" in repr(n)


def test_one_account_of_l_star_definitions_and_docstring():
    """definitions.md §4 (also the docs' definitions page) and depth's docstring carry the registry's
    text (regenerate the page with ``python -m thermo_lens.depth --write``)."""
    import re

    import thermo_lens.depth as depth
    from thermo_lens.depth.__main__ import render
    from thermo_lens.depth.rules import L_STAR_RULES, RULES_BEGIN

    root = Path(__file__).resolve().parents[1]
    flat = lambda s: re.sub(r"\s+", " ", s)  # noqa: E731
    for path, indent in ((root / "thermo_lens" / "definitions.md", ""),):
        text = path.read_text(encoding="utf-8")
        assert RULES_BEGIN in text, f"{path.name} lost its L* markers"
        assert render(text, indent) == text, f"{path.name}: run python -m thermo_lens.depth --write"
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
