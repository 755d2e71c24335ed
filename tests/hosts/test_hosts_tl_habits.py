"""Never a silent wrong number with ordinary TransformerLens habits, on every host (issue 21).

One test per habit that gave silently wrong or mislabelled numbers, on ``HookedTransformer``
(TransformerLens 2.16 and 3.x), SAELens' ``HookedSAETransformer`` and ``TransformerBridge``
(whichever this leg has), each compared with plain ``run_with_cache`` numbers computed here:

1. hooks already on the model (``add_hook``, ``with model.hooks(...)``, permanent hooks) are
   applied *and* recorded;
2. a misspelt or out-of-range hook name is an error naming the closest valid names;
3. a padded token tensor without a mask is masked as TransformerLens masks it (or refused);
4. measures read an existing ``ActivationCache`` (``cache=``), and a cache is never prompts;
5. weight processing is detected step by step, and the attribution's documented effects hold;
6. an SAE and a hook replacing ``hook_resid_pre`` follow one convention: the gains telescope;
7. two runs that differ by an identity hook differ by exactly 0, and t is then undefined;
8. an attached SAE appears in every printed result;
9. panels label heads by their index and take hooks; patches keep their model and BOS mode;
   ``sae_gain_change`` is a paired difference with p-values and takes run options.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import thermo_lens as tl
from test_gain import ref_gains
import test_hosts
from test_hosts import HOSTS, TOL, _available
from thermo_lens.core.errors import ThermoLensHookError, ThermoLensInputError
from thermo_lens.measures.gain import GainResult

pytestmark = pytest.mark.hosts
host_model = test_hosts.host_model  # the session fixture: every host of this leg, built offline

PROMPTS = ["The capital of France is Paris", "Water freezes at zero", "the early bird catches the worm",
           "Colorless green ideas sleep"]
MANY = PROMPTS + ["the cat sat on the mat", "a dog", "green ideas sleep furiously tonight in the forest",
                  "numbers 0123456789", "the team decided to continue", "Despite the rain"]


def zero_head0(z, hook):
    """Ablate head 0 (out of place: a run_with_cache cache keeps references)."""
    z = z.clone()
    z[:, :, 0] = 0.0
    return z


def identity(x, hook):
    return x


def _states(model, tokens, fwd_hooks=()):
    """x_0..x_L of each row of ``tokens`` from the host's own run_with_cache: x_l is what block l
    reads (blocks.{l}.hook_resid_pre, an SAE's output where one is spliced in), x_L the last
    block's output; ``[L+1, batch, pos, d]`` float64."""
    with model.hooks(fwd_hooks=list(fwd_hooks)):
        _, cache = model.run_with_cache(tokens)
    L = model.cfg.n_layers
    names = [f"blocks.{l}.hook_resid_pre" for l in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    out = []
    for n in names:
        key = n + ".hook_sae_output" if n + ".hook_sae_output" in cache else n
        out.append(cache[key].double())
    return torch.stack(out)


def _ref_gains(model, prompts, scope="all_but_first", fwd_hooks=()):
    """Block gains and total amplification, prompt by prompt (unpadded), from run_with_cache."""
    gains, totals = [], []
    for p in prompts:
        xs = _states(model, model.to_tokens(p), fwd_hooks)[:, 0]
        g, t = ref_gains(list(xs), scope)
        gains.append(g)
        totals.append(t)
    return np.stack(gains), np.array(totals)


def _model(host_model, host, arch="gpt2"):
    m = host_model(host, arch)
    m.reset_hooks(including_permanent=True)
    if hasattr(m, "reset_saes") and "Bridge" not in type(m).__name__:
        m.reset_saes()
    return m


# ---------------------------------------------------------------------------- 1. hooks on the model
@pytest.mark.parametrize("host", HOSTS)
def test_1_hooks_already_on_the_model_are_applied_and_recorded(host, host_model):
    m = _model(host_model, host)
    clean = tl.residual_gain(m, PROMPTS)
    ref, _ = _ref_gains(m, PROMPTS, fwd_hooks=[("blocks.1.attn.hook_z", zero_head0)])
    m.add_hook("blocks.1.attn.hook_z", zero_head0)
    try:
        g = tl.residual_gain(m, PROMPTS)
        traces = tl.sheaf_traces(m, PROMPTS)
    finally:
        m.reset_hooks()
    np.testing.assert_allclose(g.block_gain.double().numpy(), ref, rtol=TOL, atol=TOL)
    assert not np.allclose(clean.block_gain.double().numpy()[:, 1], ref[:, 1])  # the ablation did something
    rec = [h for h in g.hooks if h.attached == "add_hook"]
    assert [h.hook_point for h in rec] == ["blocks.1.attn.hook_z"] and rec[0].function.endswith("zero_head0")
    for r in (g, traces):
        assert "blocks.1.attn.hook_z <- test_hosts_tl_habits.zero_head0 (attached to the model with model.add_hook)" in repr(r)
        assert "zero_head0" in r.to_frame()["hooks"].iloc[0]
        assert type(r).from_json(r.to_json()).provenance.hooks == r.provenance.hooks
    # inside `with model.hooks(...)`, and a permanent hook: the same numbers, recorded as such
    with m.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero_head0)]):
        g2 = tl.residual_gain(m, PROMPTS)
    assert [h.attached for h in g2.hooks] == ["model.hooks"]
    torch.testing.assert_close(g2.block_gain, g.block_gain, rtol=0, atol=0)
    m.add_hook("blocks.1.attn.hook_z", zero_head0, is_permanent=True)
    try:
        g3 = tl.residual_gain(m, PROMPTS, fwd_hooks=[("blocks.0.hook_resid_pre", identity)])
    finally:
        m.reset_hooks(including_permanent=True)
    assert [(h.hook_point, h.attached) for h in g3.hooks] == [("blocks.0.hook_resid_pre", "fwd_hooks"),
                                                               ("blocks.1.attn.hook_z", "permanent")]
    torch.testing.assert_close(g3.block_gain, g.block_gain, rtol=0, atol=0)
    # a paired difference against a clean run says the two ran under different hidden hooks
    d = g - clean
    assert any("different hooks already on the model" in n for n in d.notes)
    assert "different hooks already on the model" in repr(d) and "zero_head0" in d.to_frame()["notes"].iloc[0]
    assert "model.add_hook" in repr(d).splitlines()[2]  # b: ...


