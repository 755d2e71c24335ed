"""The host matrix: one row per host class, its adapter checked against what the host itself does.

Each row of :data:`ROWS` names a host class, the adapter that must read it
(:mod:`thermo_lens.core.hosts`), how to build it offline on the tiny fixtures, and what its blocks are.
Every adapter's answers are checked against the host's own behaviour, not against the adapter's
constants: the residual a block hands on must be the tensor the next block receives, the embedding
hook must exist and carry ``d_model`` per token, the mask keyword must make a padded row equal the
same prompt run alone, ``to_tokens`` must be the host's, and a pass from block ``l`` must equal the
full pass where the adapter says it can run one. A host the installed TransformerLens lacks is
skipped with the reason (each CI leg installs one release: TransformerLens 4 has the bridge, 2.16 /
3.x the ``Hooked*`` classes and SAELens).

A new host is one adapter file and one row here (:func:`test_every_adapter_has_a_row` fails until
it has one).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from thermo_lens import ModelView
from thermo_lens.core.host import _parse, detect_host, transformer_lens_version
from thermo_lens.core.hosts import (ADAPTERS, FALLBACK, BridgeAdapter, HookedEncoderAdapter, HookedSAETransformerAdapter,
                               HookedTransformerAdapter, SAETransformerBridgeAdapter, adapter_for)
from thermo_lens.core.hosts.protocol import PROTOCOL_MEMBERS, ThermoLensModelProtocol, TransformerLensModel
from thermo_lens.testing import hooked_encoder, hooked_transformer

pytestmark = pytest.mark.hosts

TL = _parse(transformer_lens_version())
LEGACY = TL[0] in (2, 3)
HAS_BRIDGE = TL[0] >= 3
HAS_SAE_LENS = importlib.util.find_spec("sae_lens") is not None
PROMPTS = ["The cat sat on the mat", "Entropy always increases"]
TOL = 1e-5


def _sae_bridge(directory: Path) -> Any:
    try:
        from sae_lens.analysis.sae_transformer_bridge import SAETransformerBridge
    except ImportError:
        pytest.skip("this sae-lens / TransformerLens has no SAETransformerBridge")
    return SAETransformerBridge.boot_transformers(str(directory))


def _bridge(directory: Path) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(directory))


def _hooked_sae(directory: Path) -> Any:
    import sae_lens

    return hooked_transformer(directory, cls=sae_lens.HookedSAETransformer)


@dataclass(frozen=True)
class Row:
    """One host: its adapter and kind, the fixture architecture and checkpoint tokenizer, how to
    build it, when this leg cannot, its block layout, and whether a pass can start at a layer
    (``None``: when the host's ``forward`` takes ``start_at_layer``)."""

    adapter: type
    kind: str
    arch: str
    build: Callable[[Path], Any]
    unavailable: Callable[[], str | None]
    layout: str
    starts: bool | None


ROWS: dict[str, Row] = {
    "HookedTransformer": Row(
        HookedTransformerAdapter, "hooked_transformer", "gpt2", hooked_transformer,
        lambda: None if LEGACY else "HookedTransformer was removed in TransformerLens 4", "pre", True),
    "HookedSAETransformer": Row(
        HookedSAETransformerAdapter, "hooked_sae_transformer", "gpt2", _hooked_sae,
        lambda: None if LEGACY and HAS_SAE_LENS else "sae-lens needs TransformerLens 2.16.x / 3.x", "pre", True),
    "TransformerBridge": Row(
        BridgeAdapter, "bridge", "gpt2", _bridge,
        lambda: None if HAS_BRIDGE else "no TransformerBridge in TransformerLens 2.x", "pre", None),
    "SAETransformerBridge": Row(
        SAETransformerBridgeAdapter, "bridge", "gpt2", _sae_bridge,
        lambda: None if HAS_BRIDGE and HAS_SAE_LENS else "SAETransformerBridge needs sae-lens and a bridge",
        "pre", None),
    "HookedEncoder": Row(
        HookedEncoderAdapter, "hooked_encoder", "bert", hooked_encoder,
        lambda: None if LEGACY else "HookedEncoder was removed in TransformerLens 4", "post", False),
}


@pytest.fixture(scope="module")
def host(checkpoint_dir):
    """``host(name)`` -> (row, model), built once per module."""
    built: dict[str, Any] = {}

    def get(name: str) -> tuple[Row, Any]:
        row = ROWS[name]
        why = row.unavailable()
        if why:
            pytest.skip(why)
        if name not in built:
            torch.manual_seed(0)
            built[name] = row.build(Path(checkpoint_dir(row.arch))).eval()
        return row, built[name]

    return get


# ---------------------------------------------------------------------------- the matrix is complete
def test_every_adapter_has_a_row():
    assert {type(a) for a in ADAPTERS} == {r.adapter for r in ROWS.values()}
    assert {r.adapter.kind for r in ROWS.values()} == {"bridge", "hooked_transformer", "hooked_sae_transformer",
                                                        "hooked_encoder"}


def test_our_protocol_names_what_transformer_lens_protocol_names():
    """On TransformerLens releases that ship ``TransformerLensModel`` it is the one used, and the
    Protocol defined for the others names the same members."""
    ours = {n for n in vars(ThermoLensModelProtocol) if n in PROTOCOL_MEMBERS}
    assert ours == set(PROTOCOL_MEMBERS)
    if importlib.util.find_spec("transformer_lens.model_protocol") is None:
        assert TransformerLensModel is ThermoLensModelProtocol
        return
    from transformer_lens.model_protocol import TransformerLensModel as tl_protocol

    assert TransformerLensModel is tl_protocol
    tl_members = {n for n in vars(tl_protocol) if not n.startswith("_")}
    assert tl_members == set(PROTOCOL_MEMBERS)


# ---------------------------------------------------------------------------- each host against itself
@pytest.mark.parametrize("name", list(ROWS))
def test_detection_picks_the_rows_adapter_and_the_model_is_a_transformer_lens_model(name, host):
    row, model = host(name)
    h = detect_host(model)
    assert type(h.adapter) is row.adapter and h.kind == row.kind and h.cls == name
    view = ModelView(model)
    assert view.adapter is h.adapter and view.backend == row.adapter.backend
    assert isinstance(model, TransformerLensModel) and isinstance(model, ThermoLensModelProtocol)
    assert view.layout.kind == row.layout and view.weight_processing == ()


def _keeper(into: dict[str, torch.Tensor], name: str) -> Callable[..., None]:
    """A hook keeping its activation under the name it was registered at (a bridge's hook points
    carry their canonical names, not the alias a user writes)."""
    def keep(act: torch.Tensor, hook: Any) -> None:
        into[name] = act.detach().clone()
    return keep


def _run(model: Any, adapter: Any, tokens: torch.Tensor, names: list[str], **kw: Any) -> dict[str, torch.Tensor]:
    """The activations at ``names`` in one forward pass, each name re-pointed as the adapter says
    (SAETransformerBridge resolves TransformerLens' aliases only through its own helper)."""
    got: dict[str, torch.Tensor] = {}
    points = [adapter.resolve_hook(model, n, "the model") if adapter.needs_resolving(model) else n for n in names]
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[(p, _keeper(got, n)) for p, n in zip(points, names)], **kw)
    return got


