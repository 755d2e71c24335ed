"""Host equivalence: the same metric on the same weights gives the same numbers on every host.

Hosts (whichever the installed TransformerLens provides; each CI leg installs one release):
``HookedTransformer`` and SAELens' ``HookedSAETransformer`` on TransformerLens 2.16.x / 3.x, built
offline from the session's tiny local checkpoints with TransformerLens' own config and weight
converters (``thermo_lens.testing.hooked_transformer``); ``TransformerBridge`` on 3.x / 4.x, with
and without ``enable_compatibility_mode()``.

References, independent of every host: HF ``output_hidden_states`` of the same checkpoint (gains),
per-head slices of the HF state dict (``W_V``/``W_O``), numpy SVD (spectral norms), and the host's
own ``run_with_cache(prompt)`` (the default BOS mode). Set ``THERMO_LENS_HOSTS_REPORT=path.json`` to
write the measured maximum differences per host and architecture.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings

import numpy as np
import pytest
import torch

from conftest import ARCHS
from hf_slices import hf_all_head_weights
from test_gain import PROMPTS, hf_ids, hf_states, ref_gains
from thermo_lens import ModelView, ThermoLensInputError, residual_gain, sheaf_traces, spectral_signature
from thermo_lens.core.host import _parse, detect_host, transformer_lens_version
from thermo_lens.core.errors import UnsupportedHostError
from thermo_lens.core.passes import collect
from thermo_lens.measures.gain import residual_norms
from thermo_lens.testing import LEGACY_ARCHITECTURES, hooked_transformer, make_checkpoint
from thermo_lens.core.tokens import tokenize

pytestmark = pytest.mark.hosts

TL = _parse(transformer_lens_version())
LEGACY = TL[0] in (2, 3)  # HookedTransformer lives here (removed in 4.0)
HAS_BRIDGE = TL[0] >= 3
HAS_SAE_LENS = importlib.util.find_spec("sae_lens") is not None
HOSTS = ("HookedTransformer", "HookedSAETransformer", "TransformerBridge")
TOL = 1e-5
DIFFS: dict[str, float] = {}


def _available(host: str, arch: str) -> str | None:
    """None when ``host`` can run ``arch`` on this leg, else why not (the skip reason)."""
    if host == "TransformerBridge":
        return None if HAS_BRIDGE else f"no TransformerBridge in TransformerLens {transformer_lens_version()}"
    if not LEGACY:
        return f"{host} was removed in TransformerLens 4 (installed: {transformer_lens_version()})"
    if host == "HookedSAETransformer" and not HAS_SAE_LENS:
        return "sae-lens is not installed on this leg"
    if arch not in LEGACY_ARCHITECTURES:
        return f"TransformerLens' HookedTransformer converters do not load {arch}"
    return None


@pytest.fixture(scope="session")
def host_model(checkpoint_dir):
    """``host_model(host, arch, processed=False)`` -> the model on that host (cached)."""
    built = {}

    def get(host: str, arch: str, processed: bool = False):
        reason = _available(host, arch)
        if reason:
            pytest.skip(reason)
        key = (host, arch, processed)
        if key not in built:
            torch.manual_seed(0)
            if host == "TransformerBridge":
                from transformer_lens.model_bridge import TransformerBridge

                m = TransformerBridge.boot_transformers(str(checkpoint_dir(arch)))
                if processed:
                    m.enable_compatibility_mode()
            else:
                cls = None
                if host == "HookedSAETransformer":
                    from sae_lens import HookedSAETransformer as cls
                m = hooked_transformer(checkpoint_dir(arch), processed=processed, cls=cls)
            built[key] = m
        return built[key]

    return get


@pytest.fixture(scope="session", autouse=True)
def _write_report():
    yield
    path = os.environ.get("THERMO_LENS_HOSTS_REPORT")
    if path and DIFFS:
        with open(path, "w") as f:
            json.dump({"transformer_lens": transformer_lens_version(), "max_abs_diff": DIFFS}, f,
                      indent=1, sort_keys=True)


def _record(key: str, diff: float) -> None:
    DIFFS[key] = max(DIFFS.get(key, 0.0), float(diff))


def _hf_block_gains(arch, hf, checkpoint_dir, scope):
    out = []
    for prompt in PROMPTS:
        xs, _ = hf_states(arch, hf, hf_ids(checkpoint_dir, arch, prompt))
        out.append(ref_gains(xs, scope)[0])
    return np.stack(out)


# ---------------------------------------------------------------------------- gains
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("host", HOSTS)
def test_gain_on_every_host_equals_hf_hidden_states(host, arch, host_model, hf_model, checkpoint_dir):
    model = host_model(host, arch)
    view = ModelView(model)
    assert view.weight_state == "raw" and view.host.cls == type(model).__name__
    for scope in ("all_but_first", "last"):
        g = residual_gain(model, PROMPTS, token_scope=scope, prepend_bos=True, batch_size=3)
        ref = _hf_block_gains(arch, hf_model(arch), checkpoint_dir, scope)
        diff = np.abs(g.block_gain.double().numpy() - ref).max()
        _record(f"{arch}/{host}/block_gain", diff)
        assert diff < TOL, f"{host} {arch} {scope}: max |gain - HF| = {diff:.2e}"
        assert g.model["host"].startswith(type(model).__name__)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("host", HOSTS)
def test_head_weights_and_spectra_on_every_host_equal_hf_slices(host, arch, host_model, hf_model):
    model = host_model(host, arch)
    view = ModelView(model)
    wv_ref, wo_ref = hf_all_head_weights(arch, hf_model(arch))
    dv = (view.W_V() - wv_ref).abs().max().item()
    do = (view.W_O() - wo_ref).abs().max().item()
    _record(f"{arch}/{host}/W_V_W_O", max(dv, do))
    assert max(dv, do) < TOL, f"{host} {arch}: W_V diff {dv:.2e}, W_O diff {do:.2e}"
    sig = spectral_signature(model)
    ref_v = np.linalg.svd(wv_ref.double().numpy(), compute_uv=False)[..., 0]  # [layer, kv_head]
    ref_v = ref_v[:, view.kv_head_of.numpy()]
    ref_o = np.linalg.svd(wo_ref.double().numpy(), compute_uv=False)[..., 0]
    ds = max(np.abs(sig.W_V_norm.double().numpy() - ref_v).max(),
             np.abs(sig.W_O_norm.double().numpy() - ref_o).max())
    _record(f"{arch}/{host}/spectral", ds)
    assert ds < TOL * max(1.0, ref_v.max())


@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama_gqa", "bloom"])
def test_hosts_of_this_leg_agree_with_each_other(arch, host_model):
    """Every metric, host against host, on the same weights (the hosts this leg has)."""
    hosts = [h for h in HOSTS if _available(h, arch) is None]
    if len(hosts) < 2:
        pytest.skip(f"one host on this leg ({hosts})")
    results = {}
    for h in hosts:
        m = host_model(h, arch)
        results[h] = (residual_gain(m, PROMPTS, prepend_bos=True).block_gain,
                      sheaf_traces(m, PROMPTS, prepend_bos=True).trace,
                      spectral_signature(m).ov_norm)
    first = results[hosts[0]]
    for h in hosts[1:]:
        for name, a, b in zip(("gain", "sheaf_trace", "ov_norm"), first, results[h]):
            diff = (a.double() - b.double()).abs().max().item()
            _record(f"{arch}/{hosts[0]}-vs-{h}/{name}", diff)
            assert diff < TOL * max(1.0, a.abs().max().item()), f"{arch} {name}: {hosts[0]} vs {h}: {diff:.2e}"


# ---------------------------------------------------------------------------- processed weights
@pytest.mark.parametrize("host", ["HookedTransformer", "TransformerBridge"])
def test_processed_weights_are_detected_and_explained(host, host_model):
    raw, proc = host_model(host, "gpt2"), host_model(host, "gpt2", processed=True)
    view = ModelView(proc)
    assert view.weights_processed and view.weight_state == "processed"
    assert not ModelView(raw).weights_processed
    with pytest.warns(UserWarning, match="processed.*LayerNorm folded into W_V"):
        g = residual_gain(proc, PROMPTS)
    assert g.weights == "processed" and g.model["weights"] == "processed"
    with pytest.warns(UserWarning, match="processed"):
        spectral_signature(proc)
    # What the warning says, checked: W_V rows scaled by ln1's weight (then centred over d_model:
    # the folded LNPre centres its input anyway), W_O's writing columns centred.
    rv, pv = ModelView(raw), view
    ln_w = torch.stack([b.ln1.w.detach() if hasattr(b.ln1, "w") else b.ln1.weight.detach()
                        for b in raw.blocks])  # [layer, d_model]
    wv = rv.W_V() * ln_w[:, None, :, None]
    torch.testing.assert_close(pv.W_V(), wv - wv.mean(2, keepdim=True), atol=TOL, rtol=TOL)
    wo = rv.W_O()
    torch.testing.assert_close(pv.W_O(), wo - wo.mean(-1, keepdim=True), atol=TOL, rtol=TOL)


def test_compatibility_bridge_equals_processed_hooked_transformer(host_model):
    """TransformerLens 3.x has both: processed weights give the same numbers on both hosts."""
    if not (LEGACY and HAS_BRIDGE):
        pytest.skip("needs HookedTransformer and TransformerBridge in one TransformerLens (3.x)")
    a = host_model("HookedTransformer", "gpt2", processed=True)
    b = host_model("TransformerBridge", "gpt2", processed=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ga, gb = residual_gain(a, PROMPTS), residual_gain(b, PROMPTS)
        sa, sb = spectral_signature(a), spectral_signature(b)
    for name, x, y in (("gain", ga.block_gain, gb.block_gain), ("W_V_norm", sa.W_V_norm, sb.W_V_norm),
                       ("W_O_norm", sa.W_O_norm, sb.W_O_norm)):
        diff = (x - y).abs().max().item()
        _record(f"gpt2/processed-HookedTransformer-vs-compat-bridge/{name}", diff)
        assert diff < TOL, f"{name}: {diff:.2e}"


# ---------------------------------------------------------------------------- tokenization
def _cache_norms(model, view, prompt):
    _, cache = model.run_with_cache(prompt)
    return torch.stack([cache[n][0].float().norm(dim=-1) for n in view.resid_hook_names])  # [L+1, pos]


@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama_gqa", "bert"])
@pytest.mark.parametrize("host", HOSTS)
def test_default_bos_matches_run_with_cache(host, arch, host_model):
    """By default, thermo-lens' per-token norms are run_with_cache(prompt)'s, on every host."""
    model = host_model(host, arch)
    view = ModelView(model)
    c = collect(model, PROMPTS, [residual_norms], prepend_bos="host", batch_size=3)
    norms = c.stack("resid_norm")  # [L+1, prompt, pos]
    for p, prompt in enumerate(PROMPTS):
        ref = _cache_norms(model, view, prompt)
        n = int(c.lengths[p])
        assert ref.shape[1] == n, f"{host} {arch}: token counts differ from run_with_cache"
        diff = (norms[:, p, :n] - ref).abs().max().item() / ref.abs().max().item()
        _record(f"{arch}/{host}/default_bos_vs_run_with_cache(rel)", diff)
        assert diff < TOL
    expected = bool(getattr(model.cfg, "default_prepend_bos", True))
    assert c.prepend_bos is expected  # resolved, recorded
    assert residual_gain(model, PROMPTS).prepend_bos is expected


def test_bert_host_mode_is_cls_sep_and_true_is_cls_not_unk(tmp_path):
    if not HAS_BRIDGE:
        pytest.skip("BERT runs on the TransformerBridge (TransformerLens >= 3)")
    from transformer_lens.model_bridge import TransformerBridge

    model = TransformerBridge.boot_transformers(str(make_checkpoint("bert", tmp_path / "bert", tokenizer="wordpiece")))
    tok = model.tokenizer
    view = ModelView(model)
    prompt = PROMPTS[0]
    plain = tok(prompt, add_special_tokens=False)["input_ids"]
    batch = tokenize(view, [prompt], prepend_bos="host")
    assert batch.tokens[0].tolist() == [tok.cls_token_id] + plain + [tok.sep_token_id]
    assert batch.tokens[0].tolist() == model.to_tokens(prompt)[0].tolist()
    assert batch.prepend_bos == "host:[CLS]+text+[SEP]"
    assert tokenize(view, [prompt], prepend_bos=True).tokens[0].tolist() == [tok.cls_token_id] + plain
    assert tok.cls_token_id != tok.unk_token_id
    g = residual_gain(model, PROMPTS)
    assert g.prepend_bos == "host:[CLS]+text+[SEP]"
    ref = _cache_norms(model, view, prompt)
    c = collect(model, [prompt], [residual_norms], prepend_bos="host")
    torch.testing.assert_close(c.stack("resid_norm")[:, 0], ref, atol=TOL, rtol=TOL)


# ---------------------------------------------------------------------------- unsupported hosts
@pytest.fixture
def any_host_gpt2(host_model):
    """The gpt2 fixture on the first host this leg has."""
    return host_model(next(h for h in HOSTS if _available(h, "gpt2") is None), "gpt2")


def test_unsupported_transformer_lens_version_is_refused(any_host_gpt2, monkeypatch):
    model = any_host_gpt2
    kind = detect_host(model).kind
    with pytest.raises(UnsupportedHostError, match=r"TransformerLens 2\.10\.0.*>=2\.16\.1,<5.*pip install"):
        detect_host(model, version="2.10.0")
    with pytest.raises(UnsupportedHostError, match=r"TransformerLens 5\.0\.0.*pip install 'transformer-lens>=2\.16\.1,<5'"):
        detect_host(model, version="5.0.0")
    monkeypatch.setattr("thermo_lens.core.host.transformer_lens_version", lambda: "2.15.4")
    with pytest.raises(UnsupportedHostError, match="2.15.4"):
        residual_gain(model, PROMPTS)
    assert detect_host(model, version="3.9.0").kind == kind


def test_encoder_decoder_is_refused_with_what_to_load_instead():
    """HookedEncoder is read (tests/measures/test_attribution.py); an encoder-decoder is not one stream."""
    HookedEncoderDecoder = type("HookedEncoderDecoder", (torch.nn.Module,),
                                {"__module__": "transformer_lens.HookedEncoderDecoder"})
    enc = HookedEncoderDecoder()
    enc.cfg, enc.blocks, enc.tokenizer = object(), [], object()
    enc.run_with_hooks = lambda *a, **k: None
    with pytest.raises(UnsupportedHostError, match="HookedEncoderDecoder.*not one residual stream.*boot_transformers"):
        residual_gain(enc, PROMPTS)


def test_bad_bos_mode_names_the_modes(any_host_gpt2):
    with pytest.raises(ThermoLensInputError, match='"host", True, False or "tokenizer"'):
        residual_gain(any_host_gpt2, PROMPTS, prepend_bos="bos")


def test_bridge_only_features_say_what_to_do_on_tl2():
    if HAS_BRIDGE:
        pytest.skip("this TransformerLens has a TransformerBridge")
    from thermo_lens import zoo

    with pytest.raises(UnsupportedHostError, match=r"zoo.load boots a TransformerBridge.*TransformerLens >= 3.*zoo.load\(name, host='hooked'\)"):
        zoo.load("gpt2-tiny-wd")
    # ...and the suggested route works: the embedded model as a HookedTransformer.
    model = zoo.load("gpt2-tiny-wd", host="hooked")
    g = residual_gain(model, PROMPTS)
    assert g.prepend_bos is True and g.model["host"].startswith("HookedTransformer (TransformerLens 2.")


def test_zoo_neox_default_matches_run_with_cache_where_true_does_not(host_model):
    """The NeoX zoo model has cfg.default_prepend_bos=False: the default follows it (the old
    prepend_bos=True default differed from run_with_cache by several percent)."""
    if not HAS_BRIDGE:
        pytest.skip("the zoo boots TransformerBridges (TransformerLens >= 3)")
    from thermo_lens import zoo

    model = zoo.load("neox-tiny")
    assert model.cfg.default_prepend_bos is False
    view = ModelView(model)
    prompts = PROMPTS[:1] + PROMPTS[2:]
    ref = []
    for prompt in prompts:
        n = _cache_norms(model, view, prompt).double()
        ref.append((n[1:, 1:] / n[:-1, 1:]).mean(-1))
    ref = torch.stack(ref)
    g = residual_gain(model, prompts)
    assert g.prepend_bos is False
    diff = (g.block_gain.double() - ref).abs().max().item()
    _record("neox-tiny-zoo/TransformerBridge/default_gain_vs_run_with_cache", diff)
    assert diff < TOL * ref.abs().max().item()
    forced = residual_gain(model, prompts, prepend_bos=True)
    assert ((forced.block_gain.double() - ref).abs() / ref).max() > 0.01


def test_a_host_that_skips_hooks_gets_an_error_not_a_partial_result(any_host_gpt2, monkeypatch):
    model = any_host_gpt2
    real = model.run_with_hooks

    def skipping(*args, fwd_hooks=(), **kwargs):  # a host that drops the resid_pre hooks unseen
        kept = [(n, f) for n, f in fwd_hooks if not str(n).endswith("hook_resid_pre")]
        return real(*args, fwd_hooks=kept, **kwargs)
    monkeypatch.setattr(model, "run_with_hooks", skipping)
    with pytest.raises(ThermoLensInputError, match=r"never ran thermo-lens' hooks at blocks\.0\.hook_resid_pre"):
        residual_gain(model, PROMPTS)


# ---------------------------------------------------------------------------- early stop
@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("arch", ["gpt2", "llama_gqa"])
def test_passes_end_after_the_last_block_with_the_numbers_of_a_full_forward(host, arch, host_model, monkeypatch):
    """No metric reads the logits: a pass ends at the last block's hook_resid_post (the final norm
    and, on the bridge, the unembedding never run; HookedTransformer skips the unembedding by
    itself for return_type=None), and gives bit-identical numbers to one that runs to the end."""
    m = host_model(host, arch)
    calls: list[str] = []
    handle = m.ln_final.register_forward_hook(lambda *a: calls.append("ln_final"))
    try:
        stopped = residual_gain(m, PROMPTS, batch_size=3, per_token=True)
        stopped_traces = sheaf_traces(m, PROMPTS, batch_size=3)
        assert calls == [], "the final norm ran although nothing reads what follows the blocks"
        with monkeypatch.context() as mp:
            mp.setattr(ModelView, "last_hook_needed", lambda self, names: None)
            full = residual_gain(m, PROMPTS, batch_size=3, per_token=True)
            full_traces = sheaf_traces(m, PROMPTS, batch_size=3)
        assert calls, "the reference run did not run the whole forward"
        assert torch.equal(stopped.block_gain, full.block_gain)
        assert torch.equal(stopped.per_token_gain.nan_to_num(-1.0), full.per_token_gain.nan_to_num(-1.0))
        assert torch.equal(stopped_traces.trace, full_traces.trace)
    finally:
        handle.remove()


@pytest.mark.parametrize("host", HOSTS)
def test_a_user_hook_past_the_last_block_runs_the_whole_forward(host, host_model):
    """A user hook after the blocks (or a name filter, which could match one) still fires: then
    the pass is not cut short."""
    m = host_model(host, "gpt2")
    seen: list[str] = []

    def at_ln_final(x, hook):
        seen.append(hook.name)

    residual_gain(m, PROMPTS[:2], fwd_hooks=[("ln_final.hook_normalized", at_ln_final)])
    assert seen == ["ln_final.hook_normalized"]
    seen.clear()
    residual_gain(m, PROMPTS[:2], fwd_hooks=[(lambda name: name == "ln_final.hook_normalized", at_ln_final)])
    assert seen == ["ln_final.hook_normalized"]
    view = ModelView(m)
    last = view.n_layers - 1
    assert view.last_hook_needed(["blocks.0.hook_resid_pre", f"blocks.{last}.attn.hook_pattern"]) == \
        f"blocks.{last}.hook_resid_post"
    assert view.last_hook_needed(["blocks.1.attn.hook_z", "blocks.0.hook_resid_pre"]) == "blocks.1.hook_resid_post"
    assert view.last_hook_needed(["blocks.0.hook_resid_pre", "ln_final.hook_normalized"]) is None
    assert view.last_hook_needed(["blocks.0.hook_resid_pre"]) == "blocks.0.hook_resid_post"
    assert view.last_hook_needed(["hook_embed"]) is None and view.last_hook_needed([]) is None
