"""The heritage lab on a micro recipe: spec errors, matched arms, statistics against scipy."""

from __future__ import annotations

import dataclasses as dc
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from thermo_lens.experiments import lab
from thermo_lens.experiments.lab.architecture import (Architecture, ArchitectureError, build_model, from_canonical, init_model, to_canonical)
from thermo_lens.experiments.lab.recipe import KNOBS, LabSpecError, Recipe
from thermo_lens.experiments.lab.spec import parse_lab_spec

MICRO = Path(__file__).parents[1] / "data" / "lab_micro.toml"
MICRO_BASE = dict(n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=32, block_size=16, batch_size=4,
                  vocab_size=320, steps=6, warmup_steps=2)


def _spec(knobs, base=None, **lab_kw):
    return parse_lab_spec({"lab": {"seeds": [1, 2], **lab_kw}, "base": dict(MICRO_BASE, **(base or {})),
                           "knobs": knobs})


# ---------------------------------------------------------------------------- spec errors
def test_unknown_knob_names_it_and_lists_valid_knobs():
    with pytest.raises(LabSpecError) as ei:
        _spec({"weight_dekay": [0.1, 0.0]})
    msg = str(ei.value)
    assert "'weight_dekay'" in msg
    for k in KNOBS:
        assert k in msg


@pytest.mark.parametrize("knob,levels,bad", [
    ("optimizer", ["adamw-b2=0.95", "adam"], "'adam'"),
    ("positions", ["learned", "alibi"], "'alibi'"),
    ("norm", ["pre", "sandwich"], "'sandwich'"),
    ("data", ["stdlib-docstrings", "wikipedia"], "'wikipedia'"),
])
def test_unknown_categorical_level_names_it_and_lists_levels(knob, levels, bad):
    with pytest.raises(LabSpecError) as ei:
        _spec({knob: levels})
    msg = str(ei.value)
    assert f"knob {knob!r}" in msg and bad in msg
    for valid in KNOBS[knob].choices:
        assert repr(valid) in msg


@pytest.mark.parametrize("knob,levels,bad", [("weight_decay", [0.1, -1.0], "-1.0"), ("lr", [0.003, 0], "0"),
                                             ("warmup_steps", [30, 2.5], "2.5"), ("init_scale", [1.0, "big"], "'big'")])
def test_bad_numeric_level(knob, levels, bad):
    with pytest.raises(LabSpecError, match=rf"knob '{knob}': bad level {bad}; valid levels: "):
        _spec({knob: levels})


def test_levels_must_include_the_reference():
    with pytest.raises(LabSpecError, match=r"knob 'weight_decay': levels \[0.0, 0.01\] must include the base's value 0.1"):
        _spec({"weight_decay": [0.0, 0.01]})


def test_inexpressible_architecture_is_named():
    with pytest.raises(LabSpecError, match=r"knob 'attention' level 'parallel': learned positions with parallel attention"):
        _spec({"attention": ["sequential", "parallel"]})
    with pytest.raises(LabSpecError, match=r"knob 'norm' level 'post': rotary positions with post-LN"):
        _spec({"norm": {"levels": ["pre", "post"], "context": {"positions": "rotary"}}})
    with pytest.raises(LabSpecError, match=r"knob 'norm' level 'post': post-LN needs embed_proj_dim > 0"):
        _spec({"norm": ["pre", "post"]})
    with pytest.raises(LabSpecError, match=r"knob 'norm': context field 'embed_dim': unknown recipe field"):
        _spec({"norm": {"levels": ["pre", "post"], "context": {"embed_dim": 8}}})


def test_unknown_base_field_and_lab_field():
    with pytest.raises(LabSpecError, match=r"field 'base.n_layer': unknown recipe field; valid: n_layers"):
        _spec({}, base={"n_layer": 2})
    with pytest.raises(LabSpecError, match=r"field 'lab.seed': unknown"):
        _spec({}, seed=3)
    with pytest.raises(LabSpecError, match=r"knob 'optimizer': unknown level 'sgd'"):
        _spec({}, base={"optimizer": "sgd"})


