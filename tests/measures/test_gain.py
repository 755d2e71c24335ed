"""Residual gain vs independent computations.

References: HF ``output_hidden_states`` of the same local checkpoint (one prompt at a time, no
padding, tokenized with the checkpoint's own tokenizer) with x_L taken by a plain torch forward
hook on the HF model's last block; numpy float64 per-token / Frobenius norms; hand-made weights
with known gains (identity blocks; BERT LayerNorm weights that fix every norm).
"""

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples

from conftest import ARCHS
from thermo_lens.measures.gain import (
    SUMMARIES,
    GainResult,
    gain_from_collected,
    regime_from_summary,
    residual_gain,
    scope_ratio,
)
from thermo_lens.paper.metrics import PAPER_METRICS, paper_metric
from thermo_lens.core.tokens import TOKEN_SCOPES
from thermo_lens.core.passes import collect
from thermo_lens.measures.gain import residual_norms
from thermo_lens.core.errors import ThermoLensNumericsError
from thermo_lens.core.model import ModelView
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.stats import summarize
from thermo_lens.core.tokens import encode

# Tiny models on a shared 2-core machine: extra intra-op threads only contend (5x slower).
torch.set_num_threads(1)

PROMPTS = [
    "The capital of France is Paris",
    "Water",
    "the early bird catches the worm, and the cat sat",
    "Colorless green ideas sleep",
]

# Where each architecture keeps its list of blocks in the HF model.
HF_BLOCKS = {
    "gpt2": "transformer.h", "neox": "gpt_neox.layers", "opt": "model.decoder.layers",
    "opt_postln": "model.decoder.layers", "llama_gqa": "model.layers", "gemma": "model.layers",
    "gptj": "transformer.h", "bert": "bert.encoder.layer", "bloom": "transformer.h",
    "falcon": "transformer.h",
}


@functools.lru_cache(maxsize=None)
def hf_tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def hf_ids(checkpoint_dir, arch, prompt, bos=True):
    tok = hf_tokenizer(str(checkpoint_dir(arch)))
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    return ([tok.bos_token_id] if bos else []) + list(ids)


