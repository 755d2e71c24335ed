"""Input robustness: per-category gain summaries vs numpy/scipy on the per-prompt values."""

import numpy as np
import pytest
import torch
from scipy import stats

from thermo_lens.core import prompts
from thermo_lens.measures.gain import residual_gain
from thermo_lens.core.model import ModelView
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.measures.robustness import RobustnessResult, input_robustness, robustness_from_gain

torch.set_num_threads(1)  # tiny models on a shared machine: threads only contend


@pytest.fixture(scope="module")
def long_ctx_gpt2(tmp_path_factory):
    """Tiny GPT-2 with a context long enough for the paper's prompts under the tiny tokenizer."""
    from transformer_lens.model_bridge import TransformerBridge

    from thermo_lens.testing import make_checkpoint

    path = make_checkpoint("gpt2", tmp_path_factory.mktemp("gpt2_ctx160"), n_positions=160)
    return TransformerBridge.boot_transformers(str(path))


@pytest.mark.slow
def test_paper25_per_category_equals_numpy(long_ctx_gpt2):
    ps = prompts.get("paper25")
    res = input_robustness(long_ctx_gpt2, token_scope="last", batch_size=13)
    assert res.prompt_set == ps.name and res.categories == ps.categories
    assert res.category_names == ("Factual", "Syntactic", "Cliche", "Novel", "Nonsense")
    assert res.metric == "last_block_gain" == res.gain.regime_by
    # The per-prompt values are the plain gain of the same prompts (gain itself is tested vs HF).
    direct = residual_gain(long_ctx_gpt2, list(ps.prompts), token_scope="last")
    np.testing.assert_array_equal(res.per_prompt(), direct.block_gain[:, -1].double().numpy())
    cats = np.array(ps.categories)
    groups = []
    for cat in res.category_names:
        x = res.per_prompt()[cats == cat]
        groups.append(x)
        s = res.by_category[cat]["last_block_gain"]
        lo, hi = stats.t.interval(0.95, x.size - 1, loc=x.mean(), scale=stats.sem(x))
        assert s.n == 5
        assert s.mean == pytest.approx(x.mean(), rel=1e-12)
        assert s.sd == pytest.approx(np.std(x, ddof=1), rel=1e-12)
        assert s.se == pytest.approx(stats.sem(x), rel=1e-12)
        assert (s.ci_low, s.ci_high) == (pytest.approx(lo, rel=1e-12), pytest.approx(hi, rel=1e-12))
        assert res.category_regimes[cat] in ("expander", "dampener", "neutral")
        # every named summary is there per category
        x_tot = np.asarray(res.gain.total_amplification.values)[cats == cat]
        assert res.by_category[cat]["total_amplification"].mean == pytest.approx(x_tot.mean(), rel=1e-12)
    kw = stats.kruskal(*groups)
    assert res.kruskal_statistic == pytest.approx(kw.statistic) and res.kruskal_pvalue == pytest.approx(kw.pvalue)
    # effect sizes by their formulas: epsilon^2 = H / (n - 1), eta^2_H = (H - k + 1) / (n - k)
    assert res.kruskal_epsilon_squared == pytest.approx(kw.statistic / 24)
    assert res.kruskal_eta_squared_h == pytest.approx((kw.statistic - 4) / 20)
    assert 0.2 < res.kruskal_detectable_eta2 < 0.5 and "not evidence of robustness" in repr(res)
    df = res.to_frame()
    assert len(df) == 25 and list(df["category"]) == list(ps.categories)
    sf = res.summary_frame()
    assert len(sf) == 5 * len(res.gain.summaries) and sf["headline"].sum() == 5
    text = repr(res)
    assert "Factual" in text and "Kruskal-Wallis" in text and "SD(ddof=1)" in text
    back = RobustnessResult.from_json(res.to_json())
    assert back.category_regimes == res.category_regimes
    assert back.by_category["Novel"]["last_block_gain"].mean == res.by_category["Novel"]["last_block_gain"].mean


def test_custom_sets_and_metric(bridge):
    model = bridge("llama_gqa")
    sets = {"short": ["The cat sat", "Water boils"], "long": ["The capital of France is Paris",
                                                            "the early bird catches the worm"]}
    res = input_robustness(model, sets, metric="geometric_mean_gain", token_scope="frobenius")
    assert res.category_names == ("short", "long") and res.metric == "geometric_mean_gain"
    assert res.gain.token_scope == "frobenius" and res.prompt_set == "custom"
    x = np.asarray(res.gain.geometric_mean_gain.values)
    assert res.by_category["long"]["geometric_mean_gain"].mean == pytest.approx(x[2:].mean(), rel=1e-12)
    flat = input_robustness(model, ["The cat sat", "Water boils", "A dog"])
    assert flat.category_names == ("all",) and np.isnan(flat.kruskal_pvalue)
    # the pure function on an existing gain
    g = residual_gain(model, ["a b", "c d", "e f", "g h"])
    r = robustness_from_gain(g, ["x", "x", "y", "y"])
    assert r.by_category["y"]["last_block_gain"].n == 2


def test_bad_input(bridge):
    model = bridge("gpt2")
    with pytest.raises(ThermoLensInputError, match="not a built-in prompt set"):
        input_robustness(model, "paper26")
    with pytest.raises(ThermoLensInputError, match="empty"):
        input_robustness(model, [])
    with pytest.raises(ThermoLensInputError, match="unknown metric"):
        input_robustness(model, metric="biggest")
    with pytest.raises(ThermoLensInputError, match="3 categories for 2 prompts"):
        robustness_from_gain(residual_gain(model, ["a b", "c d"]), ["x", "y", "z"])
    # The paper's prompts exceed the tiny model's 64-token context: a clear error, or truncation.
    n_ctx = ModelView(model).n_ctx
    with pytest.raises(ThermoLensInputError, match=rf"prompt \d+ is \d+ tokens long .* {n_ctx} tokens"):
        input_robustness(model)
    res = input_robustness(model, truncate=True)
    assert any(res.gain.truncated) and "truncated" in repr(res)
