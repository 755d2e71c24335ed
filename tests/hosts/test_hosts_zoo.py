"""``thermo_lens.zoo.load(name, host=...)`` on every host a CI leg has (issue 25): the embedded
models as ``HookedTransformer`` / ``HookedSAETransformer`` give the logits and residual states of
the same checkpoint run by plain transformers (an independent computation)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from thermo_lens import zoo

pytestmark = pytest.mark.hosts

TEXT = "Return the sum of x and y. The capital of France is"


def _has_hooked() -> bool:
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def _skip_unless(host: str) -> None:
    if not _has_hooked():
        pytest.skip("this TransformerLens has no HookedTransformer (4.x)")
    if host == "hooked_sae" and importlib.util.find_spec("sae_lens") is None:
        pytest.skip("sae-lens is not installed")


@pytest.mark.parametrize("host", ["hooked", "hooked_sae"])
@pytest.mark.parametrize("name", ["gpt2-tiny-wd", "neox-tiny"])
def test_zoo_load_hooked_hosts_match_transformers(name, host):
    _skip_unless(host)
    import transformers

    model = zoo.load(name, host=host)
    expected_cls = "HookedSAETransformer" if host == "hooked_sae" else "HookedTransformer"
    assert type(model).__name__ == expected_cls and model.cfg.model_name == name
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(zoo.path(name))).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(zoo.path(name)))
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        logits, cache = model.run_with_cache(ids)
    assert torch.allclose(logits, ref.logits, atol=1e-4, rtol=1e-4)
    for layer in range(model.cfg.n_layers - 1):  # HF's last hidden state is after the final norm
        assert torch.allclose(cache[f"blocks.{layer}.hook_resid_post"], ref.hidden_states[layer + 1], atol=1e-4)
    # The model's own tokenizer (the zoo files read by this leg's transformers) tokenizes alike.
    assert model.to_tokens(TEXT, prepend_bos=False).tolist() == ids.tolist()


def test_zoo_load_hooked_processed_keeps_the_logits():
    _skip_unless("hooked")
    raw, processed = zoo.load("gpt2-tiny-wd", host="hooked"), zoo.load("gpt2-tiny-wd", host="hooked", processed=True)
    ids = raw.to_tokens(TEXT)
    with torch.no_grad():
        a, b = raw(ids), processed(ids)
    # Processing centres the unembedding: logits agree up to a per-position constant.
    a, b = a - a.mean(-1, keepdim=True), b - b.mean(-1, keepdim=True)
    assert torch.allclose(a, b, atol=1e-3)
    assert not torch.allclose(raw.W_V, processed.W_V)  # LayerNorm was folded into the weights
