"""SAE features in sweeps: ablating or patching single latents, and latents as measures.

An SAE attached with SAELens' ``add_sae`` fires ``<hook>.hook_sae_acts_post`` with its latents
``[batch, pos, d_sae]`` before decoding them. A feature sweep
(``ablation_sweep(model, prompts, "<hook>.hook_sae_acts_post", over="feature", features=[...])``,
``patch_sweep(..., over="feature")``) edits one latent per cell there, as a head sweep edits one head
at ``attn.hook_z``: zero, the reference prompts' mean, another prompt's value (resample) or the clean
prompt's value (patch). With ``use_error_term`` the SAE's output is then its edited reconstruction plus
the unedited error, SAELens' convention. Passes run from the embedding (the stream a start-at-layer
pass would take is read downstream of the SAE).

The measure ``sae_feature:<hook>.<i>`` (:mod:`thermo_lens.experiments.sweeps.feature_measure`) is latent ``i`` of
the SAE at ``<hook>``, averaged over the run's token scope: usable by every sweep.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Iterable
from typing import Any

from torch import Tensor

from thermo_lens.core import attached
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.model import ModelView
from thermo_lens.experiments.sweeps.engine import HookLayout

__all__ = ["FeatureLayout", "feature_layout", "feature_list"]

_ACTS = ".hook_sae_acts_post"
_SAE_HOOK = re.compile(r"^blocks\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class FeatureLayout(HookLayout):
    """The latents of one SAE as a sweep's hook layout: ``[batch, pos, d_sae]``, the feature axis in
    the place of a head axis (``head_dim``), one "layer" (the block index in the SAE's hook name;
    ``suffix``: the rest, ``"hook_resid_post.hook_sae_acts_post"``)."""

    head_dim: int | None = 2
    pos_dim: int = 1
    features: bool = True


def _sae_wrapper(view: ModelView, sae_hook: str) -> Any:  # SAELens' wrapper of an attached SAE
    wrappers = attached.sae_wrappers(view.model)
    if sae_hook in wrappers:
        return wrappers[sae_hook]
    for r in attached.sae_records(view.model):  # a transcoder's latents fire where it writes
        if r["hook_out"] == sae_hook:
            return wrappers[r["hook"]]
    have = ", ".join(repr(f"{k}{_ACTS}") for k in wrappers) or "none: attach one with model.add_sae(sae)"
    raise ThermoLensInputError(f"no SAE is attached at {sae_hook!r} of {view.name}; its SAEs' latents: {have}")


def feature_layout(view: ModelView, hook: object) -> tuple[FeatureLayout, int, int]:
    """``(layout, layer, d_sae)`` of ``"<sae hook>.hook_sae_acts_post"`` (``layer``: the block in the hook's name)."""
    if not isinstance(hook, str) or not hook.endswith(_ACTS) or not _SAE_HOOK.match(hook):
        raise ThermoLensInputError(
            f"over='feature' sweeps an SAE's latents: hook must be '<SAE hook>{_ACTS}' (e.g. "
            f"'blocks.1.hook_resid_post{_ACTS}'), got {hook!r}")
    sae_hook = hook[: -len(_ACTS)]
    wrapper = _sae_wrapper(view, sae_hook)
    m = _SAE_HOOK.match(hook)
    assert m is not None
    d_sae = int(getattr(wrapper, "sae", wrapper).cfg.d_sae)
    return FeatureLayout(suffix=m.group(2)), int(m.group(1)), d_sae


def feature_list(features: object, d_sae: int) -> list[int]:
    """The swept features (indices ``0..d_sae-1``; required: a sweep over every latent of a wide SAE
    would run ``d_sae`` conditions)."""
    if features is None:
        raise ThermoLensInputError(
            f"over='feature' needs features=[...]: the latent indices to sweep (this SAE has d_sae={d_sae}); e.g. "
            "the top features of gain_attribution(model, prompts, sae_features=True).top_features()")
    vals = [features] if isinstance(features, int) or not isinstance(features, Iterable) else list(features)
    if not vals:
        raise ThermoLensInputError("features= is empty; pass the latent indices to sweep")
    out = []
    for f in vals:
        if isinstance(f, bool) or not (isinstance(f, int) or isinstance(f, Tensor) and f.numel() == 1):
            raise ThermoLensInputError(f"features must be ints (latent indices), got {f!r}")
        if not 0 <= int(f) < d_sae:
            raise ThermoLensInputError(f"feature {int(f)} out of range 0..{d_sae - 1} (d_sae={d_sae})")
        out.append(int(f))
    return out
