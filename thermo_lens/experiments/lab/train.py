"""Train one lab run (a recipe and a seed) from scratch, with resumable log-spaced checkpoints.

Protocol (all CPU, single-threaded, deterministic):

1. tokenizer: a byte-level BPE (``tokenizers``) of ``vocab_size`` tokens trained on the corpus's
   training documents; ``<|endoftext|>`` is BOS, EOS, PAD and UNK. Shared by every run on the same
   corpus, so arms that differ in anything but ``data`` see identical token streams;
2. streams: ``<|endoftext|> doc0 <|endoftext|> doc1 ...`` for the training and validation slices;
3. model: :func:`~thermo_lens.experiments.lab.architecture.init_model` (matched initial weights across arms);
4. steps: each step is ``batch_size`` windows of ``block_size + 1`` contiguous tokens at uniformly
   random offsets of the training stream, drawn from ``torch.Generator().manual_seed(seed + 1)``,
   so every arm on the same corpus sees the same batches in the same order; the token budget is
   ``steps * batch_size * block_size`` for every arm;
5. checkpoints at the log-spaced steps of :func:`checkpoint_steps` (step 0 is the initial model):
   an HF checkpoint (``save_pretrained``, safetensors, tokenizer) plus ``metrics.json`` (validation
   loss: mean next-token cross-entropy over every non-overlapping ``block_size`` window of the
   validation stream, in nats per token), written to a temporary directory and renamed;
6. resume: after each checkpoint the training state (weights, optimiser, data generator, the
   torch / numpy / Python random states, step) is saved atomically to ``train_state.pt``, as
   tensors and plain lists, dicts, numbers and strings only, and read back with
   ``torch.load(..., weights_only=True)``: nothing in a run folder is ever unpickled as code. A rerun
   continues from it and produces the same weights as an uninterrupted run;
7. trust: ``record.json`` (:mod:`thermo_lens.experiments.lab.run_record`) holds the SHA-256 of every checkpoint
   file and of the training state. A checkpoint or state is read back only when it is a regular
   file reached without a link and matches its record. A checkpoint that does not (a planted link,
   an edited file) is trained anew; a training state that does not is refused with an error, never
   loaded. A training state without any record (written before records existed, by the earlier
   pickled format) is not loaded either: the run restarts from scratch, said in a warning, and ends
   with the same weights (training is deterministic).

The embedded zoo's recipe is this protocol with the zoo's hyperparameters (``recipes/zoo-*.toml``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from thermo_lens.experiments.lab.recipe import OPTIMIZERS, Recipe
from thermo_lens.experiments.lab.run_record import (checkpoint_problem, folder_hashes, read_checkpoint_file, read_record,
                                        write_record)
from thermo_lens.core.safe_io import (SafeIOError, atomic_write_bytes, atomic_write_text, disk_full, make_folder,
                                 os_error_reason, printable, safe_read_bytes)

if TYPE_CHECKING:  # both imported on use: the lab's module loads without them
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = ["EOT", "checkpoint_steps", "get_tokenizer", "encode_stream", "train_run", "step_dir_name",
           "lr_at", "evaluate"]

EOT = "<|endoftext|>"
STATE = "train_state.pt"
STATE_FORMAT = 2
_STATE_LIMIT = 8 << 30
_METRICS_LIMIT = 1 << 20


def checkpoint_steps(steps: int, n: int) -> list[int]:
    """``n`` checkpoint steps spaced evenly in log(step): 0, 1, ..., ``steps`` (fewer if they collide)."""
    if n < 2:
        return [steps]
    out = {0, steps}
    if n > 2 and steps > 1:
        out.update(int(round(steps ** (i / (n - 2)))) for i in range(n - 1))
    return sorted(out)


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


# ---------------------------------------------------------------------------- tokenizer and data
def _train_tokenizer(docs: tuple[str, ...], vocab_size: int, min_frequency: int,
                     model_max_length: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(docs), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT,
                                   unk_token=EOT, model_max_length=model_max_length,
                                   clean_up_tokenization_spaces=False)


def get_tokenizer(recipe: Recipe, cache_dir: str | os.PathLike | None = None) -> PreTrainedTokenizerFast:
    """The recipe's tokenizer, trained once per (corpus, vocab, min_frequency, n_ctx) and cached."""
    from transformers import PreTrainedTokenizerFast

    from thermo_lens.experiments.lab import corpora

    corpus = corpora.load(recipe.data)
    key = f"{recipe.data}-v{recipe.vocab_size}-f{recipe.min_frequency}-c{recipe.n_ctx}-{corpus.sha256[:8]}"
    if cache_dir is not None:
        path = Path(cache_dir) / key
        if path.is_symlink():
            raise SafeIOError(f"cannot use {printable(path)}: it is a symbolic link, which thermo-lens does not "
                              "follow inside its output folder; remove the link and rerun")
        if path.is_dir():
            if checkpoint_problem(path.parent, key, _tokenizer_record(path)) is None:
                return PreTrainedTokenizerFast.from_pretrained(str(path))
            shutil.rmtree(path)  # not what was written (edited, a planted link, from before records): made anew
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    tok = _train_tokenizer(corpus.train_documents, recipe.vocab_size, recipe.min_frequency, recipe.n_ctx)
    if cache_dir is not None:
        Path(cache_dir).parent.mkdir(parents=True, exist_ok=True)
        make_folder(Path(cache_dir).parent, Path(cache_dir).name)  # never through a planted link
        tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix=f".{key}."))
        tok.save_pretrained(str(tmp))
        hashes = folder_hashes(tmp, key)
        atomic_write_bytes(tmp / _TOKENIZER_RECORD, json.dumps(hashes, indent=1, sort_keys=True).encode())
        try:
            os.rename(tmp, path)
        except OSError:  # another worker got there first: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return tok


