"""Offloaded and dispatched models (issue: scale): every measure on a model whose layers sit on disk
or in an accelerate offload map equals the same model in memory, and weights are read a layer at a
time."""

from __future__ import annotations

import json

import pytest
import torch

import thermo_lens as tl
from thermo_lens.core import offload
from thermo_lens.core.errors import ThermoLensInputError

accelerate = pytest.importorskip("accelerate")

PROMPTS = ["The cat sat on the mat.", "Offloading keeps the weights on disk until a layer runs.", "Hi"]


def _offloaded_bridge(checkpoint_dir, arch, tmp_path):
    """The checkpoint booted by the host's own device_map support: even layers offloaded to disk, odd
    ones resident (a model split between offload and memory)."""
    from transformer_lens.model_bridge import TransformerBridge

    d = checkpoint_dir(arch)
    L = json.loads((d / "config.json").read_text())["num_hidden_layers"]
    device_map = {"model.embed_tokens": "cpu", "model.norm": "cpu", "lm_head": "cpu", "model.rotary_emb": "cpu"}
    device_map.update({f"model.layers.{i}": "disk" if i % 2 == 0 else "cpu" for i in range(L)})
    model = TransformerBridge.boot_transformers(str(d), device_map=device_map, offload_folder=str(tmp_path / "off"))
    assert offload.is_offloaded(model), "the test model must really be offloaded"
    assert any(p.is_meta for p in model.parameters())
    return model


@pytest.mark.slow
def test_every_measure_on_a_disk_offloaded_model_equals_the_model_in_memory(checkpoint_dir, bridge, tmp_path,
                                                                              monkeypatch):
    ref, off = bridge("llama_gqa"), _offloaded_bridge(checkpoint_dir, "llama_gqa", tmp_path)
    assert tl.ModelView(off).device == torch.device("cpu")  # the execution device, not meta

    g0, g1 = tl.residual_gain(ref, PROMPTS), tl.residual_gain(off, PROMPTS)
    torch.testing.assert_close(g1.block_gain, g0.block_gain, rtol=1e-6, atol=0)
    a0, a1 = tl.gain_attribution(ref, PROMPTS), tl.gain_attribution(off, PROMPTS)
    for name in ("head", "mlp", "bias", "total"):
        torch.testing.assert_close(getattr(a1, name), getattr(a0, name), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tl.anisotropy_profile(off, PROMPTS).values,
                               tl.anisotropy_profile(ref, PROMPTS).values, equal_nan=True)
    torch.testing.assert_close(tl.sheaf_traces(off, PROMPTS).trace, tl.sheaf_traces(ref, PROMPTS).trace,
                               rtol=1e-5, atol=1e-7)

    # The spectral signature materialises one layer's attention at a time (never the whole model).
    peak: list[int] = []

    class Spy(set):
        def add(self, item):
            super().add(item)
            peak.append(len(self))

    monkeypatch.setattr(offload, "_LOADED", Spy())
    s0, s1 = tl.spectral_signature(ref), tl.spectral_signature(off)
    per_layer_linears = 4  # q, k, v, o projections of one attention layer
    assert peak and max(peak) <= per_layer_linears
    for f in ("W_V_norm", "W_O_norm", "ov_norm", "qk_norm", "layer_W_V_norm", "layer_W_O_norm"):
        torch.testing.assert_close(getattr(s1, f), getattr(s0, f), rtol=1e-6, atol=0)
    on_disk = [p for n, p in off.original_model.named_parameters() if ".layers.0." in n]
    assert on_disk and all(p.is_meta for p in on_disk), "an offloaded layer goes back to meta after a read"


@pytest.mark.slow
def test_accelerate_cpu_offload_of_a_booted_model(checkpoint_dir, tmp_path):
    from accelerate import cpu_offload

    from thermo_lens.testing import boot

    ref = boot("llama_gqa", checkpoint_dir("llama_gqa"))
    off = boot("llama_gqa", checkpoint_dir("llama_gqa"))  # (accelerate cannot hook a bridge of GPT-2 or NeoX twice)
    cpu_offload(off.original_model, execution_device=torch.device("cpu"))
    torch.testing.assert_close(tl.residual_gain(off, PROMPTS).block_gain, tl.residual_gain(ref, PROMPTS).block_gain)
    a0, a1 = tl.gain_attribution(ref, PROMPTS), tl.gain_attribution(off, PROMPTS)
    torch.testing.assert_close(a1.head, a0.head, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a1.bias, a0.bias, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tl.spectral_signature(off).ov_norm, tl.spectral_signature(ref).ov_norm)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "neox"])
