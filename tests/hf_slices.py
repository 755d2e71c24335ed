"""Independent per-head W_Q / W_K / W_V / W_O slices written from each HuggingFace layout.

These read the HF state dict directly (not through TransformerLens) so tests can check that
ModelView / the bridge slice fused and interleaved QKV projections correctly. Also the HF
modules the architecture matrix (``tests/models/test_architectures.py``) hooks: each family's decoder
layers, the attention output projection (whose input is the per-head ``z``) and its norms.
Returned shapes: W_V ``[n_kv_heads, d_model, d_head]``, W_O ``[n_heads, d_head, d_model]``,
W_Q ``[n_heads, d_model, d_head]``, W_K ``[n_kv_heads, d_model, d_head]``
(TransformerLens convention: ``v = x @ W_V``, ``out = z @ W_O``).
"""

import torch


def _linear_v(w, n, dh):  # nn.Linear weight [n*dh, d_model] -> [n, d_model, dh]
    return w.reshape(n, dh, -1).transpose(1, 2)


def _linear_o(w, n, dh):  # nn.Linear weight [d_model, n*dh] -> [n, dh, d_model]
    return w.T.reshape(n, dh, -1)


#: Families laid out like LLaMA: model.layers.{l}.self_attn.{q,k,v,o}_proj.
LLAMA_LIKE = ("llama_gqa", "gemma", "mistral", "qwen2", "qwen3", "mixtral", "stablelm", "gemma2", "gemma3",
              "olmo2", "granite", "gpt_oss")


def _geometry(c):
    n = getattr(c, "num_attention_heads", None) or c.n_head
    d = getattr(c, "hidden_size", None) or c.n_embd
    nkv = getattr(c, "num_key_value_heads", None) or n
    dh = getattr(c, "head_dim", None) or d // n
    return n, nkv, d, dh


def _bert_prefix(sd):
    return "bert.encoder" if any(k.startswith("bert.") for k in sd) else "encoder"


def hf_head_weights(arch, hf, layer):
    """(W_V, W_O, meta) of one layer from the HF model's own parameters."""
    c = hf.config
    sd = {k: v.detach().float() for k, v in hf.state_dict().items()}
    if arch == "gpt2":
        n, d = c.n_head, c.n_embd
        dh = d // n
        w = sd[f"transformer.h.{layer}.attn.c_attn.weight"]  # Conv1D [d, 3d]: x @ w
        wv = w[:, 2 * d:].reshape(d, n, dh).permute(1, 0, 2)
        wo = sd[f"transformer.h.{layer}.attn.c_proj.weight"].reshape(n, dh, d)
        return wv, wo, dict(n=n, nkv=n, d=d, dh=dh)
    if arch == "neox":
        n, d = c.num_attention_heads, c.hidden_size
        dh = d // n
        w = sd[f"gpt_neox.layers.{layer}.attention.query_key_value.weight"]  # [3d, d], per-head (q,k,v)
        wv = w.reshape(n, 3, dh, d)[:, 2].transpose(1, 2)
        wo = _linear_o(sd[f"gpt_neox.layers.{layer}.attention.dense.weight"], n, dh)
        return wv, wo, dict(n=n, nkv=n, d=d, dh=dh)
    if arch == "bloom":
        n, d = c.n_head, c.hidden_size
        dh = d // n
        w = sd[f"transformer.h.{layer}.self_attention.query_key_value.weight"]
        wv = w.reshape(n, 3, dh, d)[:, 2].transpose(1, 2)
        wo = _linear_o(sd[f"transformer.h.{layer}.self_attention.dense.weight"], n, dh)
        return wv, wo, dict(n=n, nkv=n, d=d, dh=dh)
    if arch == "falcon":  # multi-query: [q (n*dh) ; k (dh) ; v (dh)]
        n, d = c.num_attention_heads, c.hidden_size
        dh = d // n
        w = sd[f"transformer.h.{layer}.self_attention.query_key_value.weight"]
        wv = w[n * dh + dh:].reshape(1, dh, d).transpose(1, 2)
        wo = _linear_o(sd[f"transformer.h.{layer}.self_attention.dense.weight"], n, dh)
        return wv, wo, dict(n=n, nkv=1, d=d, dh=dh)
    if arch in ("opt", "opt_postln"):
        n, d = c.num_attention_heads, c.hidden_size
        dh = d // n
        p = f"model.decoder.layers.{layer}.self_attn"
        return (_linear_v(sd[f"{p}.v_proj.weight"], n, dh), _linear_o(sd[f"{p}.out_proj.weight"], n, dh),
                dict(n=n, nkv=n, d=d, dh=dh))
    if arch in LLAMA_LIKE:
        n, nkv, d, dh = _geometry(c)
        p = f"model.layers.{layer}.self_attn"
        return (_linear_v(sd[f"{p}.v_proj.weight"], nkv, dh), _linear_o(sd[f"{p}.o_proj.weight"], n, dh),
                dict(n=n, nkv=nkv, d=d, dh=dh))
    if arch == "phi3":  # fused qkv_proj rows: [q (n*dh) ; k (nkv*dh) ; v (nkv*dh)]
        n, nkv, d, dh = _geometry(c)
        p = f"model.layers.{layer}.self_attn"
        w = sd[f"{p}.qkv_proj.weight"]
        return (_linear_v(w[(n + nkv) * dh:], nkv, dh), _linear_o(sd[f"{p}.o_proj.weight"], n, dh),
                dict(n=n, nkv=nkv, d=d, dh=dh))
    if arch == "gptj":
        n, d = c.n_head, c.n_embd
        dh = d // n
        p = f"transformer.h.{layer}.attn"
        return (_linear_v(sd[f"{p}.v_proj.weight"], n, dh), _linear_o(sd[f"{p}.out_proj.weight"], n, dh),
                dict(n=n, nkv=n, d=d, dh=dh))
    if arch in ("bert", "minilm"):
        n, d = c.num_attention_heads, c.hidden_size
        dh = d // n
        p = f"{_bert_prefix(sd)}.layer.{layer}.attention"
        return (_linear_v(sd[f"{p}.self.value.weight"], n, dh), _linear_o(sd[f"{p}.output.dense.weight"], n, dh),
                dict(n=n, nkv=n, d=d, dh=dh))
    raise KeyError(arch)