@pytest.mark.slow  # a profile and a report
@pytest.mark.parametrize("host", HOSTS)
def test_1_hooks_already_on_the_model_reach_the_profile_and_the_report(host, host_model, tmp_path):
    m = _model(host_model, host)
    m.add_hook("blocks.1.attn.hook_z", zero_head0)
    try:
        prof = tl.profile(m, PROMPTS, attribution=False, name="hidden")
    finally:
        m.reset_hooks()
    assert "zero_head0" in prof.meta["hooks"] and "zero_head0" in repr(prof)
    np.testing.assert_allclose(prof.gain.block_gain.double().numpy(),
                               _ref_gains(m, PROMPTS, fwd_hooks=[("blocks.1.attn.hook_z", zero_head0)])[0],
                               rtol=TOL, atol=TOL)
    text = tl.write_report({"hidden": prof}, tmp_path / "r.html", panel=None).read_text(encoding="utf-8")
    assert "zero_head0" in text and "model.add_hook" in text


# ---------------------------------------------------------------------------- 2. hook names
@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("bad, near", [("blocks.1.attn.hook_zz", "blocks.1.attn.hook_z"),
                                       ("blocks.1.attn.hook_Z", "blocks.1.attn.hook_z"),
                                       ("block.1.attn.hook_z", "blocks.1.attn.hook_z"),
                                       ("blocks.9.attn.hook_z", "blocks.2.attn.hook_z")])
def test_2_a_wrong_hook_name_is_an_error_naming_the_closest(host, bad, near, host_model):
    m = _model(host_model, host)
    with pytest.raises(ThermoLensInputError, match=rf"no hook point '{bad}'.*closest: .*'{near}'") as err:
        tl.residual_gain(m, PROMPTS, fwd_hooks=[(bad, zero_head0)])
    if bad.startswith("blocks.9"):
        assert "out of range" in str(err.value) and "blocks 0..2" in str(err.value)


@pytest.mark.parametrize("host", HOSTS)
def test_2_name_filters_work_and_hooks_that_never_fire_are_errors(host, host_model):
    m = _model(host_model, host)
    named = tl.residual_gain(m, PROMPTS, fwd_hooks=[("blocks.1.attn.hook_z", zero_head0)])
    by_filter = tl.residual_gain(m, PROMPTS, fwd_hooks=[(lambda n: n == "blocks.1.attn.hook_z", zero_head0)])
    torch.testing.assert_close(by_filter.block_gain, named.block_gain, rtol=0, atol=0)
    ref, _ = _ref_gains(m, PROMPTS, fwd_hooks=[("blocks.1.attn.hook_z", zero_head0)])
    np.testing.assert_allclose(named.block_gain.double().numpy(), ref, rtol=TOL, atol=TOL)
    with pytest.raises(ThermoLensInputError, match="matches none of"):
        tl.residual_gain(m, PROMPTS, fwd_hooks=[(lambda n: n.endswith("hook_nothing"), zero_head0)])
    # hook_result fires only with use_attn_result: refused before the pass, on every host
    assert not m.cfg.use_attn_result
    with pytest.raises(ThermoLensInputError, match="blocks.0.attn.hook_result.*use_attn_result.*set_use_attn_result"):
        tl.residual_gain(m, PROMPTS, fwd_hooks=[("blocks.0.attn.hook_result", identity)])
    # a hook the host skips anyway (a host dropping it unseen) is an error after the pass, not a record
    real = m.run_with_hooks

    def dropping(*args, fwd_hooks=(), **kwargs):
        return real(*args, fwd_hooks=[(n, f) for n, f in fwd_hooks if n != "blocks.1.attn.hook_z"], **kwargs)
    m.run_with_hooks = dropping
    try:
        with pytest.raises(ThermoLensHookError, match=r"zero_head0 at blocks\.1\.attn\.hook_z never ran"):
            tl.residual_gain(m, PROMPTS, fwd_hooks=[("blocks.1.attn.hook_z", zero_head0)])
    finally:
        del m.run_with_hooks