def test_spec_file_errors_carry_file_and_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(MICRO.read_text().replace("weight_decay = [0.1, 0.0]", "wieght_decay = [0.1, 0.0]"))
    with pytest.raises(LabSpecError) as ei:
        lab.load_lab_spec(bad)
    line = next(i + 1 for i, l in enumerate(bad.read_text().splitlines()) if l.startswith("wieght_decay"))
    assert str(ei.value).startswith(f"{bad}:{line}: unknown knob 'wieght_decay'")


def test_cli_reports_a_bad_knob_without_traceback(tmp_path, capsys):
    from thermo_lens.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text(MICRO.read_text().replace('levels = ["sequential", "parallel"]', 'levels = ["sequential", "paralel"]'))
    assert main(["lab", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "knob 'attention': unknown level 'paralel'; valid levels: 'sequential', 'parallel'" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_arms_and_comparisons_of_the_micro_spec():
    spec = lab.load_lab_spec(MICRO)
    arms = {a.id: a for a in spec.arms()}
    assert list(arms) == ["base", "weight_decay=0", "attention=sequential+positions=rotary",
                          "attention=parallel+positions=rotary"]
    for knob, ref_level, level, ref_arm, arm in spec.comparisons():
        # exactly one recipe field differs between an arm and its reference arm
        assert arms[ref_arm].recipe.differences(arms[arm].recipe) == {KNOBS[knob].field: (ref_level, level)}
    assert arms["attention=parallel+positions=rotary"].recipe.architecture().family == "gpt_neox"


def test_shared_recipes_are_one_arm():
    spec = _spec({"positions": ["learned", "rotary"],
                  "attention": {"levels": ["sequential", "parallel"], "context": {"positions": "rotary"}}})
    ids = [a.id for a in spec.arms()]
    assert ids == ["base", "positions=rotary", "attention=parallel+positions=rotary"]
    assert spec.comparisons()[1][3] == "positions=rotary"  # the rotary arm is the attention knob's reference


# ---------------------------------------------------------------------------- matched initial weights
V = 40


def _logits(model, x):
    model.eval()
    with torch.no_grad():
        return model(input_ids=x).logits


def test_gpt2_and_opt_pre_ln_compute_the_same_function():
    """The canonical form is faithful: GPT-2 weights written into OPT (pre-LN) give the same logits."""
    base = Architecture(n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=16)
    gpt2 = init_model(base, base, seed=3, vocab_size=V, special_id=0)
    canon = to_canonical(gpt2, base)
    canon["wpe_opt_pad"] = torch.randn(2, 16)
    import transformers

    cfg = transformers.OPTConfig(vocab_size=V, num_hidden_layers=2, hidden_size=16, num_attention_heads=2, ffn_dim=32,
                                 max_position_embeddings=16, word_embed_proj_dim=16, do_layer_norm_before=True,
                                 activation_function="gelu_new", dropout=0.0, pad_token_id=0)
    cfg._attn_implementation = "eager"
    opt = transformers.OPTForCausalLM(cfg)
    import thermo_lens.experiments.lab.architecture as A

    orig = A.family_of
    A.family_of = lambda a: "opt"
    try:
        from_canonical(opt, base, canon)
    finally:
        A.family_of = orig
    x = torch.randint(0, V, (2, 12))
    torch.testing.assert_close(_logits(opt, x), _logits(gpt2, x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("change", [dict(positions="rotary"), dict(positions="rotary", attention="parallel"),
                                    dict(embeddings="untied"), dict(embed_proj_dim=8)])
def test_matched_initial_weights_across_families(change):
    base = Architecture(n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=16)
    arm = dc.replace(base, **change)
    b = to_canonical(init_model(base, base, seed=5, vocab_size=V, special_id=0), base)
    m = init_model(arm, base, seed=5, vocab_size=V, special_id=0)
    a = to_canonical(m, arm)
    shared = {k for k in set(a) & set(b) if a[k].shape == b[k].shape}
    assert shared >= {"0.W_qkv", "1.W_out", "0.ln1.w", "wpe" if arm.positions == "learned" else "lnf.w"}
    assert ("wte" in shared) == (arm.embed_proj_dim == 0)  # OPT-350m layout: embeddings in another space
    for k in shared:
        assert torch.equal(a[k], b[k]), k
    # every parameter of the arm was written (none left at the arm family's own random init)
    again = to_canonical(init_model(arm, base, seed=5, vocab_size=V, special_id=0), arm)
    assert all(torch.equal(again[k], a[k]) for k in a)
    # the canonical form round-trips through the arm's family
    fresh = build_model(arm, V, 0)
    pad = m.state_dict()["model.decoder.embed_positions.weight"][:2] if arm.family == "opt" else None
    from_canonical(fresh, arm, {**a, "wpe_opt_pad": pad})
    assert all(torch.equal(p, q) for p, q in zip(fresh.state_dict().values(), m.state_dict().values()))


def test_post_ln_arm_matches_its_pre_ln_reference():
    """Pre- and post-LN in the OPT-350m layout share every weight (post-LN has no final norm)."""
    base = Architecture(n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=16)
    pre, post = dc.replace(base, embed_proj_dim=8), dc.replace(base, embed_proj_dim=8, norm="post")
    a = to_canonical(init_model(pre, base, seed=2, vocab_size=V, special_id=0), pre)
    b = to_canonical(init_model(post, base, seed=2, vocab_size=V, special_id=0), post)
    assert set(a) - set(b) == {"lnf.w", "lnf.b"} and set(b) <= set(a)
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert pre.family == post.family == "opt"


def test_init_scale_scales_matrices_only():
    base = Architecture(n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=16)
    b = to_canonical(init_model(base, base, seed=1, vocab_size=V, special_id=0), base)
    s = to_canonical(init_model(base, base, seed=1, vocab_size=V, special_id=0, init_scale=2.0), base)
    for k in b:
        torch.testing.assert_close(s[k], b[k] * (2.0 if b[k].ndim >= 2 else 1.0), rtol=0, atol=0)


def test_seeds_differ():
    base = Architecture(n_layers=1, d_model=16, n_heads=2, d_mlp=32, n_ctx=16)
    a = to_canonical(init_model(base, base, seed=1, vocab_size=V, special_id=0), base)
    b = to_canonical(init_model(base, base, seed=2, vocab_size=V, special_id=0), base)
    assert not torch.equal(a["wte"], b["wte"])


def test_architecture_errors():
    with pytest.raises(ArchitectureError, match="learned positions with parallel attention"):
        _ = Architecture(attention="parallel").family


# ---------------------------------------------------------------------------- training: same batches
def _weights(run_dir, step):
    from safetensors.torch import load_file

    return load_file(str(Path(run_dir) / f"step_{step:06d}" / "model.safetensors"))


@pytest.mark.slow
def test_weight_decay_arms_share_init_and_first_batch(tmp_path):
    """After one AdamW step from the same weights on the same batch, two arms that differ only in
    weight decay differ by exactly the decay term -lr * wd * W_0 (on matrices; nothing else)."""
    from thermo_lens.experiments.lab.train import lr_at, train_run

    base = Recipe(**dict(MICRO_BASE, steps=1, warmup_steps=1))
    nowd = dc.replace(base, weight_decay=0.0)
    cache = tmp_path / "tok"
    train_run(base, 7, tmp_path / "wd", n_checkpoints=2, tokenizer_cache=cache)
    train_run(nowd, 7, tmp_path / "nowd", base=base, n_checkpoints=2, tokenizer_cache=cache)
    w0, w1 = _weights(tmp_path / "wd", 0), _weights(tmp_path / "nowd", 0)
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)  # same initial weights
    a, b = _weights(tmp_path / "wd", 1), _weights(tmp_path / "nowd", 1)
    lr = lr_at(0, base)
    for k in a:
        expected = -lr * base.weight_decay * w0[k] if w0[k].ndim >= 2 else torch.zeros_like(w0[k])
        torch.testing.assert_close(a[k] - b[k], expected, rtol=0, atol=1e-7, msg=k)
    assert any(not torch.equal(a[k], w0[k]) for k in a)  # it did train


@pytest.mark.slow
def test_batches_do_not_depend_on_the_arm(tmp_path, monkeypatch):
    """The data generator's draws are the same for every arm on a corpus (recorded at each step)."""
    import thermo_lens.experiments.lab.train as T

    seen: dict[str, list] = {}
    real = T.batch_offsets

    def spy(n_tokens, batch_size, block_size, generator):
        out = real(n_tokens, batch_size, block_size, generator)
        seen.setdefault(current, []).append((n_tokens, out.clone()))
        return out

    monkeypatch.setattr(T, "batch_offsets", spy)
    base = Recipe(**dict(MICRO_BASE, steps=3))
    for current, r in [("base", base), ("rotary", dc.replace(base, positions="rotary")),
                       ("sgd", dc.replace(base, optimizer="sgd-momentum")),
                       ("post", dc.replace(base, norm="post", embed_proj_dim=8)),
                       ("untied", dc.replace(base, embeddings="untied", init_scale=0.5)),
                       ("code", dc.replace(base, data="stdlib-code"))]:
        T.train_run(r, 4, tmp_path / current, base=base, n_checkpoints=2, tokenizer_cache=tmp_path / "tok")
    assert len(seen["base"]) == 3
    for arm in ("rotary", "sgd", "post", "untied"):
        assert all(h1 == h2 and torch.equal(x1, x2) for (h1, x1), (h2, x2) in zip(seen["base"], seen[arm]))
    # another corpus: a different stream length, so different windows, but the same budget
    assert len(seen["code"]) == 3 and seen["code"][0][0] != seen["base"][0][0]


def test_checkpoint_steps_are_log_spaced():
    from thermo_lens.experiments.lab.train import checkpoint_steps

    assert checkpoint_steps(1000, 8) == [0, 1, 3, 10, 32, 100, 316, 1000]
    assert checkpoint_steps(6, 3) == [0, 1, 6]
    assert checkpoint_steps(5, 1) == [5]


def test_corpora_are_fixed_files():
    from thermo_lens import zoo
    from thermo_lens.experiments.lab import corpora

    a = corpora.load("stdlib-docstrings")
    # the embedded zoo was trained on exactly this text
    assert a.text_sha256 == zoo.info("gpt2-tiny-wd")["corpus"]["sha256"]
    assert len(a.documents) == zoo.info("gpt2-tiny-wd")["corpus"]["n_documents"]
    assert a.n_val_documents == zoo.info("gpt2-tiny-wd")["corpus"]["n_val_documents"]
    b = corpora.load("stdlib-code")
    assert b.documents[0].startswith(("def ", "class ", "async def ", "@"))
    assert corpora.names() == ["stdlib-code", "stdlib-docstrings"]
    with pytest.raises(corpora.CorpusError, match="unknown corpus 'wiki'; available: stdlib-code, stdlib-docstrings"):
        corpora.load("wiki")


# ---------------------------------------------------------------------------- statistics vs scipy
def _exact_sign_flip_p(d):
    d = np.asarray(d, float)
    obs = abs(d.mean())
    stats = [abs((d * np.array(s)).mean()) for s in itertools.product([1, -1], repeat=len(d))]
    return np.mean([s >= obs - 1e-12 for s in stats])


@pytest.mark.parametrize("ref,lev", [
    ([1.0, 1.1, 0.9, 1.05, 1.02], [1.2, 1.3, 1.0, 1.25, 1.1]),      # all positive: p = 2/32
    ([0.9, 1.1, 1.0], [1.0, 1.0, 1.05]),                            # mixed signs
    ([2.0, 2.0, 2.0, 2.0], [2.5, 1.5, 2.25, 1.9]),
])
def test_paired_effect_matches_scipy(ref, lev):
    from scipy import stats

    from thermo_lens.experiments.lab.effects import paired_effect

    e = paired_effect(ref, lev)
    d = np.asarray(lev) - np.asarray(ref)
    assert e.n == len(d)
    assert e.effect == pytest.approx(d.mean())
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert (e.ci_low, e.ci_high) == (pytest.approx(lo), pytest.approx(hi))
    assert e.pvalue == pytest.approx(_exact_sign_flip_p(d))
    ref_res = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf)
    assert e.pvalue == pytest.approx(ref_res.pvalue)
    assert e.min_pvalue == pytest.approx(2 / 2 ** len(d))


def test_paired_effect_known_values():
    from thermo_lens.experiments.lab.effects import paired_effect

    e = paired_effect([0, 0, 0, 0, 0], [1, 2, 3, 4, 5])
    assert e.effect == 3.0 and e.pvalue == pytest.approx(2 / 32)
    assert paired_effect([1, 1], [1, 1]).pvalue == 1.0
    assert np.isnan(paired_effect([1.0], [2.0]).ci_low)
    with pytest.raises(ValueError, match="aligned by seed"):
        paired_effect([1, 2], [1, 2, 3])


def test_effects_frame_pairs_by_seed_and_flags_flips():
    import pandas as pd

    from thermo_lens.experiments.lab.effects import effects_frame

    rows = []
    for arm, gains in (("base", [0.9, 0.95, 0.92]), ("wd=0", [1.1, 1.05, 0.99])):
        for seed, g in zip((1, 2, 3), gains):
            for step, scale in ((0, 1.0), (10, g)):
                rows.append({"arm": arm, "seed": seed, "step": step, "run": f"{arm}-{seed}", "last_block_gain": scale,
                             "W_V_W_O_ratio": 2.0 * scale, "val_loss": 5.0})
    runs = pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # order must not matter
    eff = effects_frame(runs, [("weight_decay", 0.1, 0.0, "base", "wd=0")],
                        metrics=("last_block_gain", "W_V_W_O_ratio", "val_loss"))
    g = eff.set_index("metric").loc["last_block_gain"]
    assert g["effect"] == pytest.approx(np.mean([0.2, 0.1, 0.07]))
    assert g["n_seeds"] == 3 and g["step"] == 10
    assert g["flips_regime"] is True or g["flips_regime"] == True  # noqa: E712 - numpy bool
    assert g["seeds_flipped"] == 2                                   # seed 3 stays below 1
    assert pd.isna(eff.set_index("metric").loc["W_V_W_O_ratio", "flips_regime"])
    assert eff.set_index("metric").loc["val_loss", "pvalue"] == 1.0


# ---------------------------------------------------------------------------- the micro lab end to end
@pytest.fixture(scope="module")
def micro_lab(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab") / "micro"
    outcome = lab.run_lab(MICRO, out, report=False)
    return out, outcome


@pytest.mark.slow
def test_micro_lab_tables(micro_lab):
    import pandas as pd

    out, outcome = micro_lab
    assert outcome.ok, outcome.failed
    runs = pd.read_csv(out / "runs.csv")
    for col in ("knob", "level", "seed", "step", "val_loss", "last_block_gain", "penultimate_gain", "W_V_W_O_ratio"):
        assert col in runs.columns
    assert len(runs) == 4 * 2 * 3  # arms x seeds x checkpoints (0, 1, 6)
    assert sorted(runs["step"].unique()) == [0, 1, 6]
    eff = pd.read_csv(out / "effects.csv")
    for col in ("knob", "metric", "effect", "ci_low", "ci_high", "pvalue", "n_seeds", "flips_regime"):
        assert col in eff.columns
    assert set(eff["knob"]) == {"weight_decay", "attention"} and set(eff["n_seeds"]) == {2}
    # the step-0 profiles of the weight-decay pair are of identical models
    s0 = runs.loc[runs["step"] == 0].set_index(["arm", "seed"])
    for seed in (1, 2):
        assert s0.loc[("base", seed), "last_block_gain"] == s0.loc[("weight_decay=0", seed), "last_block_gain"]
    assert (out / "figures" / "effects.html").is_file()


@pytest.mark.slow
def test_micro_lab_profiles_match_a_fresh_profile(micro_lab):
    """A stored checkpoint profile equals profile() of that checkpoint booted by the user."""
    from transformer_lens.model_bridge import TransformerBridge

    import thermo_lens
    from thermo_lens.experiments.study import load_profiles

    out, _ = micro_lab
    profs = load_profiles(out / "profiles")
    key = "base__seed1__step000006"
    stored = profs[key]
    ckpt = out / stored.meta["source"]
    bridge = TransformerBridge.boot_transformers(str(ckpt))
    fresh = thermo_lens.profile(bridge, json.loads(json.dumps(lab.load_lab_spec(MICRO).prompts)), batch_size=4)
    assert fresh.gain.last_block_gain.mean == pytest.approx(stored.gain.last_block_gain.mean, rel=1e-6)
    assert stored.meta["lab"]["val_loss"] == json.loads((ckpt / "metrics.json").read_text())["val_loss"]


@pytest.mark.slow
def test_micro_lab_rerun_skips_everything(micro_lab):
    out, first = micro_lab
    again = lab.run_lab(MICRO, out, report=False)
    assert again.trained == () and again.profiled == ()
    assert len(again.skipped) == len(first.trained) + len(first.profiled)


@pytest.mark.slow
def test_micro_lab_report_has_the_lab_section(micro_lab):
    from thermo_lens.experiments.lab.report_section import lab_dir_of, lab_section
    from thermo_lens.report import render_report

    out, _ = micro_lab
    assert lab_dir_of(out / "train") == out  # what `thermo-lens report` uses to add the section
    page, ids = render_report(out / "train", panel=False, sections=[lab_section(out)])
    assert {"fig-lab-effects", "fig-lab-last_block_gain", "fig-lab-penultimate_gain"} <= set(ids)
    assert 'id="heritage-lab"' in page and "Toy scale" in page


@pytest.mark.slow
def test_ray_executor_matches_local(micro_lab, tmp_path):
    """The grid on Ray trains and profiles the same models as the local executor, bit for bit."""
    ray = pytest.importorskip("ray")
    import pandas as pd

    out, _ = micro_lab
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = lab.run_lab(MICRO, tmp_path / "ray", executor="ray", report=False)
    finally:
        ray.shutdown()
    assert remote.ok, remote.failed
    cols = ["arm", "seed", "step", "val_loss", "last_block_gain", "penultimate_gain", "W_V_W_O_ratio"]
    a = pd.read_csv(out / "runs.csv")[cols]
    b = pd.read_csv(tmp_path / "ray" / "runs.csv")[cols]
    pd.testing.assert_frame_equal(a, b)
    from thermo_lens.experiments.study import read_manifest

    assert read_manifest(tmp_path / "ray" / "train")["study"]["executor"] == "ray"


def test_unknown_prompt_set_is_a_spec_error():
    with pytest.raises(LabSpecError, match=r"field 'lab.prompts': 'paper26' is not a built-in prompt set"):
        _spec({}, prompts="paper26")


@pytest.mark.slow
def test_a_lab_without_knobs_writes_its_tables(tmp_path):
    """One arm (e.g. a zoo rebuild): runs.csv and trajectories, an empty effects.csv, no error."""
    import pandas as pd

    spec = parse_lab_spec({"lab": {"seeds": [1], "checkpoints": 2, "prompts": ["The cat sat on the mat."]},
                           "base": dict(MICRO_BASE, steps=2), "knobs": {}})
    out = lab.run_lab(spec, tmp_path / "one", report=False)
    assert out.ok, out.failed
    assert len(pd.read_csv(tmp_path / "one" / "runs.csv")) == 2
    assert len(pd.read_csv(tmp_path / "one" / "effects.csv")) == 0
    assert not (tmp_path / "one" / "figures" / "effects.html").exists()
