"""The BOS modes and token scopes are listed once (their ``Literal`` types), and ``prepend_bos``
is read once per batch, not per prompt."""

from __future__ import annotations

from typing import get_args

import pytest

import thermo_lens as tl
from thermo_lens.core import tokens, validate
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.settings import RunSettings

PROMPTS = ["the cat sat on the mat", "Water freezes", "a third prompt here"]


def test_every_list_of_modes_and_scopes_is_the_literal_types():
    assert set(tokens.BOS_MODES) == {*get_args(tokens.BosModeName), True, False}
    assert tuple(tokens.TOKEN_SCOPES) == get_args(tokens.TokenScope)
    assert tuple(tokens.TERM_SCOPES) == get_args(tokens.TermScope)
    assert tokens.bos_modes_text() == '"host", True, False or "tokenizer"'
    for mode in tokens.BOS_MODES:
        assert validate.prepend_bos(mode) is mode or validate.prepend_bos(mode) == mode
        assert RunSettings(prepend_bos=mode).prepend_bos == mode
    for bad in ("yes", 1, None, "HOST"):
        with pytest.raises(ThermoLensInputError, match='prepend_bos must be "host", True, False or "tokenizer"'):
            RunSettings(prepend_bos=bad)
    import argparse

    from thermo_lens.cli import _add_measure_args

    parser = argparse.ArgumentParser()
    _add_measure_args(parser)
    help_text = parser.format_help()
    assert "{host,true,false,tokenizer}" in help_text and "{last,all_but_first,all,frobenius}" in help_text


def test_the_bos_mode_is_read_once_per_batch_and_gives_the_tokenizers_ids(bridge, monkeypatch):
    view = tl.ModelView(bridge("gpt2"))
    calls = []
    real = tokens.bos_id
    monkeypatch.setattr(tokens, "bos_id", lambda v: calls.append(1) or real(v))
    batch = tokens.tokenize(view, PROMPTS, prepend_bos=True)
    assert len(calls) == 1  # not once per prompt
    tok = view.tokenizer
    for row, p in enumerate(PROMPTS):
        want = [real(view)] + list(tok(p, add_special_tokens=False)["input_ids"])
        assert batch.tokens[row, : len(want)].tolist() == want and int(batch.lengths[row]) == len(want)
    plain = tokens.tokenize(view, PROMPTS, prepend_bos=False)
    assert plain.lengths.tolist() == [len(tok(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]
    host = tokens.tokenize(view, PROMPTS, prepend_bos="host")
    assert [host.tokens[i, : int(n)].tolist() for i, n in enumerate(host.lengths)] == \
        [view.model.to_tokens(p)[0].tolist() for p in PROMPTS]
    with pytest.raises(ThermoLensInputError, match="prepend_bos must be"):
        tokens.encode(view, PROMPTS[0], "yes")