def test_2_sae_hook_names_resolve(host_model):
    from test_hosts_sae import D_SAE
    from thermo_lens.testing import random_sae

    m = _model(host_model, "HookedSAETransformer")
    m.add_sae(random_sae("blocks.1.hook_resid_pre", 32, D_SAE, seed=3))
    seen = []
    try:
        for name in ("blocks.1.hook_resid_pre", "blocks.1.hook_resid_pre.hook_sae_acts_post",
                     "blocks.1.hook_resid_pre.hook_sae_output"):
            tl.residual_gain(m, PROMPTS[:2], fwd_hooks=[(name, lambda x, hook: seen.append(hook.name))])
        with pytest.raises(ThermoLensInputError, match="closest: 'blocks.1.hook_resid_pre.hook_sae_acts_post'"):
            tl.residual_gain(m, PROMPTS[:2], fwd_hooks=[("blocks.1.hook_resid_pre.hook_sae_acts_pst", identity)])
    finally:
        m.reset_saes()
    assert seen == ["blocks.1.hook_resid_pre.hook_sae_output", "blocks.1.hook_resid_pre.hook_sae_acts_post",
                    "blocks.1.hook_resid_pre.hook_sae_output"]


# ---------------------------------------------------------------------------- 3. padded tokens
@pytest.mark.parametrize("host", HOSTS)
def test_3_padded_tokens_without_a_mask_are_masked_as_transformer_lens_does(host, host_model):
    m = _model(host_model, host)
    tokens = m.to_tokens(PROMPTS)  # right padded with the pad token (= BOS = EOS here)
    assert int((tokens == m.tokenizer.pad_token_id).sum()) > len(PROMPTS)  # real padding, beyond the BOS
    ref, _ = _ref_gains(m, PROMPTS)
    for scope in ("all_but_first", "last"):
        g = tl.residual_gain(m, tokens, token_scope=scope)
        np.testing.assert_allclose(g.block_gain.double().numpy(), _ref_gains(m, PROMPTS, scope)[0], rtol=TOL, atol=TOL)
        assert "pad token(s) 0" in g.provenance.padding and "right padding" in repr(g)
    assert g.prepend_bos == "tokens_as_given"
    torch.testing.assert_close(tl.residual_gain(m, tokens).block_gain,
                               torch.as_tensor(ref, dtype=torch.float32), rtol=TOL, atol=TOL)
    # left padding (the tokenizer's padding_side), the BOS sharing the pad's id is kept
    side = m.tokenizer.padding_side
    m.tokenizer.padding_side = "left"
    try:
        left = m.to_tokens(PROMPTS)
        assert int(left[1, 0]) == m.tokenizer.pad_token_id and int(left[0, 0]) == m.tokenizer.bos_token_id
        gl = tl.residual_gain(m, left)
        with pytest.raises(ThermoLensInputError, match="end in the pad token.*pads on the left"):
            tl.residual_gain(m, tokens)
    finally:
        m.tokenizer.padding_side = side
    np.testing.assert_allclose(gl.block_gain.double().numpy(), ref, rtol=TOL, atol=TOL)
    # ambiguous: every row ends in the pad token, or a row is nothing but pad tokens
    eos = torch.full((len(PROMPTS), 1), m.tokenizer.pad_token_id)
    with pytest.raises(ThermoLensInputError, match="every token row ends in the pad token.*attention_mask"):
        tl.residual_gain(m, torch.cat([tokens, eos], dim=1))
    with pytest.raises(ThermoLensInputError, match="nothing but the pad token"):
        tl.residual_gain(m, torch.cat([tokens[:, :4], torch.zeros_like(tokens[:1, :4])]))
    # with the mask given, nothing is derived
    g = tl.residual_gain(m, {"input_ids": tokens, "attention_mask": (tokens != 0) | (torch.arange(tokens.shape[1]) == 0)})
    np.testing.assert_allclose(g.block_gain.double().numpy(), ref, rtol=TOL, atol=TOL)
    assert g.provenance.padding == ""