@pytest.mark.parametrize("name", list(ROWS))
def test_hook_names_are_where_the_host_carries_the_stream(name, host):
    """``blocks.{l}.<resid_out_point>`` is the tensor block ``l + 1`` receives (its
    ``hook_resid_pre``); the embedding hook exists with ``d_model`` per token."""
    row, model = host(name)
    adapter = detect_host(model).adapter
    L = int(model.cfg.n_layers)
    tokens = torch.tensor([adapter.to_tokens(model, PROMPTS[0])])
    outs = [f"blocks.{l}.{adapter.resid_out_point}" for l in range(L)]
    ins = [f"blocks.{l}.hook_resid_pre" for l in range(L)]
    got = _run(model, adapter, tokens, [adapter.embed_hook, *outs, *ins])
    assert set(got) == {adapter.embed_hook, *outs, *ins}, "a hook point the adapter names never ran"
    for l in range(L - 1):
        torch.testing.assert_close(got[outs[l]], got[ins[l + 1]], atol=0, rtol=0)
    emb = got[adapter.embed_hook]
    assert emb.shape[-1] == model.cfg.d_model and emb.shape[-2] == tokens.shape[1]


@pytest.mark.parametrize("name", list(ROWS))
def test_mask_keyword_and_tokens_are_the_hosts(name, host):
    """A right-padded row run with the mask under the adapter's keyword equals the prompt run alone
    (for a bidirectional host only when the pads are masked); ``to_tokens`` is the host's."""
    row, model = host(name)
    adapter = detect_host(model).adapter
    ids = [adapter.to_tokens(model, p) for p in PROMPTS]
    for p, i in zip(PROMPTS, ids):
        own = model.to_tokens(p)
        own = own[0] if isinstance(own, tuple) else own
        assert i == own[0].tolist()
    n = max(len(i) for i in ids)
    short = min(range(len(ids)), key=lambda k: len(ids[k]))
    assert len(ids[short]) < n, "the prompts must differ in length"
    pad = 0
    tokens = torch.tensor([i + [pad] * (n - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (n - len(i)) for i in ids])
    last = f"blocks.{int(model.cfg.n_layers) - 1}.{adapter.resid_out_point}"
    batch = _run(model, adapter, tokens, [last], **{adapter.mask_keyword: mask})[last]
    alone = _run(model, adapter, torch.tensor([ids[short]]), [last])[last]
    k = len(ids[short])
    torch.testing.assert_close(batch[short, :k], alone[0], atol=TOL, rtol=TOL)
    if adapter.bidirectional:  # the keyword matters: without the mask the real tokens attend the pads
        unmasked = _run(model, adapter, tokens, [last])[last]
        assert not torch.allclose(unmasked[short, :k], alone[0], atol=TOL, rtol=TOL)


@pytest.mark.parametrize("name", list(ROWS))
def test_a_pass_from_a_layer_equals_the_full_pass_where_the_adapter_allows_one(name, host):
    """Where :meth:`start_support` says yes, ``run_with_hooks(x_1, start_at_layer=1)`` inside
    :meth:`only_later_blocks` gives the full pass's last residual; where it says no, it says why."""
    from thermo_lens.core.hosts import takes_start_at_layer

    row, model = host(name)
    view = ModelView(model)
    adapter = view.adapter
    why = adapter.start_support(model, view.host.describe())
    expected = takes_start_at_layer(model) if row.starts is None else row.starts
    if not expected:
        assert why, "the adapter must say why a pass cannot start at a layer"
        return
    assert why is None
    tokens = torch.tensor([adapter.to_tokens(model, PROMPTS[0])])
    mask = torch.ones_like(tokens)
    names = view.resid_hook_names
    first = _run(model, adapter, tokens, [names[1], names[-1]], attention_mask=mask)
    x1, full = first[names[1]], first[names[-1]]
    with adapter.only_later_blocks(model, 1):
        try:
            later = _run(model, adapter, x1, [names[-1]], attention_mask=mask, start_at_layer=1)
        except NotImplementedError:
            pytest.skip("this TransformerLens' bridge names start_at_layer but does not run it")
    torch.testing.assert_close(later[names[-1]], full, atol=TOL, rtol=TOL)
    assert len(adapter.blocks(model)) == int(model.cfg.n_layers)  # the layer list is whole again


# ---------------------------------------------------------------------------- detection rules
def _fake(*names: str, **attrs: Any) -> Any:
    """An object whose class chain is ``names`` (first = its own class), like a host's MRO."""
    base: type = torch.nn.Module
    for n in reversed(names):
        base = type(n, (base,), {"__module__": "transformer_lens.fake"})
    obj = base()
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj


@pytest.mark.parametrize("names, attrs, adapter", [
    (("SAETransformerBridge", "TransformerBridge"), {}, SAETransformerBridgeAdapter),
    (("TransformerBridge",), {}, BridgeAdapter),
    (("HookedSAETransformer", "HookedTransformer"), {}, HookedSAETransformerAdapter),
    (("HookedTransformer",), {}, HookedTransformerAdapter),
    (("HookedEncoder",), {}, HookedEncoderAdapter),
    (("MyWrapper",), {"adapter": object()}, BridgeAdapter),  # a bridge by its architecture adapter
    (("MyHooked",), {"_acts_to_saes": {}}, HookedSAETransformerAdapter),  # SAELens' SAE table
])
def test_adapters_are_tried_subclass_first(names, attrs, adapter):
    model = _fake(*names, **attrs)
    assert type(adapter_for(model)) is adapter
    assert type(detect_host(model, version="3.9.0").adapter) is adapter


def test_a_duck_typed_host_is_read_as_a_hooked_transformer():
    model = _fake("MyOwnHost")
    assert adapter_for(model) is None
    h = detect_host(model, version="3.9.0")
    assert h.adapter is FALLBACK and h.kind == "hooked_transformer"


# ---------------------------------------------------------------------------- no host branches outside
_BRANCH = re.compile(r"\.backend\s*[!=]=|\bkind\s*[!=]=\s*\"(bridge|hooked_\w+)\"|\"(bridge|hooked_\w+)\":"
                     r"|original_model|one_zero_attention_mask|hook_normalized_resid_post|hook_full_embed"
                     # a host's private attributes (SAELens' SAE tables and aliases, the bridge's gating and norms)
                     r"|_acts_to_saes|_transcoder_output_hooks|_resolve_hook_name|_gated_hook_reason|uses_rms_norm"
                     r"|uses_weight_offset|\"(Bridge|Hooked\w*)\" in type")


@pytest.mark.parametrize("module", ["thermo_lens.core.model", "thermo_lens.core.tokens", "thermo_lens.experiments.sweeps.start",
                                    "thermo_lens.experiments.sweeps.engine", "thermo_lens.experiments.sweeps.logits", "thermo_lens.core.passes",
                                    "thermo_lens.core.cache_match", "thermo_lens.measures.attribution.terms", "thermo_lens.core.layout",
                                    "thermo_lens.core.attached", "thermo_lens.measures.sae"])
def test_the_view_and_the_passes_ask_the_adapter(module):
    """The modules that read a model through its view hold no branch on the host class: the
    adapters (``thermo_lens/core/hosts/``) answer."""
    import importlib

    path = Path(importlib.import_module(module).__file__)
    files = sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]  # a package: all its modules
    for f in files:
        code = re.sub(r'"""[\s\S]*?"""', "", f.read_text(encoding="utf-8"))  # docstrings may name the hosts
        hits = [m.group(0) for m in _BRANCH.finditer(code)]
        assert not hits, f"{f.name} of {module} branches on the host: {hits}"
