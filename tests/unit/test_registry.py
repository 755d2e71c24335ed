"""The metric registry is the one source of every metric: frames, rows, figures, glossary, docs.

Also: a weight-based head metric is added with one registered function (shown with a test-only
metric), and the registered QK circuit norm has a hand-made known answer under MQA.
"""

import html

import numpy as np
import pytest
import torch

from thermo_lens import definitions
from thermo_lens.core import registry
from thermo_lens.core.registry import Metric, register_head_metric


@pytest.fixture(scope="module")
def measured():
    """A fresh profile and attention panel of an embedded model: every result kind once."""
    import thermo_lens as tl
    from thermo_lens.views import attention_panel

    model = tl.zoo.load("gpt2-tiny-wd")
    prompts = ["The capital of France is Paris", "Water boils at one hundred degrees", "Colorless green ideas"]
    prof = tl.profile(model, prompts, name="gpt2-tiny-wd")
    panel = attention_panel(model, prompts[0], 1, include_js=False)
    # Results outside the profile's battery, one of each.
    extra = {"HeadAblation": tl.head_ablation(model, prompts, 1)}
    return prof, panel, extra


#: Metrics only an attribution with SAEs attached carries (``sae_features=True`` needs sae-lens): their
#: frames are checked on an SAE host in tests/measures/test_sae_features.py, and they are drawn per feature by
#: GainAttribution.plot_features, not by metric_plot.
_NEEDS_SAES = {"sae_feature_term", "sae_feature_rest", "sae_feature_error"}


def _carrier_of(metric, prof, panel, extra):
    if metric.result == "AttentionPanel":
        return panel
    return extra[metric.result] if metric.result in extra else registry.carrier(prof, metric.result)


def test_every_metric_has_a_complete_definition():
    names = [m.name for m in registry.metrics()]
    assert len(names) == len(set(names)) and "qk_norm" in names and "ov_norm" in names
    for m in registry.metrics():
        assert m.symbol and m.formula and m.unit and m.section in registry.SECTIONS, m.name
        assert m.reference.startswith("thermo_lens.definitions §"), m.name


@pytest.mark.slow
def test_every_metric_is_in_its_frame_and_the_profile_row(measured):
    prof, panel, extra = measured
    row = prof.to_row()
    for m in registry.metrics():
        if m.name in _NEEDS_SAES:
            continue
        obj = _carrier_of(m, prof, panel, extra)
        frame = getattr(obj, m.frame)
        frame = frame(**m.frame_kwargs) if callable(frame) else frame
        assert m.frame_column in frame.columns, (m.name, m.frame, list(frame.columns))
        values = np.asarray(frame[m.frame_column], dtype=float)
        assert np.isfinite(values).any(), m.name
        if m.row:
            assert m.row in row, m.name
    # The row's spectral means are the means of the registered tensors.
    assert row["qk_norm"] == pytest.approx(prof.spectral.qk_norm.double().mean().item())


def test_the_panel_is_a_result_that_round_trips(measured):
    _, panel, _ = measured
    from thermo_lens.views import AttentionPanel

    back = AttentionPanel.from_json(panel.to_json())
    assert back.html == panel.html and back.tokens == panel.tokens and torch.equal(back.pattern, panel.pattern)
    assert back.metrics.equals(panel.metrics) and back.settings == panel.settings


@pytest.mark.slow
def test_every_metric_draws_with_its_definition(measured):
    from thermo_lens.views import metric_plot

    prof, panel, extra = measured
    for m in registry.metrics():
        if m.name in _NEEDS_SAES:
            continue
        fig = metric_plot(_carrier_of(m, prof, panel, extra), m.name)
        hovers = " ".join(str(t.hovertemplate) for t in fig.data)
        assert m.formula[:40] in hovers.replace("<br>", " ") or m.formula[:40] in str(fig.layout.title.text), m.name
        shown = np.concatenate([np.ravel(np.asarray(getattr(t, "z", None) if getattr(t, "z", None) is not None
                                                    else t.y, dtype=float)) for t in fig.data])
        assert np.isfinite(shown).any(), m.name


@pytest.mark.slow
def test_every_metric_is_in_the_report_glossary_and_the_docs(measured):
    from thermo_lens.report import render_report

    prof, _, _ = measured
    page, _ = render_report(prof, panel=False)
    glossary = page[page.index('id="definitions"'):]
    for m in registry.metrics():
        assert f"<code>{m.name}</code>" in glossary and html.escape(m.formula) in glossary, m.name
    docs = definitions.text()
    assert definitions.render() == docs, "run `python -m thermo_lens.definitions --write`"
    for m in registry.metrics():
        assert f"| `{m.name}` |" in docs, m.name
    assert definitions.path().name in page  # the report links the shipped page


def test_a_new_head_metric_is_one_registered_function(monkeypatch, bridge):
    """Registering a function is all it takes: the signature computes it, frames and rows carry it."""
    import thermo_lens as tl

    monkeypatch.setattr(registry, "_METRICS", dict(registry._METRICS))

    @register_head_metric(Metric("W_O_second_sv", symbol="sigma_2(W_O)", formula="second singular value of W_O",
                                 shape="layer head", result="SpectralSignature", section="spectral",
                                 unit="weight norm", frame_kwargs={"per": "head"}, row="W_O_second_sv",
                                 weights=("W_O",)))
    def _second(w):
        return torch.linalg.svdvals(w.R_O)[..., 1]

    model = bridge("llama_gqa")
    sig = tl.spectral_signature(model)
    dense = torch.linalg.svdvals(tl.ModelView(model).W_O(torch.float64))[..., 1]
    torch.testing.assert_close(sig.W_O_second_sv.double(), dense, rtol=1e-5, atol=1e-7)
    assert "W_O_second_sv" in sig.to_frame().columns and "W_O_second_sv" in sig.definitions


