"""What is attached to a host model besides its own weights: SAEs spliced in with SAELens, hooks
already registered on its hook points, and what its hook names are.

SAELens' ``HookedSAETransformer.add_sae`` (and ``SAETransformerBridge``) replaces a hook point by
a wrapper module whose ``hook_sae_output`` carries the SAE's output downstream. thermo-lens reads
the residual stream the model actually carries, so a hook name that holds an SAE is read (and
hooked) at that output (:func:`resolve_hook`), and every result records the SAEs
(:func:`sae_records`, in the model metadata).

A notebook often leaves hooks on the model (``model.add_hook``, an enclosing
``with model.hooks(...)``, permanent hooks, a PyTorch ``register_forward_hook``): they run in every
pass, so :func:`attached_hooks` finds them (and the SAEs) before each pass and every result
records them beside its ``fwd_hooks``. :func:`check_hook_names` refuses a hook name the model has
no hook point for (some hosts skip it without a word), naming the closest valid ones.

Functions take the host model object (not a :class:`thermo_lens.core.model.ModelView`): the view
calls them, so this module sits below it.
"""

from __future__ import annotations

import difflib
import functools
import re
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol, Sequence, TypeAlias, overload, runtime_checkable

from thermo_lens.core.errors import ThermoLensInputError, ThermoLensInputTypeError

if TYPE_CHECKING:
    import torch

    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["sae_wrappers", "sae_records", "check_saes", "resolve_hook", "needs_resolving", "hook_points",
           "AttachedHook", "attached_hooks", "check_hook_names", "forward_order", "qualname", "hook_source",
           "HostProbes", "answer_with"]

#: A hook name, or a name filter ``name -> bool``.
NameOrFilter = str | Callable[[str], bool]
#: A hook function as TransformerLens and PyTorch call it (``fn(activation, hook)`` / ``fn(module, ...)``).
HookFunction = Callable[..., object]
#: One record per attached SAE (:func:`sae_records`).
SAERecord: TypeAlias = dict[str, Any]


@runtime_checkable
class HostProbes(Protocol):
    """What this module asks the host about what is attached to it; its adapter
    (:class:`thermo_lens.core.hosts.HostAdapter`) answers, so no host's private attributes are read here."""

    def sae_wrappers(self, model: TransformerLensModel) -> dict[str, Any]:
        """``{input hook: wrapper}`` of the SAEs spliced into the model (``{}`` on a host without SAEs):
        SAELens' wrapper modules (``.sae``, ``.use_error_term``; SAELens is optional, so not named)."""
        ...

    def sae_output_hooks(self, model: TransformerLensModel) -> dict[str, str]:
        """``{input hook: output hook}`` of the spliced-in SAEs that write elsewhere (transcoders)."""
        ...

    def needs_resolving(self, model: TransformerLensModel) -> bool:
        """Whether hook names must be re-pointed (:func:`resolve_hook`) before a pass."""
        ...

    def resolve_alias(self, model: TransformerLensModel, hook_name: str) -> str:
        """The host's own name for a hook name it does not list (an alias), else ``hook_name``."""
        ...

    def gated_flag(self, model: TransformerLensModel, hook_name: str, point: object) -> str | None:
        """The config flag that must be on for hook point ``point`` to fire, when it is off; else None."""
        ...


# The adapter of a model: registered by thermo_lens.core.hosts when it is imported (the adapters use
# this module's functions, so it cannot import them: the answers plug in from above, as figures do
# into results).
_ADAPTER_OF: list[Callable[[TransformerLensModel], HostProbes]] = []


def answer_with(adapter_of: Callable[[TransformerLensModel], HostProbes]) -> None:
    """Register the function that gives a model's adapter (called once, by :mod:`thermo_lens.core.hosts`)."""
    _ADAPTER_OF[:] = [adapter_of]


def _host(model: TransformerLensModel) -> HostProbes:
    # `import thermo_lens` (run before any of its modules) imports thermo_lens.core.hosts, which registers
    if not _ADAPTER_OF:  # pragma: no cover - only while thermo_lens itself is being imported
        raise RuntimeError("thermo_lens.core.hosts has not registered its adapters yet (import thermo_lens first)")
    return _ADAPTER_OF[0](model)


def sae_wrappers(model: TransformerLensModel) -> dict[str, Any]:
    """``{input hook: wrapper}`` of the SAEs attached with SAELens' ``add_sae`` (its adapter says
    where the host keeps them)."""
    return dict(_host(model).sae_wrappers(model))


def sae_records(model: TransformerLensModel) -> list[SAERecord]:
    """One record per attached SAE: ``hook`` (where it reads), ``hook_out`` (where its output
    replaces the activation; differs for transcoders), ``d_in``, ``d_sae`` (its width),
    ``use_error_term``, ``architecture``. Recorded in every result's model metadata."""
    out: list[SAERecord] = []
    host = _host(model)
    outputs = host.sae_output_hooks(model)
    for hook, wrapper in host.sae_wrappers(model).items():
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