def test_a_wholly_disk_offloaded_gpt2_or_neox_equals_the_model_in_memory(checkpoint_dir, bridge, arch, tmp_path):
    """device_map={'': 'disk'}: every module on disk, including GPT-2's fused QKV (Conv1D) and the
    biases and norms the bridge aliases at boot (b_out -> out.bias: a meta placeholder there until
    read through the module)."""
    from transformer_lens.model_bridge import TransformerBridge

    from thermo_lens.experiments.sweeps import LogitDifference, ablation_sweep

    ref = bridge(arch)
    off = TransformerBridge.boot_transformers(str(checkpoint_dir(arch)), device_map={"": "disk"},
                                              offload_folder=str(tmp_path / "off"))
    assert offload.is_offloaded(off) and any(p.is_meta for p in off.parameters())
    a0, a1 = tl.gain_attribution(ref, PROMPTS), tl.gain_attribution(off, PROMPTS)
    for name in ("head", "mlp", "bias", "total"):
        torch.testing.assert_close(getattr(a1, name), getattr(a0, name), rtol=1e-5, atol=1e-6)
    p0, p1 = tl.profile(ref, PROMPTS), tl.profile(off, PROMPTS)
    assert not p1.meta.get("skipped") and p1.attribution is not None
    torch.testing.assert_close(p1.gain.block_gain, p0.gain.block_gain, rtol=1e-6, atol=0)
    torch.testing.assert_close(p1.attribution.head, p0.attribution.head, rtol=1e-5, atol=1e-6)
    tokens = torch.tensor([[3, 5, 17, 33, 41, 9]])
    ld = LogitDifference(5, 7)
    s0, s1 = (ablation_sweep(m, tokens, "attn.hook_z", measure=ld, layers=[0], heads=[0]) for m in (ref, off))
    torch.testing.assert_close(s1.baseline, s0.baseline, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s1.per_prompt, s0.per_prompt, rtol=1e-5, atol=1e-6)
    assert all(p.is_meta for p in off.blocks[0].mlp.parameters()), "an offloaded layer goes back to meta after a read"


# ---------------------------------------------------------------- the helpers, without a model host

class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(self.a(x))


def test_materialised_loads_for_the_read_and_puts_back():
    from accelerate import cpu_offload

    m = _Tiny()
    want = m.a.weight.detach().clone()
    cpu_offload(m, execution_device=torch.device("cpu"))
    assert offload.is_offloaded(m) and m.a.weight.is_meta
    assert offload.execution_device(m) == torch.device("cpu")
    with offload.materialised(m.a):
        got = m.a.weight.detach()
        with offload.materialised(m):  # re-entrant: the inner one loads only what is not loaded yet
            assert not m.b.weight.is_meta
        assert not m.a.weight.is_meta
    assert m.a.weight.is_meta and m.b.weight.is_meta
    torch.testing.assert_close(got, want)  # a tensor read inside stays valid


def test_a_model_in_memory_is_untouched_and_empty_weights_are_refused():
    m = _Tiny()
    assert not offload.is_offloaded(m) and offload.execution_device(m) is None
    with offload.materialised(m):
        pass
    with accelerate.init_empty_weights():
        empty = _Tiny()
    with pytest.raises(ThermoLensInputError, match="meta device and no offload hook"):
        with offload.materialised(empty, "layer 0's W_O"):
            pass


def test_a_pass_looks_up_the_device_once(bridge, monkeypatch):
    """Finding a dispatched model's execution device walks every module: a pass of many batches
    does it once (ModelView.pinned_device), not per batch, and the pin ends with the pass."""
    from thermo_lens.core.model import ModelView

    view = ModelView(bridge("gpt2"))
    calls = []
    real = offload.execution_device
    monkeypatch.setattr(offload, "execution_device", lambda m: calls.append(1) or real(m))
    tl.residual_gain(view, PROMPTS * 4, batch_size=12, progress=False)  # one batch
    one = len(calls)
    g = tl.residual_gain(view, PROMPTS * 4, batch_size=2, progress=False)  # 6 batches
    assert len(calls) == 2 * one <= 4 and g.block_gain.shape[0] == 12  # the pass's and the results' metadata
    calls.clear()
    with view.pinned_device() as dev:
        assert view.device is dev and view.device is dev and len(calls) == 1
    assert view.device == dev and len(calls) == 2  # looked up again once unpinned
