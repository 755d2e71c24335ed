"""The API boundary of the trust fixes (issues 21 and 27), fast: hook return values, hook names,
token padding, batch plans, paired t-tests, caches given as prompts, patch arguments.

The same behaviours on every host, against ``run_with_cache``, are in ``tests/hosts/test_hosts_tl_habits.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import thermo_lens as tl
from thermo_lens.core import attached
from thermo_lens.core.errors import ThermoLensHookError, ThermoLensInputError, ThermoLensInputTypeError
from thermo_lens.core.inputs import as_prompts
from thermo_lens.core.model import _centred
from thermo_lens.core.tokens import plan_batches

PROMPTS = ["The capital of France is Paris", "Water freezes at zero degrees", "the cat sat on the mat"]


# ---------------------------------------------------------------------------- hook return values
@pytest.mark.parametrize("value, what", [("ablated", "returned a str"), (3, "returned a int"),
                                         ([1, 2], "returned a list"), ("meta", "returned a meta tensor")])
def test_a_hook_returning_something_unusable_is_named(bridge, value, what):
    def bad_hook(x, hook):
        return torch.empty(x.shape, device="meta") if value == "meta" else value

    with pytest.raises(ThermoLensHookError, match=rf"bad_hook at blocks\.1\.attn\.hook_z .*{what}.*return None"):
        tl.residual_gain(bridge("gpt2"), PROMPTS, fwd_hooks=[("blocks.1.attn.hook_z", bad_hook)])


def test_a_hook_returning_integers_for_a_float_activation_is_named(bridge):
    def to_int(x, hook):
        return x.long()

    with pytest.raises(ThermoLensHookError, match=r"to_int .*returned a torch\.int64 tensor for a torch\.float32"):
        tl.residual_gain(bridge("gpt2"), PROMPTS, fwd_hooks=[("blocks.0.hook_resid_pre", to_int)])


def test_profile_refuses_a_string_for_a_boolean(bridge):
    with pytest.raises(ThermoLensInputError, match="attribution must be True or False"):
        tl.profile(bridge("gpt2"), PROMPTS, attribution="no")


# ---------------------------------------------------------------------------- hook names
class _Point:
    def __init__(self, name):
        self.name, self.fwd_hooks = name, []

    def add_hook(self, *a, **k):  # pragma: no cover - a hook point's interface
        pass


class _Host:
    """A duck-typed host: hook_dict and a config, nothing else."""

    def __init__(self, names, n_layers=2):
        self.hook_dict = {n: _Point(n) for n in names}
        self.cfg = type("Cfg", (), {"n_layers": n_layers})()


NAMES = [f"blocks.{l}.{h}" for l in range(2) for h in ("hook_resid_pre", "attn.hook_z", "hook_resid_post")]


def test_hook_names_are_checked_with_the_closest_valid_ones():
    host = _Host(NAMES)
    attached.check_hook_names(host, ["blocks.1.attn.hook_z", lambda n: n.endswith("hook_z")], "toy")
    with pytest.raises(ThermoLensInputError, match=r"toy has no hook point 'blocks\.1\.attn\.hook_zz'; closest: "
                                                   r"'blocks\.1\.attn\.hook_z'"):
        attached.check_hook_names(host, ["blocks.1.attn.hook_zz"], "toy")
    with pytest.raises(ThermoLensInputError, match=r"block 5 is out of range: toy has blocks 0\.\.1.*'blocks\.1\.attn\.hook_z'"):
        attached.check_hook_names(host, ["blocks.5.attn.hook_z"], "toy")
    with pytest.raises(ThermoLensInputError, match=r"closest: 'blocks\.0\.hook_resid_pre'"):
        attached.check_hook_names(host, ["blocks.0.HOOK_RESID_PRE"], "toy")
    with pytest.raises(ThermoLensInputError, match="matches none of toy's 6 hook points"):
        attached.check_hook_names(host, [lambda n: False], "toy")
    with pytest.raises(ThermoLensInputTypeError, match="hook name 0 is a int"):
        attached.check_hook_names(host, [5], "toy")


def test_forward_order_puts_a_block_s_input_first_and_its_output_last():
    names = ["blocks.1.hook_resid_post", "blocks.1.hook_mlp_out", "blocks.0.hook_resid_post", "hook_embed",
             "blocks.1.attn.hook_z", "blocks.1.hook_resid_pre.hook_sae_output", "blocks.1.hook_resid_pre", "ln_final.hook_normalized"]
    assert sorted(names, key=attached.forward_order) == [
        "hook_embed", "blocks.0.hook_resid_post", "blocks.1.hook_resid_pre", "blocks.1.hook_resid_pre.hook_sae_output",
        "blocks.1.attn.hook_z", "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post", "ln_final.hook_normalized"]


# ---------------------------------------------------------------------------- padded token ids
class _Tok:
    pad_token_id, bos_token_id = 0, 0
    padding_side = "right"

    def decode(self, ids):
        return " ".join(map(str, ids))

    def convert_ids_to_tokens(self, i):
        return "<pad>"


def test_padding_is_found_as_transformer_lens_finds_it():
    tok = _Tok()
    right = torch.tensor([[0, 5, 6, 7], [0, 8, 0, 0], [0, 9, 4, 0]])  # BOS = pad = 0; the middle 0 of no row is padding
    ps = as_prompts(right, tok)
    assert ps.token_ids == ((0, 5, 6, 7), (0, 8), (0, 9, 4)) and ps.starts == (0, 0, 0)
    assert "3 pad token(s)" in ps.padding and "right padding" in ps.padding
    tok.padding_side = "left"
    left = torch.tensor([[0, 5, 6, 7], [0, 0, 0, 8], [0, 0, 9, 4]])  # the last leading 0 is the BOS
    ps = as_prompts(left, tok)
    assert ps.token_ids == ((0, 5, 6, 7), (0, 8), (0, 9, 4)) and ps.starts == (0, 2, 1)
    with pytest.raises(ThermoLensInputError, match="end in the pad token"):
        as_prompts(right, tok)
    ps = as_prompts(torch.tensor([[1, 5, 6], [0, 1, 7]]), tok, prepend_bos=False)  # no BOS: leading 0 is padding
    assert ps.token_ids == ((1, 5, 6), (1, 7))
    tok.padding_side = "right"
    with pytest.raises(ThermoLensInputError, match="every token row ends in the pad token"):
        as_prompts(torch.tensor([[0, 5, 0], [0, 0, 0][:1] + [7, 0]]), tok)
    with pytest.raises(ThermoLensInputError, match=r"row\(s\) \[1\] hold nothing but the pad token"):
        as_prompts(torch.tensor([[0, 5, 6], [0, 0, 0]]), tok)
    with pytest.raises(ThermoLensInputError, match=r"row\(s\) \[1\] start with 2 pad token.*padding_side = 'left'"):
        as_prompts(torch.tensor([[0, 5, 6], [0, 0, 6]]), tok)
    assert as_prompts(torch.tensor([[3, 5, 6]]), tok).padding == ""  # no pad token: nothing derived


def test_a_cache_is_never_prompts():
    cache = {"blocks.0.hook_resid_pre": torch.zeros(1, 3, 4), "hook_embed": torch.zeros(1, 3, 4)}
    with pytest.raises(ThermoLensInputTypeError, match="got an dict of 2 activations as the prompts.*cache="):
        as_prompts(cache)

    class ActivationCache:  # what TransformerLens' cache looks like to as_prompts
        cache_dict = cache

        def keys(self):
            return cache.keys()

        def __iter__(self):
            return iter(cache)

    with pytest.raises(ThermoLensInputTypeError, match="ActivationCache of 2 activations"):
        as_prompts(ActivationCache())


# ---------------------------------------------------------------------------- batch plans and t-tests
def test_the_batch_plan_depends_on_lengths_and_settings_only():
    lengths = [5, 9, 3, 12, 5, 7]
    assert plan_batches(lengths, 8) == [[0, 1, 2, 3, 4, 5]]  # they fit one batch: the caller's order
    assert plan_batches(lengths, 4) == plan_batches(lengths, 4, sort_by_length=True)
    assert plan_batches(lengths, 4, sort_by_length=False) == [[0, 1, 2, 3], [4, 5]]


@pytest.mark.slow  # six passes (~1.5 s on a busy machine)
def test_identity_hook_differs_by_exactly_zero_and_t_is_undefined(bridge):
    model = bridge("gpt2")
    many = PROMPTS + ["a", "b c d e f g h i"]
    clean = tl.residual_gain(model, many, batch_size=2)
    same = tl.residual_gain(model, many, batch_size=2, fwd_hooks=[("blocks.1.hook_resid_pre", lambda x, hook: x)])
    d = same - clean
    assert float(d.difference.abs().max()) == 0.0 and np.isnan(d.t_statistic).all() and np.isnan(d.pvalue).all()
    assert set(d.to_frame()["t_test"]) == {"undefined: zero variance (every difference is 0)"}
    other = tl.residual_gain(model, many, batch_size=5)
    assert any("batched differently" in n for n in (other - clean).notes)
    one = tl.residual_gain(model, many[:1], fwd_hooks=[("blocks.1.attn.hook_z", _zero)]) - \
        tl.residual_gain(model, many[:1])
    assert np.isnan(one.t_statistic).all() and "1 prompt" in repr(one)


def _zero(z, hook):
    z = z.clone()
    z[:, :, 0] = 0
    return z


# ---------------------------------------------------------------------------- patches
def test_patch_arguments_are_validated(bridge):
    model = bridge("gpt2")
    with pytest.raises(ThermoLensInputTypeError, match=r"heads must be an int or a list of ints, got the string '13'"):
        tl.patch_from(model, PROMPTS[:1], "blocks.0.attn.hook_z", heads="13")
    with pytest.raises(ThermoLensInputTypeError, match="hook_names must be a hook name"):
        tl.patch_from(model, PROMPTS[:1], 5)
    with pytest.raises(ThermoLensInputTypeError, match="positions must be an int or a list of ints"):
        tl.patch_from(model, PROMPTS[:1], "blocks.0.hook_resid_pre", positions="-1")
    patch = tl.patch_from(model, PROMPTS[:1], "blocks.0.attn.hook_z", heads=[1, 3, -1], positions=-1)
    assert patch.heads == (1, 3) and patch.model_name == "gpt2"


# ---------------------------------------------------------------------------- weight processing
def test_centred_rows_are_told_from_raw_ones():
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(64, 768, generator=g)
    assert not _centred(raw) and _centred(raw - raw.mean(-1, keepdim=True))
    bf16 = (raw - raw.mean(-1, keepdim=True)).bfloat16()  # centred, then rounded to bfloat16
    assert _centred(bf16) and not _centred(torch.zeros(4, 8))


def test_a_patch_says_which_hooks_already_on_the_model_its_clean_run_ran_under(bridge):
    model = bridge("gpt2")
    model.add_hook("blocks.0.attn.hook_z", _zero)
    try:
        patch = tl.patch_from(model, PROMPTS[:1], "blocks.1.hook_resid_pre", positions=-1)
    finally:
        model.reset_hooks()
    assert "clean run under hooks already on the model: blocks.0.attn.hook_z <- test_tl_habits._zero" in patch.description
    assert "clean run under" not in tl.patch_from(model, PROMPTS[:1], "blocks.1.hook_resid_pre").description