def check_saes(model: TransformerLensModel, name: str, d_model: int) -> None:
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


def needs_resolving(model: TransformerLensModel) -> bool:
    """Whether hook names must be re-pointed (:func:`resolve_hook`) on this host: only hosts
    carrying SAEs, or SAETransformerBridge with its name aliases (its adapter says)."""
    return _host(model).needs_resolving(model)


@overload
def resolve_hook(model: TransformerLensModel, hook_name: str, name: str = ...) -> str: ...
@overload
def resolve_hook(model: TransformerLensModel, hook_name: Callable[[str], bool], name: str = ...) -> Callable[[str], bool]: ...
def resolve_hook(model: TransformerLensModel, hook_name: NameOrFilter, name: str = "the model") -> NameOrFilter:
    """The hook point that carries activation ``hook_name`` downstream: the name itself, or,
    where an SAE is spliced in (SAELens replaces the hook point by its wrapper), the SAE's output
    hook ``<hook_name>.hook_sae_output``. Callables (hook-name filters) pass through. ``name`` is
    the model's name, for the message."""
    if not isinstance(hook_name, str):
        return hook_name
    hook_dict = getattr(model, "hook_dict", None)
    if isinstance(hook_dict, dict) and hook_name not in hook_dict:
        hook_name = _host(model).resolve_alias(model, hook_name)  # a name the host knows by another (SAELens)
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


# ---------------------------------------------------------------------------- hook functions
def qualname(fn: object) -> str:
    """``module.qualname`` of a hook function (through ``functools.partial`` and bound methods)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, type) and hasattr(fn, "__func__"):
        return f"{type(owner).__module__}.{type(owner).__qualname__}.{getattr(fn, '__name__', '?')}"
    mod = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{mod}.{name}"


def hook_source(fn: object) -> str:
    """Where a hook's inserted activations come from: ``fn.thermo_lens_source``, or an SAE-like owner's
    config (release, id, hook, width); ``""`` when the function does not say."""
    src = getattr(fn, "thermo_lens_source", None)
    if src:
        return str(src)
    while isinstance(fn, functools.partial):
        fn = fn.func
        src = getattr(fn, "thermo_lens_source", None)
        if src:
            return str(src)
    owner = getattr(fn, "__self__", None) if hasattr(fn, "__func__") else fn
    cfg = getattr(owner, "cfg", None)
    if cfg is not None:  # an SAE (SAELens) or similar module used as / through a hook
        bits = [f"{k}={getattr(cfg, k)}" for k in ("release", "sae_id", "hook_name", "d_sae")
                if getattr(cfg, k, None) is not None]
        meta = getattr(cfg, "metadata", None)
        for k in ("release", "sae_id", "hook_name"):
            if meta is not None and getattr(meta, k, None) is not None and not any(b.startswith(k) for b in bits):
                bits.append(f"{k}={getattr(meta, k)}")
        if bits:
            return f"{type(owner).__name__}(" + ", ".join(bits) + ")"
    return ""



class AttachedHook(NamedTuple):
    """A hook already on a model (:func:`attached_hooks`): where it runs, its function's qualified
    name, where its activations come from, and how it was attached (a key of
    :data:`thermo_lens.core.provenance.ATTACHED`)."""

    hook_point: str
    function: str
    source: str
    attached: str


def _describe(point: str, fn: object, how: str) -> AttachedHook:
    return AttachedHook(point, qualname(fn), hook_source(fn), how)


# ---------------------------------------------------------------------------- hook points and names
#: Functions defined here are the host's own wiring, not the user's (TransformerLens 4's bridge
#: keeps permanent hooks that alias symbolic hook points, e.g. ``hook_mlp_in`` on OPT and BERT;
#: transformers installs output-capturing module hooks on the HF model inside a bridge).
_HOST_MODULES = ("transformer_lens.model_bridge", "sae_lens", "transformers.", "accelerate.")

_SAE_SUFFIX = re.compile(r"\.hook_sae_[a-z_]+$")
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


def hook_points(model: TransformerLensModel) -> dict[str, torch.nn.Module]:
    """``{name: HookPoint}`` of every hook point of ``model`` (``model.hook_dict``), one name per
    hook point: on ``TransformerBridge``, which lists each point under its canonical name and its
    TransformerLens aliases, the alias a user writes (``blocks.0.attn.hook_z``, not
    ``blocks.0.attn.o.hook_in``)."""
    hook_dict = getattr(model, "hook_dict", None)
    if not isinstance(hook_dict, dict):
        return {}
    names: dict[int, list[str]] = {}
    points: dict[int, torch.nn.Module] = {}
    for name, hp in hook_dict.items():
        points[id(hp)] = hp
        names.setdefault(id(hp), []).append(name)
    chosen = {}
    for key, ns in names.items():
        own = getattr(points[key], "name", None)
        aliases = [n for n in ns if n != own] or ns
        chosen[key] = min(aliases, key=lambda n: (len(n), n))
    return {name: points[key] for key, name in chosen.items()}


def _user_function(hp: torch.nn.Module, handle: object) -> object:
    """The function the user attached with a :class:`LensHandle` (TransformerLens 3+ keeps it as
    ``handle.user_hook``; 2.x only keeps torch's handle, whose hook is TransformerLens' wrapper with
    the user's function as its free variable ``hook``)."""
    fn = getattr(handle, "user_hook", None)
    if fn is not None:
        return fn
    torch_handle = getattr(handle, "hook", None)
    ref = getattr(torch_handle, "hooks_dict_ref", None)
    hooks = ref() if callable(ref) else None
    wrapper = hooks.get(getattr(torch_handle, "id", None)) if isinstance(hooks, dict) else None
    code, cells = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None)
    if code is not None and cells:
        free = dict(zip(code.co_freevars, cells))
        if "hook" in free:
            try:
                return free["hook"].cell_contents
            except ValueError:  # an empty cell
                pass
    return wrapper


