"""NaN and inf are never returned as numbers: a NaN activation in a cache, a logit measure that
returns NaN, NaN weights under a logit measure, are refused with the block, hook or rows named
(a closure check ``rel > rtol`` is False for NaN: every check here is NaN-aware)."""

from __future__ import annotations

import pytest
import torch

import thermo_lens as tl
from thermo_lens.core.errors import ThermoLensError, ThermoLensNumericsError
from thermo_lens.experiments.sweeps import LogitDifference, ablation_sweep

PROMPTS = ["The capital of France is Paris", "Water freezes at zero"]
TOKENS = torch.tensor([[3, 5, 17, 33, 41, 9], [7, 2, 11, 13, 19, 23]])


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_nan_hook_z_in_a_cache_is_refused_naming_the_block(bridge, value):
    m = bridge("gpt2")
    tokens = m.to_tokens(PROMPTS)
    _, cache = m.run_with_cache(tokens)
    cache.cache_dict["blocks.1.attn.hook_z"] = cache["blocks.1.attn.hook_z"].clone()
    cache.cache_dict["blocks.1.attn.hook_z"][1, 2, 0, 0] = value
    with pytest.raises(ThermoLensNumericsError, match=r"head term of block 1 is NaN/inf for prompt 1 .*blocks\.1\.attn\.hook_z"):
        tl.gain_attribution(m, tokens, cache=cache)
    with pytest.raises(ThermoLensNumericsError, match="block 1"):
        tl.run(m, tokens, ["gain", "attribution"], cache=cache)


def test_a_logit_measure_returning_nan_or_inf_is_refused(bridge):
    m = bridge("gpt2")

    def nan_measure(logits):
        out = logits[:, -1, 5] - logits[:, -1, 7]
        return out / (out - out)  # 0/0: NaN for every prompt
    # NaN already without any condition: the sweep refuses, naming the prompts (a NaN only under a
    # cell would be kept as a NaN cell named in the sweep's notes)
    with pytest.raises(ThermoLensError, match=r"not a finite number for prompt\(s\) \[0, 1\] without any condition"):
        ablation_sweep(m, TOKENS, "attn.hook_z", measure=nan_measure, layers=[0], heads=[0])


def test_nan_weights_under_a_logit_measure_are_refused(bridge):
    m = bridge("gpt2")
    weight = m.blocks[1].mlp.out.weight
    keep = weight.detach().clone()
    with torch.no_grad():
        weight[0, 0] = float("nan")
    try:
        ld = LogitDifference(5, 7)
        with pytest.raises(ThermoLensNumericsError, match="logits themselves hold NaN/inf"):
            ablation_sweep(m, TOKENS, "attn.hook_z", measure=ld.on_logits, layers=[0], heads=[0])
        with pytest.raises(ThermoLensNumericsError, match=r"NaN/inf at blocks\.2\.hook_resid_post \(layer 2\)"):
            ablation_sweep(m, TOKENS, "attn.hook_z", measure=ld, layers=[0], heads=[0])
    finally:
        with torch.no_grad():
            weight.copy_(keep)
