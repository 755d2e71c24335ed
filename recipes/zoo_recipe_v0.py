"""The recipe that first trained the embedded zoo (was ``thermo_lens/zoo/recipe.py``; kept for the record).

The zoo is now rebuilt by the heritage lab (``thermo-lens lab recipes/zoo.toml``, same protocol, on the
frozen corpus file); this script is no longer part of the installed package. Usage (repository root)::

    HF_HUB_OFFLINE=1 python recipes/zoo_recipe_v0.py --out /tmp/zoo
    HF_HUB_OFFLINE=1 python recipes/zoo_recipe_v0.py --out /tmp/zoo --only neox-tiny

Steps (all offline, CPU, single-threaded):

1. Build the stdlib-docstring corpus (:mod:`thermo_lens.zoo.corpus`).
2. Train one byte-level BPE tokenizer (``tokenizers``) on the *training*
   documents; ``<|endoftext|>`` is bos/eos/pad/unk.  All models share it.
3. Tokenise every document, join with ``<|endoftext|>`` into one training
   stream and one validation stream.
4. Train each model from scratch with plain torch: AdamW, linear warm-up +
   cosine decay, fixed seed, fixed token budget; each step is a batch of
   contiguous ``block_size`` windows at seeded random offsets of the stream.
   Weight decay applies to matrices (``ndim >= 2``, incl. embeddings), not to
   biases or LayerNorm parameters.
5. ``save_pretrained`` model (safetensors) + tokenizer, and write
   ``recipe.json`` with every hyperparameter, provenance and final losses.

``gpt2-tiny-wd`` and ``gpt2-tiny-nowd`` are a matched pair: same seed, same
initial weights, same batches in the same order, same schedule -- only the
AdamW weight decay differs (0.1 vs 0.0).

Exact bit-reproducibility needs the same Python (corpus), torch and
transformers versions; all are recorded in ``recipe.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

EOT = "<|endoftext|>"

#: Shared tokenizer settings.
TOKENIZER: dict[str, Any] = {
    "type": "byte-level BPE (tokenizers.models.BPE + pre_tokenizers.ByteLevel)",
    "vocab_size": 1536,
    "min_frequency": 2,
    "special_tokens": [EOT],
    "add_prefix_space": False,
    "trained_on": "training documents of the corpus",
}

#: Shared optimisation settings (identical for every model unless overridden).
TRAIN_DEFAULTS: dict[str, Any] = {
    "seed": 1234,
    "optimizer": "torch.optim.AdamW",
    "lr": 3e-3,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "weight_decay": 0.1,
    "weight_decay_applies_to": "parameters with ndim >= 2 (weight matrices and embeddings); "
    "not biases or LayerNorm",
    "schedule": "linear warmup then cosine decay to min_lr_ratio * lr",
    "warmup_steps": 60,
    "min_lr_ratio": 0.1,
    "grad_clip_norm": 1.0,
    "batch_size": 16,
    "block_size": 128,
    "steps": 1000,
    "eval_every": 100,
    "data_order": "each step: batch_size windows of block_size+1 contiguous tokens at "
    "uniformly random offsets of the training stream (torch.Generator seeded with seed+1)",
    "dropout": 0.0,
    "torch_num_threads": 1,
    "eval_batches": "all non-overlapping block_size windows of the validation stream",
}

GPT2_ARCH: dict[str, Any] = {
    "config_class": "GPT2Config",
    "model_class": "GPT2LMHeadModel",
    "n_layer": 4,
    "n_embd": 96,
    "n_head": 4,
    "n_inner": 384,
    "n_positions": 128,
    "activation_function": "gelu_new",
    "tie_word_embeddings": True,
}

NEOX_ARCH: dict[str, Any] = {
    "config_class": "GPTNeoXConfig",
    "model_class": "GPTNeoXForCausalLM",
    "num_hidden_layers": 4,
    "hidden_size": 96,
    "num_attention_heads": 4,
    "intermediate_size": 384,
    "max_position_embeddings": 128,
    "rotary_pct": 0.25,
    "rotary_emb_base": 10000,
    "use_parallel_residual": True,
    "hidden_act": "gelu",
    "tie_word_embeddings": False,
}

#: The embedded models.  ``train`` entries override :data:`TRAIN_DEFAULTS`.
MODELS: dict[str, dict[str, Any]] = {
    "gpt2-tiny-wd": {
        "architecture": GPT2_ARCH,
        "train": {"weight_decay": 0.1},
        "matched_with": "gpt2-tiny-nowd",
        "differs_in": "weight_decay",
    },
    "gpt2-tiny-nowd": {
        "architecture": GPT2_ARCH,
        "train": {"weight_decay": 0.0},
        "matched_with": "gpt2-tiny-wd",
        "differs_in": "weight_decay",
    },
    "neox-tiny": {
        "architecture": NEOX_ARCH,
        "train": {"weight_decay": 0.1},
    },
}


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(train_docs, *, vocab_size: int, min_frequency: int):
    """Train the shared byte-level BPE and wrap it in ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(train_docs), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        unk_token=EOT,
        model_max_length=128,
        clean_up_tokenization_spaces=False,
    )
    return fast


