"""Tests for the embedded toy checkpoints in ``thermo_lens.zoo``."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from thermo_lens import zoo

EXPECTED = {"gpt2-tiny-wd", "gpt2-tiny-nowd", "neox-tiny"}
MAX_BYTES = 10 * 1024 * 1024


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


@pytest.fixture(scope="module")
def val_windows():
    """Held-out validation windows (the corpus's last 5% of documents)."""
    from thermo_lens.experiments.lab import corpora

    return corpora.load("stdlib-docstrings").val_documents


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def booted(request, val_windows):
    pytest.importorskip("transformer_lens")
    name = request.param
    before = os.environ.get("HF_HUB_OFFLINE")
    bridge = zoo.load(name)
    assert os.environ.get("HF_HUB_OFFLINE") == before  # restored
    return name, bridge


def test_names_and_default():
    assert set(zoo.names()) == EXPECTED
    assert zoo.names() == sorted(zoo.names())
    assert set(zoo.DEFAULT) == EXPECTED
    for n in zoo.names():
        assert (zoo.path(n) / "model.safetensors").is_file()
        assert (zoo.path(n) / "tokenizer.json").is_file()


def test_unknown_name_is_clear():
    with pytest.raises(KeyError) as ei:
        zoo.path("gpt2-huge")
    msg = str(ei.value)
    assert "gpt2-huge" in msg and "gpt2-tiny-wd" in msg and "neox-tiny" in msg
    with pytest.raises(KeyError):
        zoo.info("nope")
    with pytest.raises(KeyError):
        zoo.load("nope")


def test_names_does_not_import_torch():
    # Load zoo/__init__.py on its own (the parent package may import torch itself).
    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('zoo_alone', {str(zoo.ZOO_DIR / '__init__.py')!r}); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "m.names(); m.info(m.DEFAULT[0]); "
        "print('torch' in sys.modules, 'transformer_lens' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False False"


def test_total_size():
    total = sum(f.stat().st_size for n in zoo.names() for f in zoo.path(n).rglob("*") if f.is_file())
    assert total <= MAX_BYTES, f"zoo checkpoints take {total / 2**20:.2f} MiB"


def test_recipes_have_results():
    for n in zoo.names():
        r = zoo.info(n)
        assert r["name"] == n
        res = r["results"]
        for k in ("final_train_loss", "final_val_loss", "final_val_perplexity", "train_wall_time_s"):
            assert isinstance(res[k], (int, float)) and math.isfinite(res[k])
        assert res["final_val_loss"] < 0.8 * math.log(r["vocab_size"])
        assert res["final_val_loss"] < res["init_val_loss"] - 1.0
        assert len(r["corpus"]["sha256"]) == 64
        assert r["corpus"]["python_version"]
        assert r["tokens_seen"] == r["training"]["steps"] * r["training"]["batch_size"] * r["training"]["block_size"]


def test_wd_pair_differs_in_exactly_one_knob():
    a, b = zoo.info("gpt2-tiny-wd"), zoo.info("gpt2-tiny-nowd")
    assert a["matched_with"] == "gpt2-tiny-nowd" and b["matched_with"] == "gpt2-tiny-wd"
    assert a["differs_in"] == b["differs_in"] == "weight_decay"
    assert a["training"]["weight_decay"] > 0 and b["training"]["weight_decay"] == 0
    fa, fb = _flatten(a), _flatten(b)
    assert fa.keys() == fb.keys()
    ignored = ("name", "matched_with", "command", "results.", "environment.platform", "provenance.lab_arm",
               "provenance.reproduction.")
    differing = {
        k for k in fa if fa[k] != fb[k] and not any(k == i or k.startswith(i) for i in ignored)
    }
    assert differing == {"training.weight_decay"}
    # identical architecture / config / tokenizer on disk, too
    import json

    ca = json.loads((zoo.path("gpt2-tiny-wd") / "config.json").read_text())
    cb = json.loads((zoo.path("gpt2-tiny-nowd") / "config.json").read_text())
    assert ca == cb
    assert (zoo.path("gpt2-tiny-wd") / "tokenizer.json").read_bytes() == (
        zoo.path("gpt2-tiny-nowd") / "tokenizer.json"
    ).read_bytes()


def _heldout_tokens(tokenizer, docs, n_tokens=1024):
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = []
    for d in docs:
        ids.append(eot)
        ids.extend(tokenizer.encode(d, add_special_tokens=False))
        if len(ids) > n_tokens + 1:
            break
    return ids[: n_tokens + 1]


def _ce(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)).item()


