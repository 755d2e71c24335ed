"""Independent per-head W_Q / W_K / W_V / W_O slices written from each HuggingFace layout.

These read the HF state dict directly (not through TransformerLens) so tests can check that
ModelView / the bridge slice fused and interleaved QKV projections correctly.
Returned shapes: W_V ``[n_kv_heads, d_model, d_head]``, W_O ``[n_heads, d_head, d_model]``,
W_Q ``[n_heads, d_model, d_head]``, W_K ``[n_kv_heads, d_model, d_head]``
(TransformerLens convention: ``v = x @ W_V``, ``out = z @ W_O``).
"""

import torch


def _linear_v(w, n, dh):  # nn.Linear weight [n*dh, d_model] -> [n, d_model, dh]
    return w.reshape(n, dh, -1).transpose(1, 2)


def _linear_o(w, n, dh):  # nn.Linear weight [d_model, n*dh] -> [n, dh, d_model]
    return w.T.reshape(n, dh, -1)


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
    if arch in ("llama_gqa", "gemma"):
        n, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.hidden_size
        dh = getattr(c, "head_dim", None) or d // n
        p = f"model.layers.{layer}.self_attn"
        return (_linear_v(sd[f"{p}.v_proj.weight"], nkv, dh), _linear_o(sd[f"{p}.o_proj.weight"], n, dh),
                dict(n=n, nkv=nkv, d=d, dh=dh))
    if arch == "gptj":
        n, d = c.n_head, c.n_embd
        dh = d // n
        p = f"transformer.h.{layer}.attn"
        return (_linear_v(sd[f"{p}.v_proj.weight"], n, dh), _linear_o(sd[f"{p}.out_proj.weight"], n, dh),
                dict(n=n, nkv=n, d=d, dh=dh))
    if arch == "bert":
        n, d = c.num_attention_heads, c.hidden_size
        dh = d // n
        p = f"bert.encoder.layer.{layer}.attention"
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
    if arch in ("llama_gqa", "gemma"):
        n, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.hidden_size
        dh = getattr(c, "head_dim", None) or d // n
        p = f"model.layers.{layer}.self_attn"
        return _linear_v(sd[f"{p}.q_proj.weight"], n, dh), _linear_v(sd[f"{p}.k_proj.weight"], nkv, dh)
    if arch == "bert":
        n, d = c.num_attention_heads, c.hidden_size
        dh = d // n
        p = f"bert.encoder.layer.{layer}.attention.self"
        return _linear_v(sd[f"{p}.query.weight"], n, dh), _linear_v(sd[f"{p}.key.weight"], n, dh)
    raise KeyError(arch)


def hf_all_qk_weights(arch, hf):
    """Stacked over layers: W_Q [L, n, d_model, d_head], W_K [L, n_kv, d_model, d_head]."""
    wqs, wks = zip(*[hf_qk_weights(arch, hf, l) for l in range(hf_n_layers(hf))])
    return torch.stack(wqs), torch.stack(wks)
