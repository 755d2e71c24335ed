"""ModelView: geometry, norm placement, weights vs independent HF slices, tokenization, errors."""

import pytest
import torch

from conftest import ARCHS
from hf_slices import hf_all_head_weights, hf_head_weights
from thermo_lens.core.model import ModelView
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.tokens import tokenize

# (n_layers, n_heads, n_kv_heads, d_model, d_head, norm placement, parallel attention)
EXPECTED = {
    "gpt2": (3, 4, 4, 32, 8, "pre", False),
    "neox": (3, 4, 4, 32, 8, "pre", True),
    "opt": (3, 4, 4, 32, 8, "pre", False),
    "opt_postln": (3, 4, 4, 32, 8, "post", False),
    "llama_gqa": (3, 4, 2, 32, 8, "pre", False),
    "gemma": (3, 4, 4, 32, 16, "pre", False),  # d_head 16 != d_model / n_heads = 8
    "gptj": (3, 4, 4, 32, 8, "pre", True),
    "bert": (3, 4, 4, 32, 8, "post", False),
    "bloom": (3, 4, 4, 32, 8, "pre", False),
    "falcon": (3, 4, 1, 32, 8, "pre", True),
}


@pytest.mark.parametrize("arch", ARCHS)
def test_geometry(arch, bridge):
    v = ModelView(bridge(arch))
    got = (v.n_layers, v.n_heads, v.n_kv_heads, v.d_model, v.d_head, v.norm_placement, v.parallel_attn)
    assert got == EXPECTED[arch]
    assert v.post_ln == (EXPECTED[arch][5] == "post")
    assert v.weights_processed is False and v.weight_state == "raw"
    assert v.dtype == torch.float32
    assert v.device.type == "cpu"
    assert len(v.resid_hook_names) == v.n_layers + 1
    meta = v.metadata()
    assert meta["rho"] == pytest.approx(v.n_heads / v.d_head)
    assert "L=3" in repr(v)