def test_qk_norm_known_answer_under_multi_query_attention():
    """W_Q^h W_K^T = diag(3 s_h, 2, 0, ...) by construction: sigma_max = max(3 s_h, 2)."""
    from thermo_lens.measures.spectral import signature_from_weights

    d_model, d_head, H = 6, 2, 3
    W_K = torch.zeros(1, 1, d_model, d_head, dtype=torch.float64)  # one KV head (MQA)
    W_K[0, 0, 0, 0], W_K[0, 0, 1, 1] = 1.0, 2.0
    scales = [0.5, 1.0, 2.0]
    W_Q = torch.zeros(1, H, d_model, d_head, dtype=torch.float64)
    for h, s in enumerate(scales):
        W_Q[0, h, 0, 0], W_Q[0, h, 1, 1] = 3.0 * s, 1.0
    W_V = torch.randn(1, 1, d_model, d_head, dtype=torch.float64)
    W_O = torch.randn(1, H, d_head, d_model, dtype=torch.float64)
    sig = signature_from_weights(W_V, W_O, W_Q=W_Q, W_K=W_K, dtype=torch.float64)
    want = [max(3.0 * s, 2.0) for s in scales]
    torch.testing.assert_close(sig.qk_norm[0], torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    without = signature_from_weights(W_V, W_O, dtype=torch.float64)
    assert "qk_norm" not in without.head_metrics
    with pytest.raises(AttributeError, match="qk_norm was not computed.*W_Q and W_K"):
        _ = without.qk_norm
    from thermo_lens.core.errors import ThermoLensInputError

    with pytest.raises(ThermoLensInputError, match="both W_Q and W_K"):
        signature_from_weights(W_V, W_O, W_Q=W_Q)
    with pytest.raises(ThermoLensInputError, match="W_K has shape"):
        signature_from_weights(W_V, W_O, W_Q=W_Q, W_K=W_K.expand(1, 3, d_model, d_head))


def test_results_are_made_from_a_pass_by_their_classes_and_the_old_names_still_work(bridge):
    import thermo_lens as tl
    from thermo_lens.measures.anisotropy import AnisotropyResult, anisotropy, anisotropy_from_collected
    from thermo_lens.measures.attribution import GainAttribution, attribution_from_collected, attribution_terms
    from thermo_lens.measures.gain import GainResult, gain_from_collected, residual_norms
    from thermo_lens.core.passes import collect
    from thermo_lens.measures.sheaf.traces import SheafTraces, attention_diagonal, traces_from_collected

    model = bridge("gpt2")
    prompts = ["The capital of France is Paris", "Water boils at one hundred degrees"]
    got = collect(model, prompts, [residual_norms, anisotropy, attention_diagonal, attribution_terms("last")],
                  progress=False)
    ran = tl.run(model, prompts, {"gain": {"token_scope": "last"}, "anisotropy": {}, "sheaf": {},
                                  "attribution": {"token_scope": "last"}}, progress=False)
    for cls, old, args, name, field in (
            (GainResult, gain_from_collected, ("last",), "gain", "block_gain"),
            (AnisotropyResult, anisotropy_from_collected, (), "anisotropy", "values"),
            (SheafTraces, traces_from_collected, (), "sheaf", "trace"),
            (GainAttribution, attribution_from_collected, ("last",), "attribution", "head")):
        new = cls.from_collected(got, *args)
        assert isinstance(new, cls) and registry.measurement(name).result is cls
        torch.testing.assert_close(getattr(new, field), getattr(ran[name], field), rtol=1e-6, atol=1e-9)
        assert torch.equal(getattr(old(got, *args), field), getattr(new, field))  # the old name: an alias


def test_a_too_short_prompt_is_named_with_the_scope_that_needs_two_tokens(bridge):
    import thermo_lens as tl
    from thermo_lens.core.errors import PromptTooShortError

    model = bridge("gpt2")
    with pytest.raises(PromptTooShortError, match=r"token_scope='all_but_first' \(gain, write_norm\) excludes position 0"):
        tl.run(model, torch.tensor([[46]]), ["gain", "write_norm", "sheaf"])
    assert tl.run(model, torch.tensor([[46]]), ["gain"], token_scope="last").gain.n_prompts == 1
    with pytest.raises(PromptTooShortError, match="needs at least 2.*excludes position 0"):
        tl.run(model, torch.tensor([[46]]), {"gain": {"token_scope": "all_but_first"}})


def test_results_are_found_by_type_not_by_the_name_of_their_class():
    from types import SimpleNamespace

    import thermo_lens.views  # noqa: F401 - registers the figures' metrics (AttentionPanel)
    from thermo_lens.core import registry
    from thermo_lens.core.result import Result

    for name in ("GainResult", "AttentionPanel"):  # a measurement's result, and a result no measurement makes
        real = registry.result_type(name)
        assert isinstance(real, type) and issubclass(real, Result) and real.__name__ == name
        impostor = type(name, (), {})()  # another class of the same name (not a Result: it registers nothing)
        with pytest.raises(TypeError, match=f"holds no {name}"):
            registry.carrier(SimpleNamespace(results={"x": impostor}), name)
        assert registry.metrics(result=type(impostor)) == ()
        assert registry.metrics(result=real) == registry.metrics(result=name) != ()
    with pytest.raises(TypeError, match="no result class 'NoSuchResult'"):
        registry.carrier(SimpleNamespace(), "NoSuchResult")