@pytest.mark.slow
def test_boot_forward_and_trained(booted, val_windows):
    import torch
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoConfig, AutoModelForCausalLM

    name, bridge = booted
    assert isinstance(bridge, TransformerBridge)
    assert bridge.cfg.model_name == name

    # forward on a short prompt
    toks = bridge.to_tokens(["Return the number of items."], prepend_bos=False, padding_side="right")
    with torch.no_grad():
        logits = bridge(toks)
    assert logits.shape[:2] == toks.shape and logits.shape[-1] == bridge.cfg.d_vocab
    assert torch.isfinite(logits).all()

    # held-out loss: well below ln(V) and below a freshly initialised model of the same config
    ids = torch.tensor(_heldout_tokens(bridge.tokenizer, val_windows))
    T = 128
    n = (len(ids) - 1) // T
    x, y = ids[: n * T].view(n, T), ids[1 : n * T + 1].view(n, T)
    with torch.no_grad():
        loss = _ce(bridge(x), y)
    vocab = len(bridge.tokenizer)
    assert loss < 0.8 * math.log(vocab), (name, loss)

    cfg = AutoConfig.from_pretrained(str(zoo.path(name)))
    torch.manual_seed(0)
    fresh = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        fresh_loss = _ce(fresh(input_ids=x).logits, y)
    assert loss < fresh_loss - 1.0, (name, loss, fresh_loss)
    # consistent with what the recipe recorded (the corpus is a fixed file: same held-out text)
    assert abs(loss - zoo.info(name)["results"]["final_val_loss"]) < 1.0


def test_provenance_names_the_fixed_corpus_and_the_lab_spec():
    from pathlib import Path

    from thermo_lens.experiments.lab import corpora, load_lab_spec

    root = Path(__file__).resolve().parents[2]
    for n in zoo.names():
        prov = zoo.info(n)["provenance"]
        assert prov["corpus_file_sha256"] == corpora.describe("stdlib-docstrings")["sha256"]
        assert prov["corpus_text_sha256"] == zoo.info(n)["corpus"]["sha256"]  # the very text it was trained on
        spec = load_lab_spec(root / prov["lab_spec"])
        arm = next(a for a in spec.arms() if a.id == prov["lab_arm"])
        train = zoo.info(n)["training"]
        assert (arm.recipe.lr, arm.recipe.weight_decay, arm.recipe.steps, arm.recipe.batch_size) == (
            train["lr"], train["weight_decay"], train["steps"], train["batch_size"])
        assert spec.seeds == (train["seed"],)


def test_load_bridge_is_the_default_host_and_hosts_are_checked():
    pytest.importorskip("transformer_lens.model_bridge")
    from thermo_lens.core.errors import ThermoLensInputError

    model = zoo.load("gpt2-tiny-wd", host="bridge")
    assert type(model).__name__ == "TransformerBridge" and model.cfg.model_name == "gpt2-tiny-wd"
    with pytest.raises(ThermoLensInputError, match="host must be one of 'bridge', 'hooked', 'hooked_sae'"):
        zoo.load("gpt2-tiny-wd", host="hooked_transformer")
    with pytest.raises(ThermoLensInputError, match="processed=True is for the hooked hosts"):
        zoo.load("gpt2-tiny-wd", processed=True)


def test_hooked_host_missing_says_what_to_install():
    """On TransformerLens 4 (no HookedTransformer) or without sae-lens, the error names the fix."""
    import importlib.util

    from thermo_lens.core.errors import UnsupportedHostError

    pytest.importorskip("transformer_lens")
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
        has_hooked = True
    except ImportError:
        has_hooked = False
    if not has_hooked:
        with pytest.raises(UnsupportedHostError, match="does not have.*transformer-lens>=3,<4.*host='bridge'"):
            zoo.load("gpt2-tiny-wd", host="hooked")
    if importlib.util.find_spec("sae_lens") is None:
        with pytest.raises(UnsupportedHostError, match=r"sae-lens is not installed: pip install 'thermo-lens\[sae\]'"):
            zoo.load("gpt2-tiny-wd", host="hooked_sae")
    if has_hooked and importlib.util.find_spec("sae_lens") is not None:
        pytest.skip("every host is installed here (tested in tests/hosts/test_hosts_zoo.py)")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tokenizer_files_name_a_class_every_transformers_has(name):
    """transformers 5 writes "TokenizersBackend", which transformers 4 (TransformerLens 2.16's) lacks;
    the shipped files name PreTrainedTokenizerFast, which both read as the same tokenizer."""
    import json

    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = json.loads((zoo.path(name) / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    tok = AutoTokenizer.from_pretrained(str(zoo.path(name)))
    assert isinstance(tok, PreTrainedTokenizerFast)
    raw = Tokenizer.from_file(str(zoo.path(name) / "tokenizer.json"))
    text = "Return the sum of x and y.\n    >>> add(1, 2)"
    assert tok(text)["input_ids"] == raw.encode(text).ids
    assert tok.bos_token == tok.eos_token == "<|endoftext|>"


def test_portable_tokenizer_config_rewrites_only_the_backend_name(tmp_path):
    import json

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend", "x": 1}))
    zoo.portable_tokenizer_config(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == {
        "tokenizer_class": "PreTrainedTokenizerFast", "x": 1}
    zoo.portable_tokenizer_config(tmp_path / "missing")  # no file: nothing to do