def _is_host_wiring(fn: object) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__module__", "") or "").startswith(_HOST_MODULES)


def attached_hooks(model: TransformerLensModel) -> tuple[AttachedHook, ...]:
    """Every forward hook already attached to ``model``'s hook points, and every SAE spliced in:
    what a pass will run besides the hooks passed to it as ``fwd_hooks``.

    * ``model.add_hook(name, fn)`` -> ``attached="add_hook"``; ``add_perma_hook`` / ``is_permanent``
      -> ``"permanent"``; inside ``with model.hooks(...)`` -> ``"model.hooks"``;
    * a PyTorch forward (pre-)hook registered on a module of the model (not a hook point) ->
      ``"torch"`` (the point is ``module <path>``);
    * an SAE attached with SAELens' ``add_sae`` -> ``"sae"`` (the function names the SAE's class,
      its width and whether its error term is added back).

    The host's own wiring (TransformerLens' bridge aliases, SAELens internals) is not a user hook
    and is left out. Backward hooks never change a forward pass and are left out.
    """
    out: list[AttachedHook] = []
    for name, hp in hook_points(model).items():
        for handle in list(getattr(hp, "fwd_hooks", None) or []):
            fn = _user_function(hp, handle)
            if _is_host_wiring(fn):
                continue
            if getattr(handle, "context_level", None) is not None:
                how = "model.hooks"
            elif getattr(handle, "is_permanent", False):
                how = "permanent"
            else:
                how = "add_hook"
            out.append(_describe(name, fn, how))
    named = getattr(model, "named_modules", None)
    if callable(named):
        for path, mod in named():
            if hasattr(mod, "fwd_hooks") and hasattr(mod, "add_hook"):
                continue  # a hook point: its hooks are the LensHandles above (or the host's wiring)
            for kind, hooks in (("forward hook", getattr(mod, "_forward_hooks", None)),
                                ("forward pre-hook", getattr(mod, "_forward_pre_hooks", None))):
                for fn in list((hooks or {}).values()):
                    if _is_host_wiring(fn):
                        continue
                    out.append(_describe(f"module {path or '<model>'} ({kind})", fn, "torch"))
    for r in sae_records(model):
        where = r["hook"] if r["hook_out"] == r["hook"] else f"{r['hook']} -> {r['hook_out']}"
        err = ", error term added back" if r["use_error_term"] else ""
        out.append(AttachedHook(where, f"SAE {r['architecture']} d_in={r['d_in']} d_sae={r['d_sae']}{err}",
                                r.get("source", ""), "sae"))
    return tuple(out)


def _n_layers(model: TransformerLensModel) -> int | None:
    n = getattr(getattr(model, "cfg", None), "n_layers", None)
    return int(n) if isinstance(n, int) else None