def hf_n_layers(hf):
    c = hf.config
    return getattr(c, "num_hidden_layers", None) or c.n_layer


def hf_all_head_weights(arch, hf):
    """Stacked over layers: W_V [L, n_kv, d_model, d_head], W_O [L, n, d_head, d_model]."""
    wvs, wos = zip(*[hf_head_weights(arch, hf, l)[:2] for l in range(hf_n_layers(hf))])
    return torch.stack(wvs), torch.stack(wos)


def hf_qk_weights(arch, hf, layer):
    """(W_Q, W_K) of one layer from the HF model's own parameters (``q = x @ W_Q``, ``k = x @ W_K``)."""
    c = hf.config
    sd = {k: v.detach().float() for k, v in hf.state_dict().items()}
    if arch == "gpt2":
        n, d = c.n_head, c.n_embd
        dh = d // n
        w = sd[f"transformer.h.{layer}.attn.c_attn.weight"]  # Conv1D [d, 3d]: [q | k | v]
        return (w[:, :d].reshape(d, n, dh).permute(1, 0, 2), w[:, d:2 * d].reshape(d, n, dh).permute(1, 0, 2))
    if arch in ("neox", "bloom"):
        n, d = (c.num_attention_heads, c.hidden_size) if arch == "neox" else (c.n_head, c.hidden_size)
        dh = d // n
        key = (f"gpt_neox.layers.{layer}.attention.query_key_value.weight" if arch == "neox"
               else f"transformer.h.{layer}.self_attention.query_key_value.weight")
        w = sd[key].reshape(n, 3, dh, d)  # interleaved per head: (q, k, v)
        return w[:, 0].transpose(1, 2), w[:, 1].transpose(1, 2)
    if arch == "falcon":  # multi-query: [q (n*dh) ; k (dh) ; v (dh)]
        n, d = c.num_attention_heads, c.hidden_size
        dh = d // n
        w = sd[f"transformer.h.{layer}.self_attention.query_key_value.weight"]
        return (w[:n * dh].reshape(n, dh, d).transpose(1, 2),
                w[n * dh:n * dh + dh].reshape(1, dh, d).transpose(1, 2))
    if arch in ("opt", "opt_postln", "gptj"):
        n, d = (c.num_attention_heads, c.hidden_size) if arch != "gptj" else (c.n_head, c.n_embd)
        dh = d // n
        p = f"model.decoder.layers.{layer}.self_attn" if arch != "gptj" else f"transformer.h.{layer}.attn"
        return _linear_v(sd[f"{p}.q_proj.weight"], n, dh), _linear_v(sd[f"{p}.k_proj.weight"], n, dh)
    if arch in LLAMA_LIKE:
        n, nkv, d, dh = _geometry(c)
        p = f"model.layers.{layer}.self_attn"
        return _linear_v(sd[f"{p}.q_proj.weight"], n, dh), _linear_v(sd[f"{p}.k_proj.weight"], nkv, dh)
    if arch == "phi3":
        n, nkv, d, dh = _geometry(c)
        w = sd[f"model.layers.{layer}.self_attn.qkv_proj.weight"]
        return _linear_v(w[:n * dh], n, dh), _linear_v(w[n * dh:(n + nkv) * dh], nkv, dh)
    if arch in ("bert", "minilm"):
        n, d = c.num_attention_heads, c.hidden_size
        dh = d // n
        p = f"{_bert_prefix(sd)}.layer.{layer}.attention.self"
        return _linear_v(sd[f"{p}.query.weight"], n, dh), _linear_v(sd[f"{p}.key.weight"], n, dh)
    raise KeyError(arch)