_TOKENIZER_RECORD = "sha256.json"


def _tokenizer_record(path: Path) -> dict[str, Any] | None:
    """A cached tokenizer's record of its files' SHA-256 (in the form
    :func:`~thermo_lens.experiments.lab.run_record.checkpoint_problem` checks), or ``None``."""
    from thermo_lens.core.safe_io import safe_read_text, sha256_nofollow

    f = path / _TOKENIZER_RECORD
    if not os.path.lexists(f):
        return None
    try:
        files = json.loads(safe_read_text(f, 1 << 20, follow_symlinks=False, what="tokenizer record"))
    except (SafeIOError, ValueError):
        return None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return None
    # the record itself is listed so the folder holds exactly the recorded files
    try:
        record_sha = sha256_nofollow(f, what="tokenizer record")
    except SafeIOError:
        return None
    return {"files": {**files, f"{path.name}/{_TOKENIZER_RECORD}": record_sha}, "train_state": []}


def encode_stream(tokenizer: PreTrainedTokenizerFast, docs: tuple[str, ...]) -> list[int]:
    """``<|endoftext|> doc0 <|endoftext|> doc1 ...`` as one flat list of ids."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    ids: list[int] = []
    for enc in tokenizer(list(docs), add_special_tokens=False, verbose=False)["input_ids"]:
        ids.append(eot)
        ids.extend(enc)
    return ids


def batch_offsets(n_tokens: int, batch_size: int, block_size: int, generator: torch.Generator) -> torch.Tensor:
    """Start offsets ``[batch_size]`` of one step's windows of ``block_size + 1`` tokens: uniform over
    the stream, drawn from the run's data generator (the same draws in every arm of a seed)."""
    import torch

    return torch.randint(0, n_tokens - block_size - 1, (batch_size,), generator=generator)


