"""Per-prompt arrays follow the real token counts: one long prompt among many short ones does not
pad every prompt to its length (the recorder keeps length-bucketed batches; metrics reduce
batch by batch)."""

import pytest
import torch

import thermo_lens
from thermo_lens import zoo
from thermo_lens.core.passes import Recorder, collect
from thermo_lens.measures.sheaf.traces import attention_diagonal
from thermo_lens.measures.gain import residual_norms

SHORT = ["The capital of France is", "Water freezes at", "Birds of a feather", "Two plus two is"] * 10
LONG = "word " * 55  # about 110 tokens; the context is 128


@pytest.fixture(scope="module")
def tiny():
    return zoo.load("gpt2-tiny-wd")


def test_recorded_arrays_are_length_bucketed(tiny):
    prompts = SHORT + [LONG]
    col = collect(tiny, prompts, [residual_norms, attention_diagonal], prepend_bos=True, batch_size=4,
                  progress=False)
    stored = sum(p.numel() for k, parts in col.recorder._parts.items() if k[0] == "attn_diag" for p in parts)
    L, H = tiny.cfg.n_layers, tiny.cfg.n_heads
    padded = L * len(prompts) * H * int(col.lengths.max())
    real = L * H * int(col.lengths.sum())
    assert stored < 1.5 * real and padded > 8 * stored  # about the real token count, not 41 x 121
    # batches() hands out each batch at its own width, with its prompts' lengths
    widths = [(n.shape[-1], int(ln.max())) for n, ln in col.batches("resid_norm")]
    assert all(w == m for w, m in widths) and max(w for w, _ in widths) == int(col.lengths.max())
    rows = torch.cat([ln for _, ln in col.batches("resid_norm")])
    assert torch.equal(col.in_caller_order(rows), col.lengths)


@pytest.mark.slow
def test_profile_never_pads_to_the_longest_prompt_and_matches_the_dense_computation(tiny, monkeypatch):
    prompts = SHORT[:12] + [LONG]
    dense_gain = thermo_lens.residual_gain(tiny, prompts, batch_size=4, progress=False, per_token=True)
    dense_traces = thermo_lens.sheaf_traces(tiny, prompts, batch_size=4, progress=False)
    real_stack = Recorder.stack

    def no_global_padding(self, name):
        if name in ("attn_diag", "resid_norm"):
            raise AssertionError(f"{name} was padded to the longest prompt of the run")
        return real_stack(self, name)

    monkeypatch.setattr(Recorder, "stack", no_global_padding)
    p = thermo_lens.profile(tiny, prompts, batch_size=4, progress=False)
    assert torch.equal(p.gain.block_gain, dense_gain.block_gain)
    assert torch.equal(p.sheaf.trace, dense_traces.trace)
    # independent check of the block gain from the per-token gains (padded, asked for explicitly)
    per_tok = dense_gain.per_token_gain  # [prompt, layer, pos], NaN on padding
    mask = torch.arange(per_tok.shape[-1])[None, :] < dense_gain.lengths[:, None]
    mask[:, 0] = False
    expect = torch.where(mask[:, None, :], per_tok.double(), 0.0).sum(-1) / mask.sum(-1)[:, None]
    torch.testing.assert_close(p.gain.block_gain.double(), expect, rtol=1e-6, atol=1e-6)
    back = type(p).from_json(p.to_json())
    assert torch.equal(back.gain.block_gain, p.gain.block_gain) and torch.equal(back.sheaf.trace, p.sheaf.trace)


@pytest.mark.slow
def test_benchmark_script_runs_quick():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "ragged_memory.py"), "--quick"],
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "attn_diag" in out.stdout and "x" in out.stdout


def test_small_results_are_packed_into_a_few_slabs_and_read_back_exactly():
    from thermo_lens.core.packed import PackedParts, Slabs

    slabs = Slabs()
    parts = PackedParts(slabs)
    given = [torch.randn(3, 4, dtype=torch.float64), torch.tensor([True, False, True]), torch.arange(5),
             torch.randn(2, 3, 7)[:, 1], torch.empty(0, 4), torch.randn(300_000), torch.tensor(2.5),
             torch.randn(1, 13, dtype=torch.float64)[:, 4]]  # one element of a strided view
    for t in given:
        parts.append(t)
    kept = [t.clone() for t in given]
    for t in given:  # the stored values are copies (the batch's own tensors are freed or reused)
        if t.is_floating_point() and t.numel() and t.numel() < 1000:
            t.add_(1.0)
    assert len(parts) == len(given) and len(slabs._slabs) == 1
    for got, want in zip(parts, kept):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert torch.equal(parts[1], kept[1]) and [p.shape for p in parts[2:4]] == [(5,), (2, 7)]


