"""Tiny random local checkpoints for tests and benchmarks (no network, seconds to build).

``make_checkpoint(arch, directory)`` writes a HuggingFace checkpoint (config, safetensors,
tokenizer) for a tiny model of the given architecture, so that
``TransformerBridge.boot_transformers(directory)`` boots it offline, exactly as a user boots a
hub model. ``boot(arch, directory)`` does both. The tokenizer is a byte-level BPE trained in a
fraction of a second on a fixed sentence list with the ``tokenizers`` library.

Architectures (``ARCHITECTURES``): GPT-2, GPT-NeoX (interleaved fused QKV, parallel residual),
OPT (pre-LN), OPT-350m-style post-LN with project_in/out, LLaMA with grouped-query attention,
Gemma-like with ``d_head != d_model / n_heads``, GPT-J (parallel attention), BERT (post-LN,
bidirectional), BLOOM (interleaved fused QKV, ALiBi) and Falcon (multi-query).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["ARCHITECTURES", "make_tokenizer", "make_checkpoint", "boot"]

_SENTENCES = [
    "The capital of France is Paris.",
    "Water freezes at a temperature of zero degrees.",
    "The early bird catches the worm, and the cat sat on the mat.",
    "Despite the rain the team decided to continue their journey through the forest.",
    "Colorless green ideas sleep furiously while the quantum teapot hums.",
    "def main(): return sum(range(10))  # numbers 0123456789",
]

# name -> (transformers config class, model class, config kwargs); V is filled in later.
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(n_positions=64, n_embd=32, n_layer=3, n_head=4)),
    "neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
             dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64, use_parallel_residual=True)),
    "opt": ("OPTConfig", "OPTForCausalLM",
            dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, ffn_dim=64,
                 max_position_embeddings=64, word_embed_proj_dim=32)),
    "opt_postln": ("OPTConfig", "OPTForCausalLM",
                   dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, ffn_dim=64,
                        max_position_embeddings=64, word_embed_proj_dim=16,
                        do_layer_norm_before=False)),
    "llama_gqa": ("LlamaConfig", "LlamaForCausalLM",
                  dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=4, head_dim=16, intermediate_size=64,
                   max_position_embeddings=64)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             dict(n_embd=32, n_layer=3, n_head=4, n_positions=64, rotary_dim=4)),
    "bert": ("BertConfig", "BertForMaskedLM",
             dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=32, n_layer=3, n_head=4)),
    "falcon": ("FalconConfig", "FalconForCausalLM",
               dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                    new_decoder_architecture=False, multi_query=True, parallel_attn=True)),
}


def make_tokenizer(vocab_size: int = 300) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained offline; ``<|endoftext|>`` (id 0) is
    BOS, EOS, PAD and UNK, ``[CLS]``/``[SEP]``/``[MASK]`` exist for BERT."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "[CLS]", "[SEP]", "[MASK]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_SENTENCES * 4, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
        unk_token="<|endoftext|>", pad_token="<|endoftext|>",
    )


def make_checkpoint(arch: str, directory: str | os.PathLike, *, seed: int = 0,
                    dtype: Any = None, **overrides: Any) -> Path:
    """Write a tiny random ``arch`` checkpoint with its tokenizer to ``directory``."""
    import torch
    import transformers

    if arch not in ARCHITECTURES:
        raise KeyError(f"unknown architecture {arch!r}; available: {sorted(ARCHITECTURES)}")
    cfg_name, model_name, kwargs = ARCHITECTURES[arch]
    tok = make_tokenizer()
    kwargs = dict(kwargs, vocab_size=len(tok), pad_token_id=0, **overrides)
    if arch != "bert":
        kwargs.update(bos_token_id=0, eos_token_id=0)
    config = getattr(transformers, cfg_name)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    # HF initialises norms to weight 1 / bias 0; perturb them so no test can pass by accident
    # on identity norms (e.g. a wrong final-norm or folded-LN handling).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name or "ln" in name or "LayerNorm" in name):
                p.add_(0.1 * torch.randn_like(p))  # non-trivial norm weights and biases
    if dtype is not None:
        model = model.to(dtype)
    directory = Path(directory)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def boot(arch: str, directory: str | os.PathLike, **boot_kwargs: Any) -> Any:
    """``make_checkpoint`` (if needed) then ``TransformerBridge.boot_transformers`` offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformer_lens.model_bridge import TransformerBridge

    directory = Path(directory)
    if not (directory / "config.json").exists():
        make_checkpoint(arch, directory)
    return TransformerBridge.boot_transformers(str(directory), **boot_kwargs)