def hf_all_qk_weights(arch, hf):
    """Stacked over layers: W_Q [L, n, d_model, d_head], W_K [L, n_kv, d_model, d_head]."""
    wqs, wks = zip(*[hf_qk_weights(arch, hf, l) for l in range(hf_n_layers(hf))])
    return torch.stack(wqs), torch.stack(wks)


# ---------------------------------------------------------------------------- modules to hook
def hf_layers(hf):
    """The HF model's decoder / encoder layers (the ``ModuleList`` TransformerLens' blocks wrap)."""
    n = hf_n_layers(hf)
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and name.endswith(("layers", "h", "layer")):
            return list(mod)
    raise KeyError(f"no layer list in {type(hf).__name__}")


def hf_out_proj(arch, layer_module):
    """The attention output projection of one HF layer (its input is the per-head ``z``,
    ``[..., head * d_head]``): ``(module, W_O [n*d_head, d_model] as x @ W, bias or None)``."""
    if arch == "gpt2":
        m = layer_module.attn.c_proj  # Conv1D: x @ weight
        return m, m.weight.detach().float(), m.bias.detach().float()
    m = {"neox": lambda L: L.attention.dense, "bloom": lambda L: L.self_attention.dense,
         "falcon": lambda L: L.self_attention.dense, "opt": lambda L: L.self_attn.out_proj,
         "opt_postln": lambda L: L.self_attn.out_proj, "gptj": lambda L: L.attn.out_proj,
         "bert": lambda L: L.attention.output.dense, "minilm": lambda L: L.attention.output.dense,
         }.get(arch, lambda L: L.self_attn.o_proj)(layer_module)
    b = None if m.bias is None else m.bias.detach().float()
    return m, m.weight.detach().float().T, b


def hf_norms(arch, layer_module):
    """The norms between the attention / MLP output and the layer output, by role: sandwich
    ``{"attn": post-attention norm, "mlp": post-MLP norm}``, post-LN ``{"L1": ..., "L2": ...}``,
    else ``{}``."""
    if arch in ("gemma2", "gemma3", "olmo2"):
        return {"attn": layer_module.post_attention_layernorm, "mlp": layer_module.post_feedforward_layernorm}
    if arch in ("bert", "minilm"):
        return {"L1": layer_module.attention.output.LayerNorm, "L2": layer_module.output.LayerNorm}
    if arch == "opt_postln":
        return {"L1": layer_module.self_attn_layer_norm, "L2": layer_module.final_layer_norm}
    return {}