def check_hook_names(model: TransformerLensModel, names: Sequence[object], name: str = "the model") -> None:
    """Raise :class:`ThermoLensInputError` for a hook name ``model`` has no hook point for
    (misspelt, another host's spelling, a block out of range), naming it and the closest valid
    names, before anything runs: some hosts skip an unknown name without a word (the hook would
    never run while the result records it). A name filter (a callable) must match at least one
    hook point. ``name`` is the model's name, for the message."""
    if not names:
        return
    hook_dict = getattr(model, "hook_dict", None)
    if not isinstance(hook_dict, dict):
        return  # a duck-typed host without hook_dict: nothing to check against
    valid = list(hook_dict)
    for i, hook_name in enumerate(names):
        if callable(hook_name) and not isinstance(hook_name, str):
            try:
                hit = any(bool(hook_name(n)) for n in valid)
            except Exception as e:  # noqa: BLE001 - the user's filter; named in the message
                raise ThermoLensInputError(
                    f"the name filter {qualname(hook_name)} raised "
                    f"{type(e).__name__}: {e} when called with a hook name (a str)") from e
            if not hit:
                raise ThermoLensInputError(
                    f"the name filter {qualname(hook_name)} matches none of "
                    f"{name}'s {len(valid)} hook points, so its hook would never run; e.g. "
                    f"{', '.join(repr(v) for v in valid[:3])} (model.hook_dict lists them all)")
            continue
        if not isinstance(hook_name, str):
            raise ThermoLensInputTypeError(
                f"hook name {i} is a {type(hook_name).__name__} ({hook_name!r}), not a hook name such as "
                "'blocks.0.hook_resid_post' (a str) or a name filter (a function name -> bool)")
        point = hook_dict.get(hook_name)
        if point is None and needs_resolving(model):
            point = hook_dict.get(resolve_hook(model, hook_name, name))  # an SAE's output, or an SAELens alias
        if point is None:
            raise ThermoLensInputError(_unknown_hook_message(model, hook_name, list(hook_points(model)) or valid, name))
        flag = _gated(model, hook_name, point)
        if flag:
            raise ThermoLensInputError(
                f"{name}'s hook point {hook_name!r} fires only when model.cfg.{flag} is True (it is False), so a "
                f"hook there would never run: call model.set_{flag}(True) first"
                + (" (or set model.cfg.use_hook_tokens = True)" if flag == "use_hook_tokens" else ""))


def _gated(model: TransformerLensModel, hook_name: str, point: object) -> str | None:
    """The config flag that must be on for the hook point to fire, when it is off; else None (the
    host's adapter knows which of its hook points are gated)."""
    return _host(model).gated_flag(model, hook_name, point)


def _unknown_hook_message(model: TransformerLensModel, hook_name: str, valid: list[str], name: str) -> str:
    L = _n_layers(model)
    m = _BLOCK.match(hook_name)
    why = ""
    if m and L is not None and int(m.group(1)) >= L:
        why = f" (block {m.group(1)} is out of range: {name} has blocks 0..{L - 1})"
        # suggest the same point in the last block
        hook_name_in_range = f"blocks.{L - 1}.{m.group(2)}"
        near = difflib.get_close_matches(hook_name_in_range, valid, n=3, cutoff=0.6)
    else:
        near = difflib.get_close_matches(hook_name, valid, n=3, cutoff=0.6)
        lowered = {v.lower(): v for v in valid}
        if hook_name.lower() in lowered and lowered[hook_name.lower()] not in near:
            near.insert(0, lowered[hook_name.lower()])
    hint = f"; closest: {', '.join(repr(n) for n in near)}" if near else ""
    return (f"{name} has no hook point {hook_name!r}{why}{hint}. A hook there would never run; "
            "model.hook_dict lists every hook point (name filters, functions name -> bool, are "
            "accepted too)")


#: Order of a block's hook points in its forward pass (sequential pre-LN layout; the ranks that
#: matter are the residual points: hook_resid_pre first, hook_resid_post last).
_BLOCK_ORDER = (
    ("hook_resid_pre", 0), ("ln1.", 1), ("hook_attn_in", 1), ("hook_q_input", 1), ("hook_k_input", 1),
    ("hook_v_input", 1), ("attn.", 2), ("hook_attn_out", 3), ("hook_resid_mid", 4), ("ln2.", 5),
    ("hook_mlp_in", 5), ("mlp.", 6), ("hook_mlp_out", 7), ("hook_resid_post", 9),
)


def forward_order(hook_name: str) -> tuple[float, ...]:
    """A sort key putting hook names in the order a forward pass reaches them: embeddings, then
    block by block (``hook_resid_pre``, attention, MLP, ``hook_resid_post``), then the final norm;
    an SAE's hook points (``<point>.hook_sae_*``) right after the point they replace."""
    base = _SAE_SUFFIX.sub("", hook_name)
    sae = 0.5 if base != hook_name else 0.0
    m = _BLOCK.match(base)
    if m is None:
        first = base.startswith(("hook_embed", "hook_pos_embed", "hook_tokens", "embed", "pos_embed"))
        return (-1.0 if first else float("inf"), 0.0, sae)
    rest = m.group(2)
    rank = next((r for prefix, r in _BLOCK_ORDER if rest.startswith(prefix)), 8)
    return (float(m.group(1)), float(rank), sae)