def encode_stream(tokenizer, docs) -> list[int]:
    """``<|endoftext|> doc0 <|endoftext|> doc1 ...`` as one flat list of ids."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    ids: list[int] = []
    for enc in tokenizer(list(docs), add_special_tokens=False)["input_ids"]:
        ids.append(eot)
        ids.extend(enc)
    return ids


# ----------------------------------------------------------------------------- models


def build_model(arch: dict[str, Any], vocab_size: int, eot_id: int, dropout: float):
    import transformers

    kw = {k: v for k, v in arch.items() if k not in ("config_class", "model_class")}
    common = dict(
        vocab_size=vocab_size,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
    )
    if arch["config_class"] == "GPT2Config":
        cfg = transformers.GPT2Config(
            **kw, **common, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout
        )
    elif arch["config_class"] == "GPTNeoXConfig":
        cfg = transformers.GPTNeoXConfig(
            **kw, **common, attention_dropout=dropout, hidden_dropout=dropout
        )
    else:  # pragma: no cover
        raise ValueError(arch["config_class"])
    # eager attention: what TransformerBridge uses anyway, and it round-trips cleanly.
    cfg._attn_implementation = "eager"
    model_cls = getattr(transformers, arch["model_class"])
    return model_cls(cfg)


def _lr_at(step: int, hp: dict[str, Any]) -> float:
    lr, warm, total = hp["lr"], hp["warmup_steps"], hp["steps"]
    if step < warm:
        return lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    floor = hp["min_lr_ratio"] * lr
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def evaluate(model, stream, block_size: int, batch_size: int = 32) -> float:
    """Mean next-token CE over non-overlapping windows of ``block_size + 1`` tokens."""
    import torch
    import torch.nn.functional as F

    data = torch.tensor(stream, dtype=torch.long)
    n = (len(data) - 1) // block_size
    x = data[: n * block_size].view(n, block_size)
    y = data[1 : n * block_size + 1].view(n, block_size)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n, batch_size):
            logits = model(input_ids=x[i : i + batch_size]).logits
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y[i : i + batch_size].reshape(-1), reduction="sum"
            )
            total += loss.item()
            count += y[i : i + batch_size].numel()
    model.train()
    return total / count


def train_one(
    name: str,
    spec: dict[str, Any],
    tokenizer,
    train_ids: list[int],
    val_ids: list[int],
    corpus_info: dict[str, Any],
    out_dir: Path,
    log_every: int = 50,
) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    import transformers

    hp = copy.deepcopy(TRAIN_DEFAULTS)
    hp.update(spec.get("train", {}))
    torch.set_num_threads(hp["torch_num_threads"])
    torch.use_deterministic_algorithms(True, warn_only=True)

    eot_id = tokenizer.convert_tokens_to_ids(EOT)
    vocab_size = len(tokenizer)
    torch.manual_seed(hp["seed"])
    model = build_model(spec["architecture"], vocab_size, eot_id, hp["dropout"])
    model.train()
    n_params = sum(p.numel() for p in model.parameters())

    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": hp["weight_decay"]},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=hp["lr"],
        betas=tuple(hp["betas"]),
        eps=hp["eps"],
    )

    data = torch.tensor(train_ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(hp["seed"] + 1)
    B, T = hp["batch_size"], hp["block_size"]
    init_val = evaluate(model, val_ids, T)
    print(f"[{name}] params={n_params:,} vocab={vocab_size} init val loss={init_val:.3f}", flush=True)

    t0 = time.perf_counter()
    recent: list[float] = []
    history: list[dict[str, float]] = [{"step": 0, "val_loss": round(init_val, 4)}]
    for step in range(hp["steps"]):
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, hp)
        off = torch.randint(0, len(data) - T - 1, (B,), generator=gen)
        idx = off[:, None] + torch.arange(T + 1)[None, :]
        batch = data[idx]
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip_norm"])
        opt.step()
        recent.append(loss.item())
        recent = recent[-log_every:]
        if (step + 1) % hp["eval_every"] == 0 and step + 1 < hp["steps"]:
            history.append(
                {
                    "step": step + 1,
                    "train_loss_avg": round(sum(recent) / len(recent), 4),
                    "val_loss": round(evaluate(model, val_ids, T), 4),
                }
            )
            print(f"[{name}] step {step + 1} val {history[-1]['val_loss']:.3f}", flush=True)
        if (step + 1) % log_every == 0 or step == 0:
            el = time.perf_counter() - t0
            print(
                f"[{name}] step {step + 1}/{hp['steps']} loss {loss.item():.3f} "
                f"(avg {sum(recent) / len(recent):.3f}) lr {_lr_at(step, hp):.2e} {el:.0f}s",
                flush=True,
            )
    wall = time.perf_counter() - t0

    final_train_window = sum(recent) / len(recent)
    train_eval = evaluate(model, train_ids[: len(val_ids) * 2], T)
    val_loss = evaluate(model, val_ids, T)
    history.append(
        {"step": hp["steps"], "train_loss_avg": round(final_train_window, 4), "val_loss": round(val_loss, 4)}
    )
    print(f"[{name}] done in {wall:.0f}s: train {train_eval:.3f} val {val_loss:.3f}", flush=True)

    model.eval()
    dest = out_dir / name
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)

    arch = dict(spec["architecture"])
    recipe = {
        "name": name,
        "description": "Toy model trained from scratch by thermo_lens.zoo.recipe on stdlib "
        "docstrings. For demos and tests only -- not a paper/reference model.",
        "matched_with": spec.get("matched_with"),
        "differs_in": spec.get("differs_in"),
        "architecture": arch,
        "n_params": n_params,
        "vocab_size": vocab_size,
        "special_tokens": {"bos": EOT, "eos": EOT, "pad": EOT, "unk": EOT, "id": eot_id},
        "tokenizer": TOKENIZER,
        "training": hp,
        "tokens_seen": hp["steps"] * B * T,
        "corpus": corpus_info,
        "train_stream_tokens": len(train_ids),
        "val_stream_tokens": len(val_ids),
        "results": {
            "init_val_loss": init_val,
            "final_train_loss": train_eval,
            "final_train_loss_last_steps_avg": final_train_window,
            "final_train_loss_note": "final_train_loss: eval-mode CE on the first "
            "2*len(val) tokens of the training stream; *_last_steps_avg: mean minibatch loss "
            f"over the last {len(recent)} steps",
            "final_val_loss": val_loss,
            "final_val_perplexity": math.exp(val_loss),
            "ln_vocab_size": math.log(vocab_size),
            "train_wall_time_s": round(wall, 1),
            "history": history,
        },
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": __import__("tokenizers").__version__,
            "platform": platform.platform(),
        },
        "command": "python recipes/zoo_recipe_v0.py --out thermo_lens/zoo --only " + name,
    }
    (dest / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    for f in dest.iterdir():  # save_pretrained may write 0600 files; make them readable
        if f.is_file():
            f.chmod(0o644)
    return recipe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--only", action="append", choices=sorted(MODELS), help="train only NAME")
    ap.add_argument("--steps", type=int, default=None, help="override steps (smoke tests only)")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")

    from docstring_corpus import build_corpus  # recipes/docstring_corpus.py, next to this file

    corpus = build_corpus()
    info = corpus.describe()
    tok = train_tokenizer(
        corpus.train_documents,
        vocab_size=TOKENIZER["vocab_size"],
        min_frequency=TOKENIZER["min_frequency"],
    )
    train_ids = encode_stream(tok, corpus.train_documents)
    val_ids = encode_stream(tok, corpus.val_documents)
    print(
        f"corpus sha256={info['sha256'][:16]} py={info['python_version']} "
        f"train={len(train_ids):,} val={len(val_ids):,} tokens, vocab={len(tok)}",
        flush=True,
    )
    for name in sorted(set(args.only or MODELS)):
        spec = copy.deepcopy(MODELS[name])
        if args.steps is not None:
            spec.setdefault("train", {})["steps"] = args.steps
        train_one(name, spec, tok, train_ids, val_ids, info, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