def lr_at(step: int, recipe: Recipe) -> float:
    """Scheduled AdamW-scale learning rate before update ``step`` (0-based)."""
    lr, warm, total = recipe.lr, recipe.warmup_steps, recipe.steps
    if step < warm:
        return lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    floor = recipe.min_lr_ratio * lr
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def evaluate(model: torch.nn.Module, stream: list[int], block_size: int, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats/token) over non-overlapping ``block_size`` windows."""
    import torch
    import torch.nn.functional as F

    data = torch.tensor(stream, dtype=torch.long)
    n = (len(data) - 1) // block_size
    x = data[: n * block_size].view(n, block_size)
    y = data[1: n * block_size + 1].view(n, block_size)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n, batch_size):
            logits = model(input_ids=x[i: i + batch_size]).logits
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i: i + batch_size].reshape(-1),
                                     reduction="sum").item()
            count += y[i: i + batch_size].numel()
    model.train(was_training)
    return total / count


def rng_states() -> dict[str, Any]:
    """The process's torch, numpy and Python random states as tensors and plain data (loadable
    with ``weights_only=True``)."""
    import random

    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, words, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": {"version": int(version), "state": [int(w) for w in words],
                       "gauss_next": None if gauss_next is None else float(gauss_next)}}


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` returned."""
    import random

    import numpy as np
    import torch

    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = states["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def state_bytes(state: dict[str, Any]) -> bytes:
    """``state`` (tensors, dicts, lists, tuples, numbers, strings, ``None``) as ``torch.save`` bytes."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def load_state_bytes(data: bytes, where: Path) -> dict[str, Any]:
    """A training state from ``torch.save`` bytes, with ``weights_only=True`` (no code runs)."""
    import io
    import pickle

    import torch

    try:
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise SafeIOError(f"{printable(where)} is not a thermo-lens training state (it holds something other than "
                          f"tensors and plain data: {printable(str(e).splitlines()[0][:200] if str(e) else type(e).__name__)}); "
                          f"it was not loaded. Delete it to restart the run from scratch") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise SafeIOError(f"{printable(where)} is not a thermo-lens training state of format {STATE_FORMAT}; "
                          "delete it to restart the run from scratch")
    return state


def _stage_checkpoint(run_dir: Path, step: int, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, metrics: dict[str, Any]) -> Path:
    """The checkpoint of ``step`` written into a new temporary folder of ``run_dir`` (not yet in place)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a per-shard bar for a 1 MB file is noise
    tmp = Path(tempfile.mkdtemp(dir=run_dir, prefix=f".{step_dir_name(step)}."))
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    from thermo_lens.zoo import portable_tokenizer_config

    portable_tokenizer_config(tmp)  # checkpoints load on transformers 4 (TransformerLens 2.16) too
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    for f in tmp.iterdir():
        f.chmod(0o644)
    tmp.chmod(0o755)
    return tmp


def _place_checkpoint(run_dir: Path, step: int, tmp: Path) -> None:
    dest = run_dir / step_dir_name(step)
    if dest.is_symlink():
        dest.unlink()  # a planted link is removed, never followed
    elif dest.exists():
        shutil.rmtree(dest)
    os.rename(tmp, dest)


def _save_checkpoint(run_dir: Path, step: int, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, metrics: dict[str, Any],
                     state: bytes | None = None) -> None:
    """Write the checkpoint of ``step`` (and the training state ``state``) in the order
    :mod:`thermo_lens.experiments.lab.run_record` describes, recording every file's SHA-256."""
    import hashlib

    tmp = _stage_checkpoint(run_dir, step, model, tokenizer, metrics)
    try:
        name = step_dir_name(step)
        record = read_record(run_dir) or {"files": {}, "train_state": []}
        files = {k: v for k, v in record["files"].items() if not k.startswith(name + "/")}
        files.update(folder_hashes(tmp, name))
        states = record["train_state"][:1]
        if state is not None:
            states = [hashlib.sha256(state).hexdigest(), *states]
        write_record(run_dir, {"files": files, "train_state": states})
        _place_checkpoint(run_dir, step, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if state is not None:
        atomic_write_bytes(run_dir / STATE, state)


def _resume_state(run_dir: Path, record: dict[str, Any] | None, say: Callable[[str], object]) -> dict[str, Any] | None:
    """The run's training state if it may be resumed from: a regular file (not a link) whose SHA-256
    is recorded, loaded with ``weights_only=True``; ``None`` when there is none or it predates
    records (the run restarts from scratch, with a warning).

    Raises:
        SafeIOError: a state that is not the one this run wrote (a link, an edited or planted
            file): it is never loaded.
    """
    import hashlib
    import warnings

    path = run_dir / STATE
    if not os.path.lexists(path):
        return None
    data = safe_read_bytes(path, _STATE_LIMIT, follow_symlinks=False, what="training state")
    sha = hashlib.sha256(data).hexdigest()
    if record is None:
        msg = (f"{printable(path)} has no SHA-256 record (written by an earlier thermo-lens, in a format that is no "
               "longer loaded): it is not loaded, and the run restarts from scratch (same weights, more time)")
        warnings.warn(msg, stacklevel=3)
        say(msg)
        return None
    if sha not in record["train_state"]:
        raise SafeIOError(f"{printable(path)} is not the training state this run wrote (its SHA-256 is not in "
                          f"{printable(run_dir / 'record.json')}): it was not loaded. Delete it to restart the run "
                          "from scratch")
    return load_state_bytes(data, path)


def train_run(recipe: Recipe, seed: int, run_dir: str | os.PathLike, *, base: Recipe | None = None,
              n_checkpoints: int = 8, extra_checkpoints: tuple[int, ...] = (), tokenizer_cache: str | os.PathLike | None = None,
              eval_every: int | None = None, log: Callable[[str], object] | None = None) -> dict[str, Any]:
    """Train (or finish training) one run; returns ``{step: metrics}`` for every checkpoint.

    Args:
        recipe: the arm's recipe.
        seed: initial weights (``torch.manual_seed(seed)``) and batch order (``seed + 1``).
        run_dir: the run's directory (checkpoints ``step_NNNNNN/`` and ``train_state.pt``).
        base: the lab's base recipe (initial weights are the base family's, moved into this
            arm's family; default ``recipe`` itself).
        n_checkpoints: number of log-spaced checkpoints (:func:`checkpoint_steps`).
        extra_checkpoints: further steps to checkpoint.
        tokenizer_cache: directory where tokenizers are cached (shared by runs).
        eval_every: also record validation loss every this many steps (no checkpoint).
        log: ``callable(str)`` for progress lines (default: silent).
    """
    import torch
    import torch.nn.functional as F

    from thermo_lens.experiments.lab import corpora
    from thermo_lens.experiments.lab.architecture import init_model

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    base = base or recipe
    run_dir = Path(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    make_folder(run_dir.parent, run_dir.name)  # never through a planted link
    atomic_write_text(run_dir / "recipe.json", json.dumps({"recipe": recipe.to_dict(), "seed": seed,
                                                           "base": base.to_dict()}, indent=2) + "\n")
    say = log or (lambda s: None)

    tok = get_tokenizer(recipe, tokenizer_cache)
    corpus = corpora.load(recipe.data)
    train_ids = encode_stream(tok, corpus.train_documents)
    val_ids = encode_stream(tok, corpus.val_documents)
    special = tok.convert_tokens_to_ids(EOT)
    model = init_model(recipe.architecture(), base.architecture(), seed=seed, vocab_size=len(tok),
                       special_id=special, init_scale=recipe.init_scale)
    model.train()
    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    opt_spec = OPTIMIZERS[recipe.optimizer]
    opt: torch.optim.Optimizer
    if opt_spec["class"] == "AdamW":
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=recipe.lr, betas=opt_spec["betas"], eps=recipe.eps)
        lr_scale = 1.0
    else:  # SGD: decoupled decay applied by hand below, at the AdamW-scale rate
        opt = torch.optim.SGD([{"params": decay}, {"params": no_decay}], lr=recipe.lr * recipe.sgd_lr_scale,
                              momentum=opt_spec["momentum"])
        lr_scale = recipe.sgd_lr_scale
    data = torch.tensor(train_ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed + 1)
    B, T = recipe.batch_size, recipe.block_size
    ckpts = sorted(set(checkpoint_steps(recipe.steps, n_checkpoints)) | {s for s in extra_checkpoints if 0 <= s <= recipe.steps})

    start, history = 0, []
    record = read_record(run_dir)
    state = _resume_state(run_dir, record, say)
    if state is not None and state.get("recipe") == recipe.to_dict() and state.get("seed") == seed:
        # Every checkpoint up to the state's step must still be the one written; else start over
        # (training is deterministic, so the same checkpoints are written again).
        bad = [why for s in ckpts if s <= state["step"]
               if (why := checkpoint_problem(run_dir, step_dir_name(s), record)) is not None]
        if bad:
            say(f"not resuming at step {state['step']}: {bad[0]}; training from scratch")
        else:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            gen.set_state(state["generator"])
            set_rng_states(state["rng"])
            start, history = state["step"], list(state["history"])
            say(f"resuming at step {start}")
    metrics: dict[int, dict[str, Any]] = {}
    for s in ckpts:
        if s <= start and start > 0:
            metrics[s] = json.loads(read_checkpoint_file(run_dir, f"{step_dir_name(s)}/metrics.json", record,
                                                         _METRICS_LIMIT))

    def checkpoint(step: int, train_loss: float | None) -> None:
        m = {"step": step, "tokens_seen": step * B * T, "val_loss": evaluate(model, val_ids, T),
             "train_loss_last_step": train_loss, "lr": lr_at(max(step - 1, 0), recipe) * lr_scale}
        try:
            _save_checkpoint(run_dir, step, model, tok, m, state_bytes({
                "format": STATE_FORMAT, "recipe": recipe.to_dict(), "seed": seed, "step": step, "history": history,
                "model": model.state_dict(), "optimizer": opt.state_dict(), "generator": gen.get_state(),
                "rng": rng_states()}))
        except OSError as e:  # disk full, permission: say so, with the folder
            raise SafeIOError(f"cannot write the step-{step} checkpoint in {printable(run_dir)}: "
                              f"{os_error_reason(e, run_dir)}") from None
        except Exception as e:  # safetensors wraps a full disk in its own error type
            if not disk_full(e):
                raise
            raise SafeIOError(f"cannot write the step-{step} checkpoint in {printable(run_dir)}: no space left on "
                              f"the device of {printable(run_dir)}; free some space and rerun") from None
        metrics[step] = m
        say(f"step {step}: val loss {m['val_loss']:.4f}")

    if start == 0 and 0 in ckpts and 0 not in metrics:
        checkpoint(0, None)
    t0 = time.perf_counter()
    for step in range(start, recipe.steps):
        lr = lr_at(step, recipe)
        for g in opt.param_groups:
            g["lr"] = lr * lr_scale
        off = batch_offsets(len(data), B, T, gen)
        batch = data[off[:, None] + torch.arange(T + 1)[None, :]]
        logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip_norm)
        if lr_scale != 1.0 and recipe.weight_decay:
            with torch.no_grad():
                for p in decay:
                    p.mul_(1.0 - lr * recipe.weight_decay)
        opt.step()
        done = step + 1
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"training loss is {loss.item()} at step {done}: the run diverged")
        if eval_every and done % eval_every == 0 and done not in ckpts:
            history.append({"step": done, "val_loss": evaluate(model, val_ids, T)})
        if done in ckpts:
            checkpoint(done, loss.item())
    if start < recipe.steps:
        say(f"trained steps {start}..{recipe.steps} in {time.perf_counter() - t0:.1f}s")
    return {"checkpoints": metrics, "history": history, "n_params": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tok), "train_stream_tokens": len(train_ids), "val_stream_tokens": len(val_ids)}
