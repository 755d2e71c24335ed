"""Rows per pass of a sweep: ``batch_size="auto"`` and the retry at half the rows on OOM."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from thermo_lens import ThermoLensInputError
from thermo_lens.core.settings import RunSettings
from thermo_lens.experiments.sweeps import patch_sweep, rows


def _pairs(n: int = 3, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(1, 250, (n, length), generator=g), torch.randint(1, 250, (n, length), generator=g)


def _view(device: str) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device(device), dtype=torch.bfloat16, d_model=2048, n_heads=32,
                           d_vocab=128256, model=SimpleNamespace(cfg=SimpleNamespace(d_mlp=8192)))


def test_auto_keeps_the_cpu_default_and_given_sizes():
    cpu = _view("cpu")
    assert rows.rows_per_pass(cpu, None, {}, 10) == (64, {})
    assert rows.rows_per_pass(cpu, None, {"batch_size": "auto", "progress": False}, 10) == (64, {"progress": False})
    assert rows.rows_per_pass(cpu, None, {"batch_size": 7}, 10) == (7, {"batch_size": 7})
    assert rows.rows_per_pass(cpu, RunSettings(batch_size=5), {}, 10)[0] == 5
    with pytest.raises(ThermoLensInputError, match="positive int or 'auto'"):
        rows.check_rows("many")


def test_auto_on_cuda_fills_the_headroom_of_the_free_memory(monkeypatch):
    """On CUDA, rows = HEADROOM * free memory // the estimated bytes of one row (mem_get_info faked)."""
    free = 40 * 2**30
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    view = _view("cuda")
    per_row = rows.row_bytes(view, 32)
    # one row: the bf16 residual stream and block temporaries, the attention of a layer and the logits
    assert per_row == 32 * (2 * 0 + 4 * (16 * 2048 + 2 * 8192) + 4 * 2 * 32 * 32 + 4 * 128256)
    got, run = rows.rows_per_pass(view, None, {"batch_size": "auto"}, 32)
    assert got == int(rows.HEADROOM * free) // per_row and run == {}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1, 80 * 2**30))
    assert rows.rows_per_pass(view, None, {}, 32)[0] == 1  # at least one row


@pytest.mark.slow
def test_a_pass_out_of_memory_runs_again_at_half_the_rows_with_the_same_cells(bridge, monkeypatch):
    from thermo_lens.core.passes import capture, stacked

    m = bridge("gpt2")
    clean, corr = _pairs()
    want = patch_sweep(m, clean, corr, "attn.hook_z", measure="total_amplification", batch_size=6)
    real, sizes = stacked.collect, []

    def tight(view, ps, reductions, settings, *a, **kw):  # a device that holds at most 6 rows a pass
        sizes.append(settings.batch_size)
        if settings.batch_size > 6:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(view, ps, reductions, settings, *a, **kw)

    for module in (stacked, capture):  # the sweep's passes: its clean capture and its stacked conditions
        monkeypatch.setattr(module, "collect", tight)
    got = patch_sweep(m, clean, corr, "attn.hook_z", measure="total_amplification", batch_size=48)
    assert 48 in sizes and any(s <= 6 for s in sizes)  # tried at 48 rows, ran at half, half again ...
    torch.testing.assert_close(got.per_prompt, want.per_prompt, rtol=0, atol=0)
    sizes.clear()

    def never(view, ps, reductions, settings, *a, **kw):
        sizes.append(settings.batch_size)
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    for module in (stacked, capture):
        monkeypatch.setattr(module, "collect", never)
    with pytest.raises(torch.OutOfMemoryError):
        patch_sweep(m, clean, corr, "attn.hook_z", measure="total_amplification", batch_size=8)
    assert sizes[-1] == 1 or min(sizes) <= 3  # halved down to one copy of the prompts per pass, then raised
