"""Token ids of any integer dtype are token ids; every token_scope goes through one check
(thermo_lens.core.tokens.check_token_scope), so no entry point lets an unknown scope through."""

from __future__ import annotations

import pytest
import torch

import thermo_lens as tl
from thermo_lens.core.errors import ThermoLensInputError

PROMPTS = ["The cat sat", "A dog ran in the park"]


def test_token_ids_of_any_integer_dtype(bridge):
    m = bridge("gpt2")
    tokens = m.to_tokens(PROMPTS)
    small = tokens.clamp(max=127)  # ids that fit an int8 (this vocabulary has 300, which a uint8 wraps to 44)
    want = tl.residual_gain(m, small).block_gain
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32):
        torch.testing.assert_close(tl.residual_gain(m, small.to(dtype)).block_gain, want, rtol=0, atol=0)
    for dtype in ("uint8", "uint16", "int32", "int64"):
        torch.testing.assert_close(tl.residual_gain(m, small.numpy().astype(dtype)).block_gain, want, rtol=0, atol=0)
    with pytest.raises(ThermoLensInputError, match=r"integer tensor \[batch, pos\] \(any integer dtype\).*float32"):
        tl.residual_gain(m, tokens.float())
    with pytest.raises(ThermoLensInputError, match=r"token id\(s\) \[300\] are outside the model's vocabulary 0..299"):
        tl.residual_gain(m, torch.full((1, 3), 300, dtype=torch.int16))


@pytest.mark.parametrize("call", [
    lambda m, p, s: tl.sheaf_traces(m, p, token_scope=s),
    lambda m, p, s: tl.residual_gain(m, p, token_scope=s),
    lambda m, p, s: tl.gain_attribution(m, p, token_scope=s),
    lambda m, p, s: __import__("thermo_lens.measures.write_norm").write_norm.write_norms(m, p, token_scope=s),
    lambda m, p, s: tl.run(m, p, ["gain", "sheaf"], token_scope=s),
    lambda m, p, s: tl.anisotropy_profile(m, p, token_scope=s),
])
def test_an_unknown_token_scope_is_refused_everywhere(bridge, call):
    m = bridge("gpt2")
    for bad in ("x", 3, ["last"], "y" * 10**5):
        with pytest.raises(ThermoLensInputError, match="unknown token_scope .*must be one of") as e:
            call(m, PROMPTS, bad)
        assert len(str(e.value)) < 400


def test_a_scope_for_a_measurement_without_one_is_refused(bridge):
    m = bridge("gpt2")
    with pytest.raises(ThermoLensInputError, match="sheaf take.* no token scope.*drop token_scope"):
        tl.sheaf_traces(m, PROMPTS, token_scope="all")
    # the attribution has no frobenius form: its own reason
    with pytest.raises(ThermoLensInputError, match="frobenius' is a ratio of whole-sequence norms"):
        tl.gain_attribution(m, PROMPTS, token_scope="frobenius")
    assert tl.run(m, PROMPTS, ["gain", "sheaf"], token_scope="last").gain.token_scope == "last"