@pytest.mark.parametrize("arch", ARCHS)
def test_weights_equal_independent_hf_slices(arch, bridge, hf_model):
    v = ModelView(bridge(arch))
    wv_ref, wo_ref = hf_all_head_weights(arch, hf_model(arch))
    wv, wo = v.W_V(), v.W_O()
    assert wv.dtype == torch.float32 and wo.dtype == torch.float32
    assert wv.shape == (v.n_layers, v.n_kv_heads, v.d_model, v.d_head)
    assert wo.shape == (v.n_layers, v.n_heads, v.d_head, v.d_model)
    torch.testing.assert_close(wv, wv_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(wo, wo_ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", ["llama_gqa", "falcon"])
def test_gqa_mapping_is_explicit(arch, bridge, hf_model):
    v = ModelView(bridge(arch))
    group = v.n_heads // v.n_kv_heads
    assert v.kv_head_of.tolist() == [h // group for h in range(v.n_heads)]
    per_q = v.W_V_per_query_head()
    wv_ref, _, _ = hf_head_weights(arch, hf_model(arch), 1)
    for h in range(v.n_heads):
        torch.testing.assert_close(per_q[1, h], wv_ref[h // group])


def test_processed_weights_are_detected(checkpoint_dir):
    from transformer_lens.model_bridge import TransformerBridge

    b = TransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")))
    raw = ModelView(b).W_V()
    b.enable_compatibility_mode(disable_warnings=True)
    v = ModelView(b)
    assert v.weights_processed and v.weight_state == "processed"
    assert not torch.allclose(v.W_V(), raw)  # folding ln_1 rescales W_V


def test_dtype_is_reported_and_weights_are_float32(checkpoint_dir):
    from transformer_lens.model_bridge import TransformerBridge

    b = TransformerBridge.boot_transformers(str(checkpoint_dir("gpt2")), dtype=torch.bfloat16)
    v = ModelView(b)
    assert v.dtype == torch.bfloat16
    assert v.W_V().dtype == torch.float32
    assert v.metadata()["dtype"] == "bfloat16"


class TestTokenize:
    def test_padding_lengths_and_bos(self, bridge):
        v = ModelView(bridge("gpt2"))
        prompts = ["The capital of France is", "Water"]
        with_bos = tokenize(v, prompts, prepend_bos=True)
        without = tokenize(v, prompts, prepend_bos=False)
        assert (with_bos.lengths == without.lengths + 1).all()
        assert (with_bos.tokens[:, 0] == v.tokenizer.bos_token_id).all()
        for b, p in enumerate(prompts):
            ids = v.tokenizer(p, add_special_tokens=False)["input_ids"]
            n = int(without.lengths[b])
            assert without.tokens[b, :n].tolist() == ids
            assert without.mask[b].sum() == n
        assert with_bos.prepend_bos is True and without.prepend_bos is False

    @pytest.mark.parametrize("arch", ["gpt2", "bert"])
    def test_tokenizer_mode_uses_the_hf_tokenizer_as_autotokenizer_loads_it(self, arch, bridge, checkpoint_dir):
        from transformers import AutoTokenizer

        v = ModelView(bridge(arch))
        batch = tokenize(v, ["hello world"], prepend_bos="tokenizer")
        ids = AutoTokenizer.from_pretrained(str(checkpoint_dir(arch)))("hello world")["input_ids"]
        assert batch.tokens[0].tolist() == ids
        if arch == "gpt2":
            # The bridge reloads its tokenizer with add_bos_token=True; the paper's protocol
            # (plain AutoTokenizer) adds no BOS for GPT-2-style tokenizers.
            assert ids == tokenize(v, ["hello world"], prepend_bos=False).tokens[0].tolist()
            assert v.tokenizer("hello world")["input_ids"][0] == v.tokenizer.bos_token_id

    def test_too_long_prompt_names_index_and_lengths(self, bridge):
        v = ModelView(bridge("gpt2"))
        long = "the cat sat on the mat " * 40
        with pytest.raises(ThermoLensInputError, match=r"prompt 1 is \d+ tokens long .* context of 64"):
            tokenize(v, ["ok", long], prepend_bos=False)
        batch = tokenize(v, ["ok", long], prepend_bos=False, truncate=True)
        assert int(batch.lengths[1]) == 64 and batch.truncated == (False, True)

    @pytest.mark.parametrize(
        "bad, match",
        [([], "empty"), ([""], "prompt 0 is an empty string"), (["a", 3], "prompt 1 is a int"),
         ("a string", "single string"), (None, "None")],
    )
    def test_bad_prompt_lists(self, bridge, bad, match):
        with pytest.raises(ThermoLensInputError, match=match):
            tokenize(ModelView(bridge("gpt2")), bad, prepend_bos=True)

    def test_bad_bos_mode(self, bridge):
        with pytest.raises(ThermoLensInputError, match="prepend_bos must be"):
            tokenize(ModelView(bridge("gpt2")), ["a"], prepend_bos="yes")


class TestWrongModels:
    def test_none(self):
        with pytest.raises(TypeError, match="got None.*boot_transformers"):
            ModelView(None)

    def test_string(self):
        with pytest.raises(TypeError, match="string 'gpt2'.*boot_transformers"):
            ModelView("gpt2")

    def test_raw_hf_model(self, hf_model):
        with pytest.raises(TypeError, match=r"raw HuggingFace model \(GPT2LMHeadModel\).*hf_model=hf_model"):
            ModelView(hf_model("gpt2"))

    def test_other_object(self):
        with pytest.raises(TypeError, match="not a TransformerLens model"):
            ModelView(torch.nn.Linear(2, 2))


def test_run_fires_user_hooks(bridge):
    v = ModelView(bridge("gpt2"))
    batch = tokenize(v, ["hello world", "the cat"], prepend_bos=True)
    seen = []
    v.run(batch.tokens, batch.mask, [(v.resid_hook_names[-1], lambda x, hook: seen.append(tuple(x.shape)))])
    assert seen == [(2, int(batch.lengths.max()), v.d_model)]
