"""What is attached to a host model besides its own weights: SAEs spliced in with SAELens.

SAELens' ``HookedSAETransformer.add_sae`` (and ``SAETransformerBridge``) replaces a hook point by
a wrapper module whose ``hook_sae_output`` carries the SAE's output downstream. thermo-lens reads
the residual stream the model actually carries, so a hook name that holds an SAE is read (and
hooked) at that output (:func:`resolve_hook`), and every result records the SAEs
(:func:`sae_records`, in the model metadata).

Functions take the host model object (not a :class:`thermo_lens.model.ModelView`): the view
calls them, so this module sits below it.
"""

from __future__ import annotations

from typing import Any

from thermo_lens.errors import ThermoLensInputError

__all__ = ["sae_wrappers", "sae_records", "check_saes", "resolve_hook", "needs_resolving"]


def sae_wrappers(model: Any) -> dict[str, Any]:
    """``{input hook: wrapper}`` of the SAEs attached with SAELens' ``add_sae``."""
    return dict(getattr(model, "_acts_to_saes", None) or {})


def sae_records(model: Any) -> list[dict[str, Any]]:
    """One record per attached SAE: ``hook`` (where it reads), ``hook_out`` (where its output
    replaces the activation; differs for transcoders), ``d_in``, ``d_sae`` (its width),
    ``use_error_term``, ``architecture``. Recorded in every result's model metadata."""
    out = []
    outputs = dict(getattr(model, "_transcoder_output_hooks", None) or {})
    for hook, wrapper in sae_wrappers(model).items():
        sae = getattr(wrapper, "sae", wrapper)
        cfg = getattr(sae, "cfg", None)
        arch = getattr(cfg, "architecture", None)
        out.append({
            "hook": hook,
            "hook_out": outputs.get(hook, hook),
            "d_in": int(getattr(cfg, "d_in", -1)),
            "d_sae": int(getattr(cfg, "d_sae", -1)),
            "use_error_term": bool(getattr(wrapper, "use_error_term", getattr(sae, "use_error_term", False))),
            "architecture": str(arch() if callable(arch) else arch),
        })
    return out


def _hook_width(hook: str, d_model: int) -> int | None:
    """Width of the activation at a standard hook point (None when not known)."""
    last = hook.rsplit(".", 1)[-1]
    if last.startswith("hook_resid") or last in ("hook_attn_out", "hook_mlp_out", "hook_embed", "hook_pos_embed"):
        return d_model
    return None  # per-head layouts (hook_z, hook_v ...): SAELens reshapes these itself


def check_saes(model: Any, name: str, d_model: int) -> None:
    """Raise :class:`ThermoLensInputError` for an attached SAE whose input width does not match
    its hook point (an SAE trained for another model: the forward pass would fail deep in torch).
    ``name`` is the model's name, for the message."""
    for rec in sae_records(model):
        width = _hook_width(rec["hook"], d_model)
        if width is not None and rec["d_in"] not in (-1, width):
            raise ThermoLensInputError(
                f"the SAE attached at {rec['hook']} reads d_in={rec['d_in']} features, but "
                f"{name}'s activation there has d_model={width}: it was trained for another "
                f"model. Detach it (model.reset_saes('{rec['hook']}')) and attach an SAE whose "
                f"cfg.d_in == {width}."
            )


def needs_resolving(model: Any) -> bool:
    """Whether hook names must be re-pointed (:func:`resolve_hook`) on this host: only hosts
    carrying SAEs, or SAETransformerBridge with its name aliases."""
    return bool(sae_wrappers(model)) or hasattr(model, "_resolve_hook_name")


def resolve_hook(model: Any, hook_name: Any, name: str = "the model") -> Any:
    """The hook point that carries activation ``hook_name`` downstream: the name itself, or,
    where an SAE is spliced in (SAELens replaces the hook point by its wrapper), the SAE's output
    hook ``<hook_name>.hook_sae_output``. Callables (hook-name filters) pass through. ``name`` is
    the model's name, for the message."""
    if not isinstance(hook_name, str):
        return hook_name
    hook_dict = getattr(model, "hook_dict", None)
    resolve_alias = getattr(model, "_resolve_hook_name", None)  # SAELens' SAETransformerBridge
    if isinstance(hook_dict, dict) and hook_name not in hook_dict and callable(resolve_alias):
        hook_name = resolve_alias(hook_name)
    out = f"{hook_name}.hook_sae_output"
    if isinstance(hook_dict, dict) and out in hook_dict:
        return out  # an SAE wrapper sits at `hook_name`
    mod_dict = getattr(model, "mod_dict", None)
    mod = mod_dict.get(hook_name) if isinstance(mod_dict, dict) else None
    if mod is None or hasattr(mod, "add_hook"):
        return hook_name
    assert isinstance(mod_dict, dict)  # mod is not None
    if out in mod_dict and hasattr(mod_dict[out], "add_hook"):
        return out
    raise ThermoLensInputError(
        f"{name}: the module at {hook_name} is a {type(mod).__name__}, not a hook point, and has "
        "no hook_sae_output; thermo-lens reads SAEs attached with SAELens' add_sae. Remove the "
        f"module (model.reset_saes('{hook_name}')) or attach the SAE with model.add_sae(sae)."
    )