# ---------------------------------------------------------------------------- 4. from a cache
class _Forwards:
    """Counts forward passes of the first block (a PyTorch hook: the cache path records none)."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.blocks[0].register_forward_hook(lambda *a: setattr(self, "n", self.n + 1))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


@pytest.mark.slow  # every measurement twice, and a profile
@pytest.mark.parametrize("host", HOSTS)
def test_4_measures_read_an_activation_cache_without_a_second_forward(host, host_model):
    m = _model(host_model, host)
    tokens = m.to_tokens(PROMPTS)
    _, cache = m.run_with_cache(tokens)
    # the numbers of the pass, and run_with_cache's own (prompt by prompt, unpadded)
    with _Forwards(m) as fw:
        gc = tl.residual_gain(m, tokens, cache=cache)
        ac = tl.gain_attribution(m, tokens, cache=cache)
        sc = tl.sheaf_traces(m, tokens, cache=cache)
        nc = tl.anisotropy_profile(m, tokens, cache=cache)
        rc = tl.run(m, tokens, ["gain", "attribution", "write_norm"], cache=cache, token_scope="last")
        pc = tl.profile(m, tokens, cache=cache)
        assert fw.n == 0, "a forward pass ran although the cache holds every activation"
    np.testing.assert_allclose(gc.block_gain.double().numpy(), _ref_gains(m, PROMPTS)[0], rtol=TOL, atol=TOL)
    for got, want in ((gc.block_gain, tl.residual_gain(m, PROMPTS).block_gain),
                      (ac.head, tl.gain_attribution(m, PROMPTS).head), (sc.trace, tl.sheaf_traces(m, PROMPTS).trace),
                      (nc.values, tl.anisotropy_profile(m, PROMPTS).values),
                      (rc.gain.block_gain, tl.residual_gain(m, PROMPTS, token_scope="last").block_gain),
                      (rc["write_norm"].write_norm, tl.run(m, PROMPTS, ["write_norm"], token_scope="last")["write_norm"].write_norm),
                      (pc.gain.block_gain, gc.block_gain)):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert gc.provenance.origin == "ActivationCache" and "ActivationCache" in repr(gc)
    # the attribution closes on the cache too: head terms from the cache's own z and W_O
    z = cache["blocks.1.attn.hook_z"].double()
    s = (cache["blocks.1.hook_resid_post"] + cache["blocks.1.hook_resid_pre"]).double()
    W_O = tl.ModelView(m).W_O(torch.float64, layers=[1])[0]
    terms = torch.einsum("bphd,hde,bpe->bph", z, W_O, s)
    for p in range(len(PROMPTS)):
        n = int(gc.lengths[p])
        torch.testing.assert_close(ac.head[p, 1], terms[p, 1:n].mean(0), rtol=1e-5, atol=1e-6)
    # prompt strings: run_with_cache(strings) tokenized them with to_tokens; the same numbers
    _, cache_s = m.run_with_cache(PROMPTS)
    torch.testing.assert_close(tl.residual_gain(m, PROMPTS, cache=cache_s).block_gain, gc.block_gain, rtol=0, atol=0)
    assert tl.residual_gain(m, PROMPTS, cache=cache_s).prepend_bos is True


@pytest.mark.parametrize("host", HOSTS)
def test_4_a_cache_missing_hooks_says_which_and_a_cache_is_never_prompts(host, host_model):
    m = _model(host_model, host)
    tokens = m.to_tokens(PROMPTS)
    _, small = m.run_with_cache(tokens, names_filter=["blocks.0.hook_resid_pre"])
    with pytest.raises(ThermoLensInputError, match=r"lacks .* blocks\.0\.attn\.hook_z.*names_filter") as err:
        tl.gain_attribution(m, tokens, cache=small)
    # the names filter the message gives makes a cache that works
    exact = eval(str(err.value).split("(exactly: names_filter=")[1].rstrip(")"))  # noqa: S307 - our own message
    _, enough = m.run_with_cache(tokens, names_filter=exact)
    torch.testing.assert_close(tl.gain_attribution(m, tokens, cache=enough).head,
                               tl.gain_attribution(m, PROMPTS).head, rtol=1e-5, atol=1e-6)
    _, full = m.run_with_cache(tokens)
    for fn in (tl.residual_gain, tl.gain_attribution):
        with pytest.raises(ThermoLensInputError, match="ActivationCache of .* activations as the prompts.*cache="):
            fn(m, full)
    with pytest.raises(ThermoLensInputError, match="2 row"):
        tl.residual_gain(m, tokens[:2], cache=full)
    with pytest.raises(ThermoLensInputError, match="fwd_hooks cannot apply to a cache"):
        tl.residual_gain(m, tokens, cache=full, fwd_hooks=[("blocks.0.hook_resid_pre", identity)])


def test_4_left_padded_cache_with_its_mask(host_model):
    """A left-padded cache (positions shifted by TransformerLens' own attention mask) is read at
    each row's real tokens."""
    host = next((h for h in ("HookedTransformer", "HookedSAETransformer") if _available(h, "gpt2") is None), None)
    if host is None:
        pytest.skip("HookedTransformer is not on this leg")
    m = _model(host_model, host)
    side = m.tokenizer.padding_side
    m.tokenizer.padding_side = "left"
    try:
        tokens = m.to_tokens(PROMPTS)
        _, cache = m.run_with_cache(tokens)
        g = tl.residual_gain(m, tokens, cache=cache)
        t = tl.sheaf_traces(m, tokens, cache=cache)
    finally:
        m.tokenizer.padding_side = side
    torch.testing.assert_close(g.block_gain, tl.residual_gain(m, PROMPTS).block_gain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(t.trace, tl.sheaf_traces(m, PROMPTS).trace, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- 5. weight processing
def _biased_checkpoint(checkpoint_dir, tmp_path):
    """The gpt2 fixture with random non-zero attention and MLP biases (HF initialises them to 0, so
    folding value biases would be invisible)."""
    import transformers

    path = tmp_path / "gpt2-biased"
    hf = transformers.GPT2LMHeadModel.from_pretrained(checkpoint_dir("gpt2"))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("attn.c_attn.bias", "attn.c_proj.bias", "mlp.c_proj.bias")):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(checkpoint_dir("gpt2")).save_pretrained(path)
    return path


def test_5_weight_processing_is_detected_step_by_step(checkpoint_dir, tmp_path):
    from test_hosts import LEGACY, HAS_BRIDGE
    from thermo_lens.testing import hooked_transformer

    path = _biased_checkpoint(checkpoint_dir, tmp_path)
    seen = {}
    if LEGACY:
        raw = hooked_transformer(path)
        folded = hooked_transformer(path)  # load_and_process_state_dict's defaults fold value biases
        folded.load_and_process_state_dict(raw.state_dict(), fold_ln=False, center_writing_weights=False,
                                           center_unembed=False)
        full = hooked_transformer(path, processed=True)
        seen.update(raw=raw, folded=folded, full=full)
        assert tl.ModelView(raw).weight_processing == ()
        assert tl.ModelView(folded).weight_processing == ("fold_value_biases",)
        assert tl.ModelView(full).weight_processing == ("fold_ln", "center_writing_weights", "center_unembed",
                                                        "fold_value_biases")
    if HAS_BRIDGE:
        from transformer_lens.model_bridge import TransformerBridge

        b = TransformerBridge.boot_transformers(str(path))
        assert tl.ModelView(b).weight_processing == ()
        b.enable_compatibility_mode(disable_warnings=True)
        assert tl.ModelView(b).weight_processing == ("fold_ln", "center_writing_weights", "center_unembed",
                                                     "fold_value_biases")
        seen.setdefault("full", b)
        seen.setdefault("raw", TransformerBridge.boot_transformers(str(path)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("folded", "full"):
            if name not in seen:
                continue
            g = tl.residual_gain(seen[name], PROMPTS)
            assert g.weights == "processed" and "fold_value_biases" in g.model["weight_processing"]
            assert "fold_value_biases" in g.to_frame()["weight_processing"].iloc[0]
            assert "fold_value_biases" in repr(g)
            assert GainResult.from_json(g.to_json()).model["weight_processing"] == g.model["weight_processing"]
    # the attribution's docstring, checked: value-bias folding moves <b_V^h W_O^h, s> from each head
    # term to the bias term; the total and the stream are unchanged.
    if "folded" in seen:
        raw, folded = seen["raw"], seen["folded"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a_raw, a_f = tl.gain_attribution(raw, PROMPTS, token_scope="all"), tl.gain_attribution(folded, PROMPTS,
                                                                                                    token_scope="all")
        for p, prompt in enumerate(PROMPTS):
            _, c = raw.run_with_cache(prompt)
            for l in range(raw.cfg.n_layers):
                s = (c[f"blocks.{l}.hook_resid_pre"] + c[f"blocks.{l}.hook_resid_post"])[0].double()  # [pos, d]
                shift = torch.einsum("hd,hde,pe->ph", raw.blocks[l].attn.b_V.double(), raw.blocks[l].attn.W_O.double(),
                                     s).mean(0)
                torch.testing.assert_close(a_f.head[p, l], a_raw.head[p, l] - shift, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(a_f.bias[p, l], a_raw.bias[p, l] + shift.sum(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a_f.total, a_raw.total, rtol=1e-5, atol=1e-5)
        assert (a_f.head - a_raw.head).abs().max() > 1e-2  # the effect is not rounding
        # ... and with every step: fold_ln alone changes no term but adds the LayerNorm bias's share
        # b_ln W_V^h to the value bias that is then folded; centring makes each term <c, P s> (P removes
        # the mean over d_model) and the total ||P x_out||^2 - ||P x_in||^2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a_full = tl.gain_attribution(seen["full"], PROMPTS, token_scope="all")
        for p, prompt in enumerate(PROMPTS):
            _, c = raw.run_with_cache(prompt)
            for l in range(raw.cfg.n_layers):
                x_in, x_out = (c[f"blocks.{l}.hook_resid_{w}"][0].double() for w in ("pre", "post"))
                P = lambda v: v - v.mean(-1, keepdim=True)  # noqa: E731
                s = P(x_in + x_out)
                attn, ln_b = raw.blocks[l].attn, raw.blocks[l].ln1.b.double()
                b_v = attn.b_V.double() + torch.einsum("d,hde->he", ln_b, attn.W_V.double())
                z = c[f"blocks.{l}.attn.hook_z"][0].double() - b_v
                want = torch.einsum("phd,hde,pe->ph", z, attn.W_O.double(), s).mean(0)
                torch.testing.assert_close(a_full.head[p, l], want, rtol=1e-4, atol=1e-4)
                total = (P(x_out).pow(2).sum(-1) - P(x_in).pow(2).sum(-1)).mean()
                torch.testing.assert_close(a_full.total[p, l], total, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------- 6. one convention
def _sae_like(seed):
    """An SAE-like replacement of the stream, relu(x W + b) W^T (no SAELens needed)."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(32, 64, generator=g) / 32 ** 0.5
    b = 0.1 * torch.rand(64, generator=g)

    def hook(x, hook=None):
        return torch.relu(x @ W.to(x) + b.to(x)) @ W.T.to(x)
    return hook


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("point", ["blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre", "blocks.1.hook_resid_post"])
def test_6_replacing_the_stream_between_blocks_keeps_the_gains_telescoping(host, point, host_model):
    """x_l is what block l reads, so a replacement between blocks l-1 and l counts in block l-1's
    gain and prod_l G_l = ||x_L|| / ||x_0|| (scopes last, frobenius), under any hook."""
    m = _model(host_model, host)
    hooks = [(point, _sae_like(4))]
    for scope in ("last", "frobenius"):
        g = tl.residual_gain(m, PROMPTS, token_scope=scope, fwd_hooks=hooks)
        ref, total = _ref_gains(m, PROMPTS, scope, fwd_hooks=hooks)
        np.testing.assert_allclose(g.block_gain.double().numpy(), ref, rtol=TOL, atol=TOL)
        np.testing.assert_allclose(g.block_gain.double().prod(1).numpy(), g.summaries["total_amplification"].values,
                                   rtol=1e-6)
        np.testing.assert_allclose(g.summaries["total_amplification"].values, total, rtol=TOL)


@pytest.mark.parametrize("host", HOSTS)
def test_6_the_attribution_follows_the_same_convention_and_closes(host, host_model):
    """A replacement at blocks.1.hook_resid_pre is block 0's splice term (as it is in block 0's gain):
    every block closes, and the totals add up to ||x_L||^2 - ||x_0||^2."""
    m = _model(host_model, host)
    hooks = [("blocks.1.hook_resid_pre", _sae_like(4))]
    a = tl.gain_attribution(m, PROMPTS, token_scope="all", fwd_hooks=hooks)
    L = m.cfg.n_layers
    for p, prompt in enumerate(PROMPTS):
        xs, cache_y = _states_and_cache(m, prompt, hooks)
        y0 = cache_y["blocks.0.hook_resid_post"][0].double()
        splice = ((xs[1] - y0) * (xs[1] + xs[0])).sum(-1).mean()
        torch.testing.assert_close(a.splice[p, 0], splice, rtol=1e-4, atol=1e-4)
        sq = xs.pow(2).sum(-1).mean(-1)  # [L+1] mean over tokens of ||x_l||^2
        torch.testing.assert_close(a.total[p].sum(), sq[L] - sq[0], rtol=1e-4, atol=1e-4)
    assert float(a.splice[:, 1:].abs().max()) == 0.0 and float(a.splice[:, 0].abs().min()) > 0
    clean = tl.gain_attribution(m, PROMPTS, token_scope="all")
    assert float(clean.splice.abs().max()) == 0.0 and "splice" in a.layer_frame() and "splice" in repr(a)


def _states_and_cache(model, prompt, hooks):
    with model.hooks(fwd_hooks=list(hooks)):
        _, cache = model.run_with_cache(model.to_tokens(prompt))
    L = model.cfg.n_layers
    names = [f"blocks.{l}.hook_resid_pre" for l in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    xs = torch.stack([cache[n][0].double() for n in names])
    return xs, cache


@pytest.mark.parametrize("point", ["blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"])
def test_6_an_sae_and_the_same_map_as_a_hook_give_the_same_gains(point, host_model):
    from test_hosts_sae import D_SAE
    from thermo_lens.testing import random_sae

    m = _model(host_model, "HookedSAETransformer")
    sae = random_sae(point, 32, D_SAE, seed=4)
    by_hook = {s: tl.residual_gain(m, PROMPTS, token_scope=s, fwd_hooks=[(point, lambda x, hook: sae(x))])
               for s in ("last", "frobenius", "all_but_first")}
    m.add_sae(sae)
    try:
        for scope, h in by_hook.items():
            s = tl.residual_gain(m, PROMPTS, token_scope=scope)
            torch.testing.assert_close(s.block_gain, h.block_gain, rtol=TOL, atol=TOL)
            np.testing.assert_allclose(s.block_gain.double().numpy(), _ref_gains(m, PROMPTS, scope)[0], rtol=TOL,
                                       atol=TOL)
            if scope != "all_but_first":
                np.testing.assert_allclose(s.block_gain.double().prod(1).numpy(),
                                           s.summaries["total_amplification"].values, rtol=1e-6)
    finally:
        m.reset_saes()


# ---------------------------------------------------------------------------- 7. paired runs
@pytest.mark.parametrize("host", HOSTS)
def test_7_an_identity_hook_differs_by_exactly_zero_and_t_is_undefined(host, host_model):
    m = _model(host_model, host)
    kw = dict(batch_size=4)  # several batches (length buckets) in both runs
    clean = tl.residual_gain(m, MANY, **kw)
    same = tl.residual_gain(m, MANY, fwd_hooks=[("blocks.1.hook_resid_pre", identity)], **kw)
    assert same.provenance.batch_plan == clean.provenance.batch_plan and len(clean.provenance.batch_plan) > 1
    d = same - clean
    assert float(d.difference.abs().max()) == 0.0
    assert np.isnan(d.t_statistic).all() and np.isnan(d.pvalue).all()
    assert all(t.startswith("undefined: zero variance") for t in d.to_frame()["t_test"])
    assert "undefined: zero variance" in repr(d)
    # and the clean run's numbers are run_with_cache's
    np.testing.assert_allclose(clean.block_gain.double().numpy(), _ref_gains(m, MANY)[0], rtol=TOL, atol=TOL)
    # an ablation: differences upstream of it are exactly 0 (t undefined), downstream a real test
    abl = tl.residual_gain(m, MANY, fwd_hooks=[("blocks.1.attn.hook_z", zero_head0)], **kw) - clean
    assert float(abl.difference[:, 0].abs().max()) == 0.0 and np.isnan(abl.t_statistic[0])
    from scipy import stats

    ref = stats.ttest_rel(abl.b[:, 1].numpy(), abl.a[:, 1].numpy())
    assert abl.t_statistic[1] == pytest.approx(ref.statistic, rel=1e-9)
    assert abl.pvalue[1] == pytest.approx(ref.pvalue, rel=1e-9)
    # one prompt: undefined, not +-inf
    one = tl.residual_gain(m, MANY[:1], fwd_hooks=[("blocks.1.attn.hook_z", zero_head0)]) - \
        tl.residual_gain(m, MANY[:1])
    assert np.isnan(one.t_statistic).all() and "undefined: 1 prompt" in one.to_frame()["t_test"].iloc[1]


# ---------------------------------------------------------------------------- 8. SAEs in every print
def test_8_an_attached_sae_appears_in_every_printed_result(host_model):
    from test_hosts_sae import D_SAE
    from thermo_lens.testing import random_sae

    m = _model(host_model, "HookedSAETransformer")
    m.add_sae(random_sae("blocks.1.hook_resid_pre", 32, D_SAE, seed=1))
    try:
        results = [tl.residual_gain(m, PROMPTS), tl.sheaf_traces(m, PROMPTS), tl.anisotropy_profile(m, PROMPTS)]
        prof = tl.profile(m, PROMPTS, attribution=False)
        # a cache of an SAE model must hold the SAE's output: the error names it, and its filter works
        tokens = m.to_tokens(PROMPTS)
        _, small = m.run_with_cache(tokens, names_filter=["blocks.0.hook_resid_pre"])
        with pytest.raises(ThermoLensInputError, match=r"lacks .*blocks\.1\.hook_resid_pre\.hook_sae_output") as err:
            tl.residual_gain(m, tokens, cache=small)
        exact = eval(str(err.value).split("(exactly: names_filter=")[1].rstrip(")"))  # noqa: S307 - our own message
        _, enough = m.run_with_cache(tokens, names_filter=exact)
        torch.testing.assert_close(tl.residual_gain(m, tokens, cache=enough).block_gain, results[0].block_gain,
                                   rtol=1e-5, atol=1e-6)
    finally:
        m.reset_saes()
    for r in results:
        assert "blocks.1.hook_resid_pre <- SAE standard d_in=32 d_sae=64" in repr(r)
        assert "SAE standard" in r.to_frame()["hooks"].iloc[0]
        assert [h.attached for h in type(r).from_json(r.to_json()).hooks] == ["sae"]
    assert "SAE standard" in repr(prof) and "SAE standard" in prof.meta["hooks"]
    assert "SAE(s)" in " ".join(results[0].notes)


# ---------------------------------------------------------------------------- 9. panels, patches, SAE change
@pytest.mark.parametrize("host", HOSTS)
def test_9_attention_panel_labels_heads_by_index_and_takes_hooks(host, host_model):
    from thermo_lens.views import attention_panel

    m = _model(host_model, host)
    prompt = PROMPTS[0]

    def uniform_head3(a, hook):
        a = a.clone()
        n = a.shape[-1]
        a[:, 3] = torch.tril(torch.ones(n, n, dtype=a.dtype, device=a.device)) / torch.arange(1, n + 1, dtype=a.dtype,
                                                                                             device=a.device)[:, None]
        return a

    hooks = [("blocks.1.attn.hook_pattern", uniform_head3)]
    panel = attention_panel(m, prompt, 1, head=3, ablation=False, attribution=True, fwd_hooks=hooks)
    assert '"Head 3"' in panel.html and '"Head 0"' not in panel.html
    assert list(panel.metrics["head"]) == [3] and "uniform_head3" in panel.html
    with m.hooks(fwd_hooks=hooks):
        _, cache = m.run_with_cache(prompt)
    torch.testing.assert_close(panel.pattern[0], cache["blocks.1.attn.hook_pattern"][0, 3].float(), rtol=1e-5, atol=1e-6)
    plain = attention_panel(m, prompt, 1, head=[3, 0], ablation=False, attribution=False)
    assert '"Head 3"' in plain.html and plain.html.index('"Head 3"') < plain.html.index('"Head 0"')
    assert not torch.allclose(plain.pattern[0], panel.pattern[0])


@pytest.mark.parametrize("host", HOSTS)
def test_9_patches_keep_their_model_and_bos_mode(host, host_model):
    m = _model(host_model, host)
    clean, corr = ["the cat sat on the mat"], ["a dog lay on the rug"]
    patch = tl.patch_from(m, clean, "blocks.1.hook_resid_pre", positions=[-1])
    assert patch.prepend_bos is True and "prepend_bos=True" in patch.description
    with pytest.raises(ThermoLensInputError, match="prepend_bos=True.*prepend_bos=False.*clean BOS"):
        tl.residual_gain(m, corr, fwd_hooks=patch, prepend_bos=False)
    g = tl.residual_gain(m, corr, fwd_hooks=patch, token_scope="last")
    # run_with_cache: the corrupted run with the clean last-token state written in
    _, cc = m.run_with_cache(clean[0])
    src = cc["blocks.1.hook_resid_pre"][0, -1].clone()

    def write(x, hook):
        x = x.clone()
        x[0, -1] = src
        return x
    ref, _ = _ref_gains(m, corr, "last", fwd_hooks=[("blocks.1.hook_resid_pre", write)])
    np.testing.assert_allclose(g.block_gain.double().numpy(), ref, rtol=TOL, atol=TOL)
    other = host_model(host, "neox")
    with pytest.raises(ThermoLensInputError, match="built on 'gpt2'.*another model"):
        tl.residual_gain(other, corr, fwd_hooks=patch)
    for bad, match in (("13", "string '13'.*heads=\\[1, 3\\]"), ([1.5], "heads must be an int"), (True, "bool")):
        with pytest.raises(ThermoLensInputError, match=match):
            tl.patch_from(m, clean, "blocks.0.attn.hook_z", heads=bad)
    with pytest.raises(ThermoLensInputError, match="hook_names must be a hook name.*int 5"):
        tl.patch_from(m, clean, 5)
    with pytest.raises(ThermoLensInputError, match="no hook point 'blocks.1.hook_resid_pree'"):
        tl.patch_from(m, clean, "blocks.1.hook_resid_pree")


def test_9_sae_gain_change_is_a_paired_difference_with_p_values_and_run_options(host_model):
    from scipy import stats

    from test_hosts_sae import D_SAE
    from thermo_lens.testing import random_sae

    m = _model(host_model, "HookedSAETransformer")
    m.add_sae(random_sae("blocks.1.hook_resid_post", 32, D_SAE, seed=1))
    hooks = [("blocks.0.attn.hook_z", zero_head0)]
    try:
        res = tl.sae_gain_change(m, PROMPTS, fwd_hooks=hooks, batch_size=2, token_scope="last")
        with_ = tl.residual_gain(m, PROMPTS, fwd_hooks=hooks, token_scope="last").block_gain.double()
    finally:
        m.reset_saes()
    without = _ref_gains(m, PROMPTS, "last", fwd_hooks=hooks)[0]
    assert isinstance(res, tl.paired.PairedDifference)
    np.testing.assert_allclose(res.a.numpy(), without, rtol=TOL, atol=TOL)
    torch.testing.assert_close(res.b, with_, rtol=TOL, atol=TOL)
    for l in (1, 2):
        ref = stats.ttest_rel(res.b[:, l].numpy(), res.a[:, l].numpy())
        assert res.pvalue[l] == pytest.approx(ref.pvalue, rel=1e-9) and res.t_statistic[l] == pytest.approx(ref.statistic)
    assert np.isnan(res.pvalue[0])  # block 0 runs before the SAE: differences exactly 0
    df = res.to_frame()
    paired_cols = list(tl.paired.PairedDifference.to_frame(res).columns)
    assert list(df.columns[:len(paired_cols)]) == paired_cols and "saes_at_layer" in df
    assert "zero_head0" in df["hooks_a"].iloc[0] and "zero_head0" in df["hooks_b"].iloc[0]
    assert "p = " in repr(res) and "SAE standard" in repr(res)
    back = type(res).from_json(res.to_json())
    np.testing.assert_array_equal(back.pvalue, res.pvalue)
    assert json.loads(res.to_json())["__result__"] == "SAEGainChange"