def test_packed_bookkeeping_is_two_int_arrays_not_a_tuple_per_tensor():
    """A long pass records hundreds of thousands of parts: each costs 8 bytes plus 8 per dimension
    of bookkeeping (a tuple per tensor held ~100 bytes), and reads back exactly, by index too."""
    import sys as _sys

    from thermo_lens.core.packed import PackedParts, Slabs

    gen = torch.Generator().manual_seed(0)
    slabs = Slabs()
    parts = PackedParts(slabs)
    given = [torch.randn(int(torch.randint(1, 9, (1,), generator=gen)), 5, generator=gen) for _ in range(3000)]
    given.insert(7, torch.randn(300_000))  # too large for a slab: kept aside
    given.insert(11, torch.arange(6).reshape(2, 3))  # another dtype: kept aside
    for t in given:
        parts.append(t)
    assert len(parts) == len(given) and len(parts._kept) == 2
    assert all(torch.equal(got, want) for got, want in zip(parts, given))
    assert torch.equal(parts[-1], given[-1]) and torch.equal(parts[11], given[11])
    assert [t.shape for t in parts[5:9]] == [t.shape for t in given[5:9]]
    with pytest.raises(IndexError):
        parts[len(given)]
    per_entry = (_sys.getsizeof(parts._loc) + _sys.getsizeof(parts._shape)) / len(given)
    assert per_entry < 40, per_entry


def test_rows_put_with_one_copy_read_back_as_separate_parts_exactly():
    rec = Recorder()
    means = torch.randn(5, 3, dtype=torch.float64)
    rec.put(("other", 0), torch.randn(7))  # an unaligned end before the rows
    rec.put_rows([("a", 0), ("b", 0), ("c", 0)], means.T)  # strided: each column becomes one part
    rec.put_rows([("a", 1), ("b", 1)], torch.randn(2, 300_000))  # too large for a slab: kept as is
    kept = means.clone()
    means.add_(1.0)  # the parts are copies
    assert [rec._parts[(k, 0)][0].tolist() for k in "abc"] == kept.T.tolist()
    assert rec._parts[("a", 0)][0].shape == (5,) and rec._parts[("a", 1)][0].shape == (300_000,)
    assert torch.equal(rec.stack("c"), kept[:, 2][None])
    assert len(rec._slabs._slabs) == 1
    with pytest.raises(ValueError, match="2 keys for 3 rows"):
        rec.put_rows([("a", 2), ("b", 2)], means.T)


def test_a_batch_stores_its_results_when_it_ends_in_order_and_a_failed_batch_stores_none():
    """Inside a batch, results wait on their device and are stored at the batch's end (one
    device-to-host copy per dtype on a GPU instead of one per hook), each equal to what was recorded;
    a batch that raises stores nothing; a result the slabs keep as it is does not share (pin) the
    batched copy of the small ones."""
    from thermo_lens.core.tokens import TokenBatch

    batch = TokenBatch(tokens=torch.zeros(2, 3, dtype=torch.long), lengths=torch.tensor([3, 2]),
                       prompt_index=torch.tensor([0, 1]), prepend_bos=True)
    rec = Recorder()
    small64, small32, rows = torch.randn(2, 4, dtype=torch.float64), torch.randn(2), torch.randn(3, 2, dtype=torch.float64)
    big = torch.randn(2, 40_000, dtype=torch.float64)  # over a quarter of a slab: kept as it is
    with rec.batch(batch):
        rec.put(("x", 0), small64)
        rec.put(("y", 0), small32)
        rec.put(("big", 0), big)
        rec.put_rows([("r", 0), ("r", 1), ("r", 2)], rows)
        assert not rec._parts and len(rec._pending) == 4  # nothing stored before the batch ends
    assert torch.equal(rec._parts[("x", 0)][0], small64) and torch.equal(rec._parts[("y", 0)][0], small32)
    assert [rec._parts[("r", i)][0].tolist() for i in range(3)] == rows.tolist()
    kept = rec._parts[("big", 0)][0]
    assert torch.equal(kept, big) and kept.untyped_storage().nbytes() == big.numel() * 8
    with pytest.raises(RuntimeError, match="boom"):
        with rec.batch(batch):
            rec.put(("x", 0), small64 + 1)
            raise RuntimeError("boom")
    assert len(rec._parts[("x", 0)]) == 1 and not rec._pending


def test_a_pass_keeps_its_results_in_slabs_and_the_sheaf_sums_in_the_hook(tiny):
    from thermo_lens.measures.sheaf.traces import attention_diagonal_sums, traces_from_collected

    prompts = SHORT + [LONG]
    per_token = collect(tiny, prompts, [attention_diagonal], prepend_bos=True, batch_size=4, progress=False)
    summed = collect(tiny, prompts, [residual_norms, attention_diagonal_sums], prepend_bos=True, batch_size=4,
                     progress=False)
    rec = summed.recorder
    stored = [p for parts in rec._parts.values() for p in parts]
    assert len(stored) > 100 and len({p.untyped_storage().data_ptr() for p in stored}) <= len(rec._slabs._slabs)
    assert not any(k[0] == "attn_diag" for k in rec._parts)  # no per-token diagonal kept
    assert torch.equal(traces_from_collected(summed).trace, traces_from_collected(per_token).trace)
