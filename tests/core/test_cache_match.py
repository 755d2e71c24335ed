"""A ``cache=`` is measured only when it was made from the given tokens, by the given model, with
the pads masked (thermo_lens.core.cache_match): a cache of other prompts, of the same prompts reversed,
of a twin model or of an unmasked padded encoder batch is refused, never measured under the
given prompts' names."""

from __future__ import annotations

import pytest
import torch

import thermo_lens as tl
from thermo_lens.core.errors import ThermoLensInputError

PROMPTS = ["The capital of France is Paris", "Water freezes at zero", "the early bird catches",
           "Colorless green ideas sleep"]


@pytest.fixture(scope="module")
def twin(checkpoint_dir):
    """A second GPT-2 booted from the same checkpoint (another object, the same parameters)."""
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")), device="cpu")


@pytest.mark.parametrize("arch", ["gpt2", "neox"])
def test_a_cache_of_the_prompts_reversed_is_refused_and_named(bridge, arch):
    m = bridge(arch)
    tokens = m.to_tokens(PROMPTS)
    _, cache = m.run_with_cache(tokens)
    g = tl.residual_gain(m, tokens, cache=cache)
    assert "tokens matched exactly" in g.provenance.cache_match
    assert "this model (the same object)" in g.provenance.cache_match
    assert "tokens matched exactly" in repr(g)
    assert type(g).from_json(g.to_json()).provenance.cache_match == g.provenance.cache_match
    assert tl.residual_gain(m, tokens).provenance.cache_match == ""  # a forward pass: no cache
    for fn in (tl.residual_gain, tl.sheaf_traces, tl.gain_attribution):
        with pytest.raises(ThermoLensInputError, match=r"row 0 holds prompt 3's tokens.*another order"):
            fn(m, tokens.flip(0), cache=cache)


def test_a_cache_of_other_prompts_of_the_same_length_is_refused(bridge):
    m = bridge("gpt2")
    tokens = m.to_tokens(PROMPTS)
    _, cache = m.run_with_cache(tokens)
    other = tokens.clone()
    real = other[1] != 0
    real[0] = False
    other[1, real] = (other[1, real] + 1) % m.cfg.d_vocab  # prompt 1: other tokens, the same length
    with pytest.raises(ThermoLensInputError, match=r"1 of 4 row\(s\): row 1 matches none"):
        tl.residual_gain(m, other, cache=cache)
    # from text: the same check on the tokens run_with_cache made of them
    _, cache_s = m.run_with_cache(PROMPTS)
    with pytest.raises(ThermoLensInputError, match="not made from these tokens"):
        tl.sheaf_traces(m, PROMPTS[::-1], cache=cache_s)
    assert tl.sheaf_traces(m, PROMPTS, cache=cache_s).provenance.cache_match.startswith("made by this model")


def test_a_twin_models_cache_is_refused_and_an_identical_copy_accepted(bridge, twin):
    m = bridge("gpt2")
    tokens = m.to_tokens(PROMPTS)
    _, cache = twin.run_with_cache(tokens)
    g = tl.residual_gain(m, tokens, cache=cache)  # the same parameters: the same numbers
    assert "another model object with exactly the same parameters" in g.provenance.cache_match
    torch.testing.assert_close(g.block_gain, tl.residual_gain(m, tokens).block_gain, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        twin.blocks[1].mlp.out.weight.mul_(1.5)  # a twin differing after the embedding only
    try:
        _, cache = twin.run_with_cache(tokens)
        with pytest.raises(ThermoLensInputError, match="made by another model .* other parameters"):
            tl.residual_gain(m, tokens, cache=cache)
        with pytest.raises(ThermoLensInputError, match="made by another model"):
            tl.sheaf_traces(m, tokens, cache=cache)
    finally:
        with torch.no_grad():
            twin.blocks[1].mlp.out.weight.div_(1.5)


def test_a_plain_dict_is_checked_by_its_embedding_and_another_architecture_refused(bridge, twin):
    m = bridge("gpt2")
    tokens = m.to_tokens(PROMPTS)
    _, cache = m.run_with_cache(tokens)
    got = tl.residual_gain(m, tokens, cache=dict(cache.cache_dict))
    assert "not recorded by the cache" in got.provenance.cache_match
    with torch.no_grad():
        twin.embed.weight.add_(0.01)
    try:
        _, other = twin.run_with_cache(tokens)
    finally:
        with torch.no_grad():
            twin.embed.weight.sub_(0.01)
    with pytest.raises(ThermoLensInputError, match="4 of 4 row.*with the model that made it"):
        tl.residual_gain(m, tokens, cache=dict(other.cache_dict))
    neox = bridge("neox")
    _, foreign = neox.run_with_cache(tokens)
    with pytest.raises(ThermoLensInputError, match="made by another model"):
        tl.residual_gain(m, tokens, cache=foreign)
    with pytest.raises(ThermoLensInputError):
        tl.residual_gain(m, tokens, cache=dict(foreign.cache_dict))


def test_a_cache_without_its_embedding_names_the_hook_to_add(bridge):
    m = bridge("gpt2")
    tokens = m.to_tokens(PROMPTS)
    _, cache = m.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_resid_pre")
                                or n == "blocks.2.hook_resid_post")
    with pytest.raises(ThermoLensInputError, match="no embedding .*'embed.hook_out'"):
        tl.residual_gain(m, tokens, cache=cache)


def test_an_unmasked_padded_encoder_cache_is_refused_and_a_masked_one_measured(bridge):
    """A BERT cache of a padded to_tokens(list) batch made without the mask attended to the pads
    (its traces are off by several hundredths): refused. With the mask: the numbers of the prompts."""
    m = bridge("bert")
    prompts = ["The cat sat on the mat", "A dog ran in", "One two"]
    tokens = m.to_tokens(prompts)
    real = (tokens != m.tokenizer.pad_token_id) | (torch.arange(tokens.shape[1]) == 0)
    assert not bool(real.all())
    _, unmasked = m.run_with_cache(tokens)
    for fn in (tl.sheaf_traces, tl.residual_gain):
        with pytest.raises(ThermoLensInputError, match=r"without the attention mask.*row\(s\) \[2\].*attention_mask"):
            fn(m, tokens, cache=unmasked)
    _, masked = m.run_with_cache(tokens, attention_mask=real.long())
    t = tl.sheaf_traces(m, tokens, cache=masked)
    assert "pads masked" in t.provenance.cache_match
    torch.testing.assert_close(t.trace, tl.sheaf_traces(m, prompts).trace, rtol=1e-5, atol=1e-6)
    # a padded encoder cache without its pattern cannot be checked: the message names the hook
    _, small = m.run_with_cache(tokens, attention_mask=real.long(),
                                names_filter=lambda n: "pattern" not in n and "attn_scores" not in n)
    with pytest.raises(ThermoLensInputError, match="blocks.0.attn.hook_pattern"):
        tl.residual_gain(m, tokens, cache=small)