def hf_states(arch, hf, ids, pre_hooks=()):
    """x_0..x_L of one unpadded prompt from HF: hidden_states[l] (l < L) and a hook for x_L.

    Also checks which hidden_states entries are block inputs, and returns HF's last entry.
    """
    blocks = hf.get_submodule(HF_BLOCKS[arch])
    L = len(blocks)
    inputs, last = {}, {}

    def pre(i):
        def fn(mod, args, kwargs):
            inputs[i] = (args[0] if args else kwargs["hidden_states"]).detach()
        return fn

    def post(mod, args, out):
        last["x"] = (out[0] if isinstance(out, tuple) else out).detach()

    handles = [b.register_forward_pre_hook(pre(i), with_kwargs=True) for i, b in enumerate(blocks)]
    handles.append(blocks[L - 1].register_forward_hook(post))
    handles += [mod.register_forward_pre_hook(fn) for mod, fn in pre_hooks]
    try:
        with torch.no_grad():
            ids_t = torch.tensor([ids])
            out = hf(input_ids=ids_t, attention_mask=torch.ones_like(ids_t), output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    hs = out.hidden_states
    assert len(hs) == L + 1
    for l in range(L):  # hidden_states[l] is the input of block l, i.e. x_l
        torch.testing.assert_close(hs[l], inputs[l], rtol=0, atol=0)
    xs = [hs[l][0].double() for l in range(L)] + [last["x"][0].double()]
    return xs, hs[L][0]


def ref_ratio(xa, xb, scope):
    """Independent token-scope ratio from the states themselves (numpy float64)."""
    a, b = xa.numpy(), xb.numpy()
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    if scope == "last":
        return nb[-1] / na[-1]
    if scope == "all_but_first":
        return float(np.mean(nb[1:] / na[1:]))
    if scope == "all":
        return float(np.mean(nb / na))
    assert scope == "frobenius"
    return np.linalg.norm(b) / np.linalg.norm(a)  # matrix Frobenius norms


def ref_gains(xs, scope):
    L = len(xs) - 1
    block = np.array([ref_ratio(xs[l - 1], xs[l], scope) for l in range(1, L + 1)])
    total = ref_ratio(xs[0], xs[L], scope)
    return block, total


@pytest.mark.parametrize("arch", ARCHS)
def test_gain_equals_hf_hidden_states(arch, bridge, hf_model, checkpoint_dir):
    view = ModelView(bridge(arch))
    hf = hf_model(arch)
    # One padded pass (batch_size=3: two batches of different widths), every scope derived from it.
    collected = collect(view, PROMPTS, [residual_norms], prepend_bos=True, batch_size=3)
    L = view.n_layers
    refs = {s: [] for s in TOKEN_SCOPES}
    for p, prompt in enumerate(PROMPTS):
        ids = hf_ids(checkpoint_dir, arch, prompt)
        assert len(ids) == int(collected.lengths[p])
        xs, hf_last = hf_states(arch, hf, ids)
        # HF's last hidden state is the final-normed state (OPT-350m style: also projected out),
        # except for BERT, which has no final norm: never use it as x_L.
        same = hf_last.shape == xs[L].shape and torch.allclose(hf_last.double(), xs[L], atol=1e-5)
        assert same == (arch == "bert")
        with np.errstate(divide="ignore", invalid="ignore"):
            for s in TOKEN_SCOPES:
                refs[s].append(ref_gains(xs, s))
    for s in TOKEN_SCOPES:
        block = np.stack([b for b, _ in refs[s]])
        total = np.array([t for _, t in refs[s]])
        if not (np.isfinite(block).all() and np.isfinite(total).all()):
            # The tiny LLaMA/Gemma use PAD (zero embedding) as BOS: x_0[0] = 0, the ratio at
            # position 0 is undefined, and thermo-lens says so instead of returning inf/NaN.
            assert s == "all" and arch in ("llama_gqa", "gemma")
            with pytest.raises(ThermoLensNumericsError, match=r"zero norm at position\(s\) \[0\]"):
                gain_from_collected(collected, s)
            continue
        res = gain_from_collected(collected, s)
        assert res.block_gain.dtype == torch.float32 and res.block_gain.shape == (len(PROMPTS), L)
        np.testing.assert_allclose(res.block_gain.numpy(), block, rtol=2e-5, err_msg=f"{arch} {s}")
        vals = {k: np.asarray(v.values) for k, v in res.summaries.items()}
        np.testing.assert_allclose(vals["last_block_gain"], block[:, L - 1], rtol=2e-5)
        np.testing.assert_allclose(vals["penultimate_gain"], block[:, L - 2], rtol=2e-5)
        np.testing.assert_allclose(vals["first_block_gain"], block[:, 0], rtol=2e-5)
        np.testing.assert_allclose(vals["max_block_gain"], block.max(axis=1), rtol=2e-5)
        np.testing.assert_allclose(vals["total_amplification"], total, rtol=2e-5)
        np.testing.assert_allclose(vals["geometric_mean_gain"], total ** (1 / L), rtol=2e-5)
        if s in ("last", "frobenius"):  # the ratios telescope
            np.testing.assert_allclose(vals["total_amplification"], block.prod(axis=1), rtol=1e-4)
        assert res.token_scope == s and res.post_ln == (arch in ("bert", "opt_postln"))
    # The convenience function is the same computation.
    direct = residual_gain(view, PROMPTS, batch_size=3, prepend_bos=True)
    abf = gain_from_collected(collected, "all_but_first")
    torch.testing.assert_close(direct.block_gain, abf.block_gain, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa", "bert", "bloom"])
def test_batched_with_padding_equals_one_at_a_time(arch, bridge):
    view = ModelView(bridge(arch))
    batched = collect(view, PROMPTS, [residual_norms], prepend_bos=True, batch_size=4)
    single = [collect(view, [p], [residual_norms], prepend_bos=True) for p in PROMPTS]
    for scope in ("last", "all_but_first", "frobenius"):
        b = gain_from_collected(batched, scope, per_token=True)
        for p in range(len(PROMPTS)):
            one = gain_from_collected(single[p], scope, per_token=True)
            torch.testing.assert_close(b.block_gain[p], one.block_gain[0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(b.norms[p], one.norms[0], rtol=1e-5, atol=1e-6)
            n = int(b.lengths[p])
            torch.testing.assert_close(b.per_token_gain[p, :, :n], one.per_token_gain[0],
                                       rtol=1e-5, atol=1e-6, equal_nan=True)
            assert torch.isnan(b.per_token_gain[p, :, n:]).all()  # padding holds no number


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_model_gives_float32_norms(dtype, bridge, checkpoint_dir):
    from transformer_lens.model_bridge import TransformerBridge

    low = TransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")), dtype=dtype)
    got = residual_gain(low, PROMPTS, per_token=True)
    ref = residual_gain(bridge("gpt2"), PROMPTS, per_token=True)
    assert got.dtype == str(dtype).replace("torch.", "") and ref.dtype == "float32"
    for t in (got.block_gain, got.norms, got.per_token_gain):
        assert t.dtype == torch.float32
    # Same gains up to the model's own rounding (bf16 has an 8-bit mantissa).
    torch.testing.assert_close(got.block_gain, ref.block_gain, rtol=3e-2, atol=0)
    assert got.dtype in repr(got)


def test_bos_on_off_is_recorded_and_changes_results(bridge, checkpoint_dir):
    view = ModelView(bridge("gpt2"))
    on = residual_gain(view, PROMPTS, token_scope="all", prepend_bos=True)
    off = residual_gain(view, PROMPTS, token_scope="all", prepend_bos=False)
    assert on.prepend_bos is True and off.prepend_bos is False
    assert (on.lengths - off.lengths).tolist() == [1] * len(PROMPTS)
    assert not torch.allclose(on.block_gain, off.block_gain)
    # With BOS, the gain of the tokens after it equals the no-BOS run only where BOS is invisible:
    # never in a causal model, so the results differ but both are each's own definition.
    first = residual_gain(view, PROMPTS, token_scope="all_but_first", prepend_bos=True, per_token=True)
    assert torch.isnan(first.per_token_gain[:, :, 0]).sum() == 0  # position 0 is the BOS token
    # "tokenizer" mode = the HF tokenizer as from_pretrained loads it (the paper's protocol). The
    # tiny byte-level tokenizer adds no special tokens, like GPT-2's, so this is "no BOS" -- even
    # though the bridge's own tokenizer was reloaded with add_bos_token=True.
    hf_tok = hf_tokenizer(str(checkpoint_dir("gpt2")))
    assert hf_tok("The cat", add_special_tokens=True)["input_ids"] == encode(view, "The cat", False)
    tok = residual_gain(view, PROMPTS, token_scope="all", prepend_bos="tokenizer")
    assert tok.prepend_bos == "tokenizer"
    torch.testing.assert_close(tok.block_gain, off.block_gain)
    back = GainResult.from_json(on.to_json())
    assert back.prepend_bos is True and "prepend_bos=True" in repr(on)
    assert set(on.to_frame()["prepend_bos"]) == {"True"}


def test_user_hook_ablating_a_head_matches_hf_ablation(bridge, hf_model, checkpoint_dir):
    view = ModelView(bridge("gpt2"))
    head, dh = 2, view.d_head
    calls = []

    def ablate(z, hook):
        calls.append(hook.name)
        z[:, :, head] = 0.0
        return z

    base = residual_gain(view, PROMPTS, token_scope="last")
    ablated = residual_gain(view, PROMPTS, token_scope="last",
                            fwd_hooks=[("blocks.1.attn.hook_z", ablate)])
    assert len(calls) == 1  # one batch, one call (the bridge names it by its alias target)
    torch.testing.assert_close(ablated.block_gain[:, 0], base.block_gain[:, 0])  # block 0 untouched
    assert not torch.allclose(ablated.block_gain[:, 1:], base.block_gain[:, 1:])
    # Independent: zero the head's slice of the merged z entering HF's c_proj of block 1.
    hf = hf_model("gpt2")

    def zero_head(mod, args):
        z = args[0].clone()
        z[..., head * dh:(head + 1) * dh] = 0.0
        return (z,)

    c_proj = hf.transformer.h[1].attn.c_proj
    for p, prompt in enumerate(PROMPTS):
        xs, _ = hf_states("gpt2", hf, hf_ids(checkpoint_dir, "gpt2", prompt), pre_hooks=[(c_proj, zero_head)])
        block, _ = ref_gains(xs, "last")
        np.testing.assert_allclose(ablated.block_gain[p].numpy(), block, rtol=2e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_post_ln_flag(arch, bridge):
    res = residual_gain(bridge(arch), PROMPTS[:2], token_scope="last")
    post = arch in ("opt_postln", "bert")
    assert res.post_ln is post and res.model["post_ln"] is post
    assert any("post-LN" in n for n in res.notes) == post
    assert ("post-LN" in repr(res)) == post
    assert res.weights == "raw"


def test_known_answer_identity_blocks(checkpoint_dir):
    """Zero every attention and MLP output projection: each block is the identity, G = 1."""
    from transformer_lens.model_bridge import TransformerBridge

    b = TransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")))
    with torch.no_grad():
        for blk in b.original_model.transformer.h:
            for lin in (blk.attn.c_proj, blk.mlp.c_proj):
                lin.weight.zero_()
                lin.bias.zero_()
    for scope in TOKEN_SCOPES:
        res = residual_gain(b, PROMPTS, token_scope=scope)
        torch.testing.assert_close(res.block_gain, torch.ones_like(res.block_gain), rtol=0, atol=1e-6)
        assert res.total_amplification.mean == pytest.approx(1.0, abs=1e-6)
        assert res.regime == "neutral"  # SD 0, CI [1, 1] contains 1


@pytest.mark.slow
def test_known_answer_post_ln_gain_is_set_by_layernorm_weights(checkpoint_dir, tmp_path):
    """BERT: x_l = LayerNorm_l(...) with weight c_l and bias 0 has ||x_l[t]|| = c_l sqrt(d) for
    every token, so G_l = c_l / c_{l-1} exactly, whatever the attention and MLP do."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    c = [1.0, 2.0, 3.0, 1.5]
    hf = transformers.BertForMaskedLM.from_pretrained(str(checkpoint_dir("bert")))
    with torch.no_grad():
        lns = [hf.bert.embeddings.LayerNorm] + [layer.output.LayerNorm for layer in hf.bert.encoder.layer]
        for ln, cl in zip(lns, c):
            ln.weight.fill_(cl)
            ln.bias.zero_()
    hf.save_pretrained(tmp_path)
    transformers.AutoTokenizer.from_pretrained(str(checkpoint_dir("bert"))).save_pretrained(tmp_path)
    b = TransformerBridge.boot_transformers(str(tmp_path))
    expected = torch.tensor([c[l] / c[l - 1] for l in range(1, 4)])
    for scope in TOKEN_SCOPES:
        res = residual_gain(b, PROMPTS, token_scope=scope)
        assert res.post_ln
        torch.testing.assert_close(res.block_gain, expected.expand(len(PROMPTS), 3), rtol=1e-5, atol=0)
        n0 = int(res.n_tokens[0]) if scope == "frobenius" else 1  # Frobenius pools n tokens
        torch.testing.assert_close(res.norms[0], torch.tensor(c) * (32 * n0) ** 0.5, rtol=1e-5, atol=0)
        assert res.total_amplification.mean == pytest.approx(1.5, rel=1e-5)
        assert res.geometric_mean_gain.mean == pytest.approx(1.5 ** (1 / 3), rel=1e-5)
        assert res.max_block_gain.mean == pytest.approx(2.0, rel=1e-5)
        assert res.regime == "dampener"  # G_3 = 0.5 for every prompt


def test_summaries_equal_numpy_scipy(bridge):
    from scipy import stats

    res = residual_gain(bridge("llama_gqa"), PROMPTS, token_scope="last")
    assert set(res.summaries) == set(SUMMARIES)
    for name, s in res.summaries.items():
        x = np.asarray(s.values, dtype=np.float64)
        np.testing.assert_array_equal(x, res.per_prompt(name).double().numpy())
        assert s.n == len(PROMPTS) and s.ddof == 1
        assert s.mean == pytest.approx(x.mean(), rel=1e-12)
        assert s.sd == pytest.approx(np.std(x, ddof=1), rel=1e-12)
        assert s.se == pytest.approx(stats.sem(x), rel=1e-12)
        lo, hi = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
        assert (s.ci_low, s.ci_high) == (pytest.approx(lo, rel=1e-12), pytest.approx(hi, rel=1e-12))
    layer = res.layer_summary
    np.testing.assert_allclose(layer.mean, res.block_gain.double().mean(0).numpy(), rtol=1e-12)
    np.testing.assert_allclose(layer.sd, res.block_gain.double().std(0, unbiased=True).numpy(), rtol=1e-10)


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(1, 5), st.integers(2, 9), st.integers(0, 2**31 - 1), st.floats(0.1, 10.0))
def test_scope_ratio_property(n_prompts, width, seed, c):
    """scope_ratio on random padded norms equals a per-prompt numpy loop; scaling x_b by c scales
    every scope's ratio by c; padding values never matter."""
    rng = np.random.default_rng(seed)
    lengths = torch.tensor(rng.integers(2, width + 1, size=n_prompts))
    a = torch.tensor(rng.uniform(0.5, 2.0, size=(n_prompts, width)), dtype=torch.float32)
    b = torch.tensor(rng.uniform(0.5, 2.0, size=(n_prompts, width)), dtype=torch.float32)
    pad = torch.arange(width)[None, :] >= lengths[:, None]
    garbage_a, garbage_b = a.masked_fill(pad, float("nan")), b.masked_fill(pad, 1e9)
    for scope in TOKEN_SCOPES:
        got = scope_ratio(garbage_a, garbage_b, lengths, scope)
        for p in range(n_prompts):
            n = int(lengths[p])
            na, nb = a[p, :n].double().numpy(), b[p, :n].double().numpy()
            ref = {"last": nb[-1] / na[-1], "all_but_first": np.mean(nb[1:] / na[1:]),
                   "all": np.mean(nb / na), "frobenius": np.sqrt((nb ** 2).sum() / (na ** 2).sum())}[scope]
            assert float(got[p]) == pytest.approx(ref, rel=1e-12)
        scaled = scope_ratio(garbage_a, garbage_b * c, lengths, scope)
        torch.testing.assert_close(scaled, got * c, rtol=1e-6, atol=0)


def _summary(values):
    return summarize(np.asarray(values, dtype=float))


def test_regime_logic_on_hand_made_values():
    assert regime_from_summary(_summary([1.2, 1.3, 1.25, 1.22])) == "expander"
    assert regime_from_summary(_summary([0.8, 0.85, 0.82])) == "dampener"
    assert regime_from_summary(_summary([0.9, 1.1, 1.0, 1.05])) == "neutral"  # CI contains 1
    assert regime_from_summary(_summary([1.5, 0.7])) == "neutral"  # mean > 1 but CI wide
    assert regime_from_summary(_summary([1.5])) == "undetermined"  # n = 1: no CI
    assert regime_from_summary(_summary([1.0, 1.0, 1.0])) == "neutral"
    assert regime_from_summary(_summary([2.0, 2.0]), null=2.5) == "dampener"


def test_regime_by_chooses_the_deciding_summary(bridge):
    view = ModelView(bridge("gpt2"))
    collected = collect(view, PROMPTS, [residual_norms], prepend_bos=True)
    for name in SUMMARIES:
        res = gain_from_collected(collected, "last", regime_by=name)
        assert res.regime_by == name
        assert res.regime == regime_from_summary(res.summaries[name])
        assert f"by {name}" in repr(res)
    assert residual_gain(view, PROMPTS).regime_by == "last_block_gain"  # documented default


def test_frames_json_and_repr(bridge):
    res = residual_gain(bridge("gemma"), PROMPTS, token_scope="frobenius", per_token=True)
    back = GainResult.from_json(res.to_json())
    torch.testing.assert_close(back.block_gain, res.block_gain, rtol=0, atol=0)
    torch.testing.assert_close(back.per_token_gain, res.per_token_gain, rtol=0, atol=0, equal_nan=True)
    assert back.summaries["last_block_gain"].mean == res.last_block_gain.mean
    assert back.regime == res.regime and back.model == res.model and back.prompts == res.prompts
    df = res.to_frame()
    L = res.n_layers
    assert len(df) == len(PROMPTS) * L and list(df["layer"][:L]) == [0, 1, 2]  # 0-based block index
    assert {"prompt", "layer", "block_gain", "token_scope", "prepend_bos", "dtype", "weights",
            "post_ln", "model"} <= set(df.columns)
    np.testing.assert_allclose(df["block_gain"].to_numpy(), res.block_gain.numpy().reshape(-1), rtol=1e-7)
    np.testing.assert_allclose(df["norm_out"] / df["norm_in"], df["block_gain"], rtol=1e-5)  # frobenius
    sf = res.summary_frame()
    assert list(sf["summary"]) == list(SUMMARIES) and sf["decides_regime"].sum() == 1
    assert len(res.prompt_frame()) == len(PROMPTS)
    text = repr(res)
    for word in ("frobenius", "regime", "last_block_gain", "SD(ddof=1)", "95% CI", "raw"):
        assert word in text
    json.loads(res.to_json())


def test_one_prompt_has_no_ci(bridge):
    res = residual_gain(bridge("gpt2"), ["The capital of France"])
    assert res.n_prompts == 1 and res.regime == "undetermined"
    assert np.isnan(res.last_block_gain.sd) and np.isnan(res.last_block_gain.ci_low)
    assert any("one prompt" in n for n in res.notes)


# ---------------------------------------------------------------------------- bad input
def test_bad_prompts_are_rejected_clearly(bridge):
    model = bridge("gpt2")
    with pytest.raises(ThermoLensInputError, match="empty"):
        residual_gain(model, [])
    with pytest.raises(ThermoLensInputError, match="prompt 1 is (an )?empty"):
        residual_gain(model, ["fine", "   "])
    with pytest.raises(ThermoLensInputError, match="prompt 1"):
        residual_gain(model, ["fine", 3])
    # A single string is one prompt (the same numbers as the one-element list).
    one = residual_gain(model, "just one prompt")
    assert one.prompts == ("just one prompt",)
    torch.testing.assert_close(one.block_gain, residual_gain(model, ["just one prompt"]).block_gain)


def test_too_long_prompt_names_index_and_lengths(bridge):
    model = bridge("gpt2")
    n_ctx = ModelView(model).n_ctx
    long = " ".join(["water"] * 200)
    with pytest.raises(ThermoLensInputError, match=rf"prompt 2 is \d+ tokens long .* context of {n_ctx} tokens.*truncate=True"):
        residual_gain(model, ["a", "b c", long])
    res = residual_gain(model, ["a b", long], truncate=True)
    assert res.truncated == (False, True) and int(res.n_tokens[1]) == n_ctx
    assert any("truncated" in n for n in res.notes)


def test_unknown_scope_and_regime_by(bridge):
    with pytest.raises(ThermoLensInputError, match="unknown token_scope 'first'.*all_but_first"):
        residual_gain(bridge("gpt2"), PROMPTS, token_scope="first")
    with pytest.raises(ThermoLensInputError, match="unknown regime_by"):
        residual_gain(bridge("gpt2"), PROMPTS, regime_by="mean")
    with pytest.raises(ThermoLensInputError, match="level"):
        residual_gain(bridge("gpt2"), PROMPTS, level=95)


def test_all_but_first_needs_two_tokens(bridge):
    view = ModelView(bridge("gpt2"))
    one_token = "The"
    assert len(encode(view, one_token, False)) == 1
    with pytest.raises(ThermoLensInputError, match=r"prompt 1 .*1 token.*all_but_first.*prepend_bos=True"):
        residual_gain(view, ["The cat", one_token], prepend_bos=False)
    # Other scopes accept it; and the pure function checks a Collected made without the guard.
    assert residual_gain(view, [one_token], token_scope="last", prepend_bos=False).n_prompts == 1
    collected = collect(view, ["The cat", one_token], [residual_norms], prepend_bos=False)
    with pytest.raises(ThermoLensInputError, match=r"prompt\(s\) \[1\] have only 1 token"):
        gain_from_collected(collected, "all_but_first")


def test_nan_model_names_the_layer(checkpoint_dir):
    from transformer_lens.model_bridge import TransformerBridge

    b = TransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")))  # own copy: mutated
    with torch.no_grad():
        b.original_model.transformer.h[1].mlp.c_proj.weight[0, 0] = float("inf")
    with pytest.raises(ThermoLensNumericsError, match=r"blocks\.1\.hook_resid_post \(layer 1\)"):
        residual_gain(b, PROMPTS)


def test_nan_from_user_hook_names_the_layer(bridge):
    def poison(x, hook):
        x[:, -1] = float("inf")
        return x

    with pytest.raises(ThermoLensNumericsError, match=r"layer 2"):
        residual_gain(bridge("neox"), PROMPTS, fwd_hooks=[("blocks.2.hook_resid_post", poison)])


def test_gain_from_collected_needs_norms(bridge):
    from thermo_lens.measures.anisotropy import anisotropy

    c = collect(bridge("gpt2"), PROMPTS, [anisotropy], prepend_bos=True)
    with pytest.raises(ThermoLensInputError, match="residual_norms"):
        gain_from_collected(c)
    with pytest.raises(ThermoLensInputError, match="Collected"):
        gain_from_collected([1.0, 2.0])


def test_processed_weights_warn_and_are_recorded(checkpoint_dir):
    from transformer_lens.model_bridge import TransformerBridge

    b = TransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")))
    b.enable_compatibility_mode(disable_warnings=True)
    with pytest.warns(UserWarning, match="processed"):
        res = residual_gain(b, PROMPTS[:2])
    assert res.weights == "processed" and any("processed" in n for n in res.notes)


# ---------------------------------------------------------------------------- the paper's metrics
def test_paper_metric_A_is_hf_penultimate_ratio(bridge, hf_model, checkpoint_dir):
    """Metric A as the paper computed it: ||h[-2]|| / ||h[-3]|| of HF output_hidden_states at the
    last token, HF tokenizer's own special tokens, mean over prompts, SD with ddof=0."""

    arch = "llama_gqa"
    tok = hf_tokenizer(str(checkpoint_dir(arch)))
    hf = hf_model(arch)
    vals = []
    for prompt in PROMPTS:
        ids = tok(prompt, add_special_tokens=True, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            h = hf(input_ids=ids, output_hidden_states=True).hidden_states
        vals.append((h[-2][0, -1].double().norm() / h[-3][0, -1].double().norm()).item())
    res = paper_metric(bridge(arch), PROMPTS, "A")
    assert res.metric.reference_measurement == "residual_gain_no_final_ln"
    assert res.gain.token_scope == "last" and res.gain.prepend_bos == "tokenizer"
    np.testing.assert_allclose(np.asarray(res.value.values), vals, rtol=2e-5)
    assert res.value.mean == pytest.approx(np.mean(vals), rel=2e-5)
    assert res.value.sd_ddof0 == pytest.approx(np.std(vals), rel=1e-4)  # the paper's ddof=0
    assert "metric A" in repr(res) and len(res.to_frame()) == 1
    assert set(PAPER_METRICS) >= {"A", "B", "alltokens", "emb_to_block0"}
    with pytest.raises(ThermoLensInputError, match="unknown paper metric"):
        paper_metric(bridge(arch), PROMPTS, "Z")


def test_paper_metric_B_defaults_to_paper25(bridge):
    res = paper_metric(bridge("gpt2"), metric="B", truncate=True)  # paper25 exceeds the tiny n_ctx
    assert res.gain.n_prompts == 25 and res.value.n == 25
    torch.testing.assert_close(torch.as_tensor(res.value.values, dtype=torch.float32),
                               res.gain.block_gain[:, -1])


# ---------------------------------------------------------------------------- benchmark smoke test
@pytest.mark.slow
def test_benchmark_script_runs_quick():
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gain.py"
    out = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "residual_gain / bare forward" in out.stdout
