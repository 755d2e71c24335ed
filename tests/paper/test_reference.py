"""The paper's reference numbers (thermo_lens.reference)."""

import numpy as np
import pandas as pd
import pytest

from thermo_lens.paper import reference as R

GAIN_COLS = ["model", "hf_id", "lab", "n_layers", "n_heads", "d_model", "d_head", "rho", "gain",
             "std", "n_prompts", "definition", "label"]
PYTHIA = ["pythia-70m", "pythia-160m", "pythia-410m", "pythia-1b", "pythia-1.4b", "pythia-2.8b",
          "pythia-6.9b", "pythia-12b"]


def test_table_typed():
    t = R.table()
    assert len(t) == 201
    assert list(t.columns)[:10] == ["model", "hf_id", "lab", "n_layers", "n_heads", "d_model",
                                    "d_head", "rho", "measurement", "value"]
    for c in ("n_layers", "n_heads", "d_model", "d_head", "n_prompts"):
        assert str(t[c].dtype) == "Int64"
    for c in ("rho", "value", "std"):
        assert t[c].dtype == np.float64
    t.loc[0, "value"] = -1.0  # a copy: the cache is not touched
    assert R.table().loc[0, "value"] != -1.0


def test_rho_column_is_heads_over_dhead():
    t = R.table().dropna(subset=["rho", "n_heads", "d_head"])
    assert len(t) > 0
    np.testing.assert_allclose(t["rho"], t["n_heads"].astype(float) / t["d_head"].astype(float),
                               rtol=1e-5)


def test_models_distinct():
    m = R.models()
    keys = m["hf_id"].str.lower().str.replace("openai-community/", "")
    assert keys.is_unique
    assert "gpt2" in set(m["hf_id"]) and "openai-community/gpt2" not in set(m["hf_id"])
    assert m["hf_id"].notna().all()
    assert set(PYTHIA) <= set(m["model"])


def test_gains_default_one_row_per_model():
    g = R.gains()
    assert list(g.columns[: len(GAIN_COLS)]) == GAIN_COLS
    assert g["hf_id"].str.lower().is_unique
    assert len(g) == 23  # 8 Pythia sweep + 16 lab survey, Pythia-6.9B in both
    # Pythia-6.9B kept from the 25-prompt sweep, not the 5- or 3-prompt runs.
    row = g[g["model"] == "pythia-6.9b"].iloc[0]
    assert row["n_prompts"] == 25 and row["gain"] == pytest.approx(0.994074)
    assert (g["gain"] > 0).all() and g["definition"].str.contains(r"h\[-2\]").all()


def test_gains_all_rows_and_sources():
    assert len(R.gains(unique=False)) == 26
    assert len(R.gains(source="clean_residual")) == 2
    with pytest.raises(ValueError, match="unknown measurement"):
        R.gains("nope")
    with pytest.raises(ValueError, match="unknown source"):
        R.gains(source="nope")


def test_pythia_family():
    p = R.pythia_family()
    assert list(p["model"]) == PYTHIA
    assert (p["n_prompts"] == 25).all() and (p["std_ddof"] == 0).all()
    assert (p["lab"] == "EleutherAI").all()
    assert list(p["n_layers"]) == [6, 12, 24, 16, 24, 32, 32, 36]
    np.testing.assert_allclose(p["rho"], p["n_heads"].astype(float) / p["d_head"].astype(float))
    assert len(R.pythia_family("residual_gain_with_final_ln")) == 8


def test_lab_survey():
    s = R.lab_survey()
    assert len(s) == 16
    assert s["lab"].value_counts().to_dict() == {"Meta": 5, "EleutherAI": 5, "BigScience": 4,
                                                 "TII": 1, "StabilityAI": 1}
    assert set(s["label"]) == {"EXPAND", "DAMPEN"}
    # The paper's labels are the sign of G - 1.
    assert ((s["gain"] < 1) == (s["label"] == "DAMPEN")).all()


def test_benchmark_and_twins():
    b = R.benchmark()
    assert dict(zip(b["model"], b["gain"].round(2))) == {
        "Gemma-7B": 2.31, "LLaMA-3.1-8B": 1.48, "Mistral-7B": 1.11, "Pythia-6.9B": 0.80}
    t = R.twins()
    assert len(t) == 6
    ft = t[t["base"].notna()]
    assert dict(zip(ft["model"], ft["base"])) == {
        "Mistral-7B-instruct": "Mistral-7B-base", "Gemma-7B-instruct": "Gemma-7B-base",
        "LLaMA-3.1-8B-instruct": "LLaMA-3.1-8B-base"}
    assert set(t.loc[t["base"].isna(), "model"]) == set(ft["base"])


def test_architecture_filled_from_other_rows():
    b = R.benchmark()
    assert b.set_index("model").loc["Gemma-7B", "n_layers"] == 28
    raw = R.gains("last_block_gain_hook", source="benchmark", fill_architecture=False)
    assert pd.isna(raw.set_index("model").loc["Gemma-7B", "n_layers"])


def test_paper_statistics_and_measurements():
    s = R.paper_statistics().set_index("measurement")
    assert s.loc["pearson_r_rho_vs_gain", "value"] == pytest.approx(-0.81163)
    assert s.loc["pearson_p_rho_vs_gain", "value"] == pytest.approx(0.0144381)
    assert s.loc["h25_accuracy", "value"] == pytest.approx(0.4375)
    m = R.measurements()
    assert set(R.GAIN_MEASUREMENTS) <= set(m["measurement"])
    assert m["n_rows"].sum() == 201
