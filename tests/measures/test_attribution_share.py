"""What the attribution's head term is and is not: a Shapley share of the squared-norm change, not
an ablation effect (``thermo_lens.definitions`` §1, the attribution paragraph).

A hand-made counterexample on a real model: two heads of block 0 write opposite, unequal outputs
(head 1 = -0.75 x head 0, scaled up), the block's MLP and output biases are zeroed. Head 0's share
of ``||x_out||^2 - ||x_in||^2`` is positive, yet ablating it *raises* the squared norm: the share
gives each head half of the (negative) cross term, the ablation removes all of it.
"""

from __future__ import annotations

import pytest
import torch

import thermo_lens as tl

pytestmark = pytest.mark.slow  # builds, edits and boots its own checkpoint

PROMPTS = ["The capital of France is", "Water boils at one hundred degrees", "the early bird catches"]


def _opposed_heads(tmp_path, scale: float = 30.0):
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    from thermo_lens.testing import make_checkpoint

    d = make_checkpoint("gpt2", tmp_path / "opposed")
    hf = transformers.GPT2LMHeadModel.from_pretrained(d).eval()
    cfg = hf.config
    D, dh = cfg.n_embd, cfg.n_embd // cfg.n_head
    blk = hf.transformer.h[0]
    with torch.no_grad():
        qkv = blk.attn.c_attn.weight  # [D, 3D] (Conv1D: x @ W), head h at columns h*dh:(h+1)*dh of each third
        for part in range(3):
            o = part * D
            qkv[:, o + dh: o + 2 * dh] = qkv[:, o: o + dh]  # head 1 reads exactly as head 0: z_1 = z_0
            blk.attn.c_attn.bias[o + dh: o + 2 * dh] = blk.attn.c_attn.bias[o: o + dh]
        W_O = blk.attn.c_proj.weight  # [D, D]: rows h*dh:(h+1)*dh are W_O^h
        W_O[:dh] *= scale
        W_O[dh: 2 * dh] = -0.75 * W_O[:dh]                  # head 1 writes -0.75 x head 0
        blk.attn.c_proj.bias.zero_()
        blk.mlp.c_proj.weight.zero_()
        blk.mlp.c_proj.bias.zero_()
    hf.save_pretrained(d)
    return TransformerBridge.boot_transformers(str(d))


def test_positive_share_whose_ablation_raises_the_norm(tmp_path):
    model = _opposed_heads(tmp_path)
    attr = tl.gain_attribution(model, PROMPTS, token_scope="all")

    def ablate(z, hook):
        z[:, :, 0] = 0.0
        return z

    abl = tl.gain_attribution(model, PROMPTS, token_scope="all", fwd_hooks=[("blocks.0.attn.hook_z", ablate)])
    share = attr.head[:, 0, 0]                       # [prompt] head 0's share in the intact run
    effect = attr.total[:, 0] - abl.total[:, 0]      # [prompt] what ablating head 0 changes
    assert (share > 0).all(), share
    assert (effect < 0).all(), effect               # ablating a head with a positive share raises the norm
    # and the gap is the cross term, exactly: share - effect = -<o_0, o_1> (the other half of 2<o_0, o_1>)
    _, cache = model.run_with_cache(PROMPTS[0])
    W_O = model.blocks[0].attn.W_O.detach().double()  # [head, d_head, d_model]
    z = cache["blocks.0.attn.hook_z"][0].double()      # [pos, head, d_head]
    o0, o1 = z[:, 0] @ W_O[0], z[:, 1] @ W_O[1]        # [pos, d_model]
    cross = (o0 * o1).sum(-1).mean()
    assert torch.allclose(o1, -0.75 * o0, rtol=1e-4, atol=1e-4 * float(o0.abs().max()))
    gap = float(share[0] - effect[0])
    assert gap == pytest.approx(-float(cross), rel=2e-3)
    assert float(attr.head[0, 0, 1]) < 0  # head 1's share: negative
