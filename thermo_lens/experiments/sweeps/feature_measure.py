"""The SAE-latent sweep measure ``sae_feature:<hook>.<i>``: latent ``i`` of the SAE at ``<hook>``
(its ``hook_sae_acts_post``: after the activation function, JumpReLU's threshold and top-k
included), averaged over the run's token scope (:mod:`thermo_lens.experiments.sweeps.features` sweeps the
latents themselves)."""

from __future__ import annotations

import re
from collections.abc import Callable

from torch import Tensor

from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.model import ModelView
from thermo_lens.core.passes import Recorder
from thermo_lens.core.tokens import TokenBatch, scope_mask

__all__ = ["feature_readout", "parse_feature_measure", "feature_measure_layer", "FEATURE_MEASURE_DEFINITION"]

FEATURE_MEASURE_DEFINITION = ("latent <i> of the SAE at <hook> (its hook_sae_acts_post: after the activation "
                              "function, JumpReLU's threshold and top-k included), mean over the token_scope's tokens "
                              "(thermo_lens.experiments.sweeps.feature_measure)")

_ACTS = ".hook_sae_acts_post"
_SAE_HOOK = re.compile(r"^blocks\.(\d+)\.(.+)$")


def feature_readout(hook: str, feature: int, token_scope: str) -> Callable[[ModelView, Recorder], None]:
    """Reduction recording ``("sae_feature", 0)`` ``[batch]`` float64: latent ``feature`` at ``hook``
    (a ``hook_sae_acts_post``), mean over the scoped real tokens of each prompt."""
    def reduction(view: ModelView, rec: Recorder) -> None:
        def fn(x: Tensor, batch: TokenBatch) -> Tensor:
            B, T = x.shape[:2]
            mask = scope_mask(batch.lengths, T, token_scope, x.device)
            v = x[..., feature].double() * mask
            return v.sum(1) / mask.sum(1).clamp_min(1)
        rec.add(hook, ("sae_feature", 0), fn)
    reduction.__qualname__ = f"sae_feature_readout[{hook}.{feature}, {token_scope}]"
    return reduction


def parse_feature_measure(measure: str) -> tuple[str, int]:
    """``(acts hook, feature)`` of ``"sae_feature:<SAE hook>.<i>"``."""
    body = measure.split(":", 1)[1].strip()
    hook, dot, idx = body.rpartition(".")
    if not dot or not idx.lstrip("-").isdigit() or not _SAE_HOOK.match(hook):
        raise ThermoLensInputError(
            f"measure {measure!r}: write 'sae_feature:<SAE hook>.<feature>', e.g. 'sae_feature:blocks.1.hook_resid_post.7'")
    if hook.endswith(_ACTS):
        hook = hook[: -len(_ACTS)]
    return f"{hook}{_ACTS}", int(idx)


def feature_measure_layer(hook: str) -> int:
    """The last block that runs before the latents at ``hook`` (``<SAE hook>.hook_sae_acts_post``)
    are computed: a cell in a later block leaves them as they were."""
    m = _SAE_HOOK.match(hook)
    assert m is not None
    layer = int(m.group(1))
    return layer - 1 if m.group(2).startswith("hook_resid_pre") else layer
