"""The whole battery in one pass: :func:`profile` -> :class:`ThermoProfile`.

:func:`profile` runs every measurement registered ``in_profile``
(:func:`thermo_lens.core.registry.measurements`: the gain, anisotropy, the spectral signature, sheaf
traces, L*, the per-head attribution, head write norms ...) through one forward pass per prompt
batch (:func:`thermo_lens.run`) and records the model's metadata (name, lab / family if given,
geometry, dtype, BOS mode, raw or processed weights). A measurement with no exact definition on the
model (e.g. the attribution of a post-LN model) is recorded in ``meta["skipped"]`` with the reason,
never dropped silently. The profile round-trips exactly through JSON, so a study can store one file
per model.

Definitions: ``thermo_lens.definitions`` §1-4; D'Elia (2026), *Thermodynamic Constraints in Transformer
Architectures*.
"""

from __future__ import annotations

import datetime as _dt
import functools
from dataclasses import dataclass
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Unpack

from thermo_lens._lazy import pandas as pd

from thermo_lens.core import registry, validate
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.inputs import PromptList, Prompts, as_model_prompts
from thermo_lens.core.measure import MeasureRequest, _requests, run_measurements
from thermo_lens.core.model import ModelView, as_view
from thermo_lens.core.result import Result
from thermo_lens.core.settings import RunOptions, RunSettings
from thermo_lens.core.tokens import TokenScope
from thermo_lens.core.validate import validates_own_inputs
from thermo_lens.core.passes.cached import documents_cache

if TYPE_CHECKING:
    from torch import Tensor
    from transformer_lens import ActivationCache

    from thermo_lens.core.hosts.protocol import TransformerLensModel

__all__ = ["ThermoProfile", "profile", "profiles_frame"]


@functools.lru_cache(maxsize=1)
def _versions_cached() -> tuple[tuple[str, str], ...]:
    return tuple(_versions_uncached().items())


def _versions() -> dict[str, str]:
    """Library versions (looked up once per process: package metadata reads cost ~10 ms)."""
    return dict(_versions_cached())


def _versions_uncached() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out: dict[str, str] = {"torch": str(torch.__version__)}
    for pkg in ("transformer-lens", "transformers", "thermo-lens"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:  # pragma: no cover - running from a source tree
            out[pkg] = "unknown"
    return out


# The measurements of schema-1 profiles, stored as fields of their own.
_V1_FIELDS = ("gain", "anisotropy", "spectral", "sheaf", "l_star", "attribution")


@dataclass(frozen=True, repr=False)
class ThermoProfile(Result):
    """Every thermo-lens measurement of one model on one prompt set.

    Attributes:
        meta: name, lab, family, twin_of, source, geometry (``n_layers``, ``n_heads``,
            ``n_kv_heads``, ``d_model``, ``d_head``, ``rho = n_heads / d_head``), norm placement,
            ``post_ln``, ``parallel_attn``, ``weights`` (raw / processed), ``dtype``,
            ``prepend_bos`` (the BOS mode used: ``"host"`` as it resolved) and
            ``prepend_bos_requested`` (the mode asked for), ``token_scope``, ``prompt_set``,
            ``n_prompts``, ``skipped`` (measurement -> why it has no result here), library
            versions, creation time.
        results: measurement name -> its result (:func:`thermo_lens.core.registry.measurements`), also
            readable as attributes: ``profile.gain`` (:class:`~thermo_lens.measures.gain.GainResult`),
            ``.anisotropy``, ``.spectral``, ``.sheaf``, ``.l_star``, ``.attribution`` (None where
            skipped, e.g. post-LN), ``.write_norm`` ...
    """

    meta: dict[str, Any]
    results: dict[str, Any]

    schema_version: ClassVar[int] = 2

    @classmethod
    def migrate(cls, fields: dict[str, Any], version: int) -> dict[str, Any]:
        fields = super().migrate(fields, version)
        if version < 2:  # one field per measurement -> the results mapping
            fields["results"] = {k: fields.pop(k) for k in _V1_FIELDS if fields.get(k) is not None}
            for k in _V1_FIELDS:
                fields.pop(k, None)
        return fields

    def _stored_problem(self) -> str | None:
        """Each stored result is the class its measurement makes, and the meta holds the numbers
        every table reads (see :meth:`Result._stored_problem`)."""
        from thermo_lens.core.result import Result

        wanted = {m.name: m.result for m in registry.measurements()}
        for name, res in self.results.items():
            want = wanted.get(name)
            if not isinstance(res, Result) or (want is not None and not isinstance(res, want)):
                got = type(res).__name__ if isinstance(res, Result) else f"a {type(res).__name__}"
                return f"its {str(name)[:60]!r} result is {got}, not {want.__name__ if want else 'a stored result'}"
        for key in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head"):
            v = self.meta.get(key)
            if key in self.meta and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                return f"meta[{key!r}] is {type(v).__name__} {str(v)[:40]!r}, not a size"
        return None

    def __getattr__(self, name: str) -> Any:
        # A measurement's result by its name; None for a registered measurement this profile lacks.
        if name.startswith("_") or name in ("meta", "results"):
            raise AttributeError(name)
        results = self.__dict__.get("results", {})
        if name in results:
            return results[name]
        if name in {m.name for m in registry.measurements()}:
            return None
        raise AttributeError(f"{type(self).__name__} has no attribute or measurement {name!r}")

    @property
    def name(self) -> str:
        return str(self.meta.get("name"))

    def to_row(self) -> dict[str, Any]:
        """One summary row (the per-model table :mod:`thermo_lens.laws` takes).

        ``gain`` is the summary named by ``gain_by`` (the one that decided the regime), with its
        95% CI; every registered metric with a ``row`` name adds its one number per model
        (:meth:`thermo_lens.core.registry.Metric.row_value`: e.g. the named gain summaries, the spectral
        means over layers and heads, ``mean_trace``, ``l_star``); ``l_star_rule`` names the rule of
        ``l_star`` and ``l_star_paper_rule`` is the paper's rule's L* on the same trace.
        """
        m, g = self.meta, self.results.get("gain")
        row: dict[str, Any] = {
            "model": m.get("name"), "lab": m.get("lab"), "family": m.get("family"),
            "twin_of": m.get("twin_of"), "source": m.get("source"),
            "n_layers": m["n_layers"], "n_heads": m["n_heads"], "n_kv_heads": m["n_kv_heads"],
            "d_model": m["d_model"], "d_head": m["d_head"], "rho": m["rho"],
        }
        if g is not None:
            head = g.summaries[g.regime_by]
            row.update({"gain": float(head.mean), "gain_sd": float(head.sd), "gain_se": float(head.se),
                        "gain_ci_low": float(head.ci_low), "gain_ci_high": float(head.ci_high),
                        "gain_by": g.regime_by, "regime": g.regime, "n_prompts": g.n_prompts})
        for metric in registry.metrics():
            if not metric.row:
                continue
            try:
                held = registry.carrier(self, metric.result) is not None
            except TypeError:
                held = False
            try:
                row[metric.row] = metric.row_value(self) if held else None
            except (KeyError, AttributeError, TypeError):  # e.g. a head metric this signature lacks
                row[metric.row] = None
        ls = self.results.get("l_star")
        if ls is not None:  # an L* always says which rule made it, with the paper's beside it
            row["l_star_rule"] = ls.variant
            row["l_star_paper_rule"] = float(ls.paper_rule_l_star)
        row.update({
            "post_ln": bool(m["post_ln"]), "parallel_attn": bool(m["parallel_attn"]),
            "weights": m["weights"], "dtype": m["dtype"], "prepend_bos": m["prepend_bos"],
            "token_scope": m["token_scope"], "prompt_set": m.get("prompt_set"),
        })
        return row

    def to_frame(self) -> pd.DataFrame:
        """The :meth:`to_row` summary as a one-row DataFrame."""
        return pd.DataFrame([self.to_row()])

    def __repr__(self) -> str:
        m = self.meta
        steps = m.get("weight_processing") or ()
        flags = [f"weights {m['weights']}" + (f" ({', '.join(steps)})" if steps else ""), m["dtype"],
                 f"BOS={m['prepend_bos']}"]
        if m["post_ln"]:
            flags.append("POST-LN: gain bounded by LayerNorm weights")
        lab = f" [{m['lab']}]" if m.get("lab") else ""
        lines = [
            f"ThermoProfile {m.get('name')}{lab}: L={m['n_layers']}, H={m['n_heads']}, "
            f"d_head={m['d_head']}, rho={m['rho']:.4g}; {m['n_prompts']} prompts ({m.get('prompt_set')}), "
            f"token scope {m['token_scope']}; " + ", ".join(flags)]
        g = self.results.get("gain")
        if g is not None:
            head = g.summaries[g.regime_by]
            lines += [f"  regime {g.regime} by {g.regime_by}: {head.mean:.4f} "
                      f"[{head.ci_low:.4f}, {head.ci_high:.4f}] 95% CI",
                      "  gains: " + ", ".join(f"{k} {v.mean:.4f}" for k, v in g.summaries.items())]
        sp = self.results.get("spectral")
        if sp is not None:
            lines.append(f"  spectral: mean ||W_V||_2 {float(sp.W_V_norm.mean()):.4g}, "
                         f"||W_O||_2 {float(sp.W_O_norm.mean()):.4g}, "
                         f"ratio {float(sp.ratio.mean()):.4g}, OV {float(sp.ov_norm.mean()):.4g}")
        sh, ls = self.results.get("sheaf"), self.results.get("l_star")
        if sh is not None:
            lines.append(f"  sheaf: mean layer trace {float(sh.mean_layer_trace.mean()):.5g}"
                         + (f"; L* {ls.empirical:.3g} empirical ({ls.variant}"
                            + ("" if ls.paper_rule else f"; the paper's rule gives {ls.paper_rule_l_star:.3g}")
                            + f") vs {ls.predicted:.3g} predicted" if ls is not None else ""))
        others = [k for k in self.results if k not in ("gain", "spectral", "sheaf", "l_star")]
        if others:
            lines.append(f"  also: {', '.join(others)}")
        for k, why in (m.get("skipped") or {}).items():
            lines.append(f"  skipped {k}: {why}")
        lines.append(f"  hooks: {m.get('hooks') or 'none (clean run)'}")
        return "\n".join(lines)


@documents_cache
@validates_own_inputs
def profile(
    model: TransformerLensModel | ModelView,
    prompts: Prompts = "paper25",
    *,
    token_scope: TokenScope = "all_but_first",
    regime_by: str = "last_block_gain",
    l_star_variant: str = "steepest_step",
    attribution: bool = True,
    measures: MeasureRequest | None = None,
    name: str | None = None,
    lab: str | None = None,
    family: str | None = None,
    twin_of: str | None = None,
    source: str | None = None,
    settings: RunSettings | None = None,
    cache: ActivationCache | Mapping[str, Tensor] | None = None,
    **run: Unpack[RunOptions],
) -> ThermoProfile:
    """Profile ``model``: every measurement of the battery from one forward pass per batch.

    The battery is the registered measurements marked ``in_profile``
    (:func:`thermo_lens.core.registry.measurements`): gain, anisotropy, spectral signature, sheaf
    traces, L*, the per-head gain attribution and head write norms. One forward pass per batch of
    prompts feeds every activation-based one. The pass ends after the last block (no final norm, no
    unembedding: nothing here reads the logits) unless a ``fwd_hooks`` entry targets a point past
    the blocks. Its cost, measured by ``benchmarks/profile.py``: below a bare
    ``run_with_hooks(return_type=None)`` of the same batches on ``TransformerBridge`` at GPT-2 /
    LLaMA vocabulary sizes (that bare pass computes the logits); against a bare pass that also ends
    at the last block, the reductions add 3-7%, and the attribution 5-10% more
    (``attribution=False`` skips it). The first profile of a model adds the spectral signature
    (cached per weights fingerprint afterwards).

    Args:
        model: a TransformerLens model (``TransformerBridge``, ``HookedTransformer``,
            ``HookedSAETransformer``) or a :class:`~thermo_lens.core.model.ModelView`.
        prompts: a prompt-set name (default ``"paper25"``; ``thermo_lens.core.prompts.names()``), a
            :class:`~thermo_lens.core.prompts.PromptSet`, a list of strings, a string,
            ``{category: [...]}`` or token ids (:data:`thermo_lens.core.inputs.Prompts`).
        token_scope: the token scope of every measurement that takes one (default
            ``"all_but_first"``; ``last``, ``all``, ``frobenius``); the per-token terms (attribution,
            write norms) use ``all`` for ``frobenius``.
        regime_by: the gain summary whose 95% CI decides the regime (default ``"last_block_gain"``).
        l_star_variant: empirical L* rule (default ``"steepest_step"``; the paper's ``"argmax_abs_gradient"``
            is reported beside it; :mod:`thermo_lens.measures.depth`).
        attribution: also compute :func:`thermo_lens.gain_attribution` in the same pass (default
            ``True``; skipped, with the reason in ``meta["skipped"]`` and a warning, for models
            whose blocks have no exact per-head split).
        measures: the measurements to run (default ``None``: the battery, every registered
            measurement marked ``in_profile``): names, or ``{name: {option: value}}`` as for
            :func:`thermo_lens.run` (a measurement's own options win over the profile's); any
            registered measurement, also one registered outside thermo-lens.
        name, lab, family, twin_of, source: metadata recorded in ``meta`` (name defaults to the
            model's ``cfg.model_name``).
        settings, **run: run options (:class:`thermo_lens.core.settings.RunOptions`): ``prepend_bos``
            (default ``"host"``), ``batch_size``, ``truncate``, ``fwd_hooks`` (e.g. an ablation;
            recorded in ``meta["hooks"]`` and every sub-result), ``progress``, ``sort_by_length``.
        cache: <CACHE_DOC>
    """
    for key, value in (("name", name), ("lab", lab), ("family", family), ("twin_of", twin_of), ("source", source)):
        validate.optional_text(key, value)
    validate.token_scope(token_scope)
    attribution = validate.boolean("attribution", attribution)
    view = as_view(model)
    run_settings = RunSettings.resolve(settings, **run)
    ps = as_model_prompts(view, prompts)
    explicit = None if measures is None else _requests(measures)
    if explicit is not None and not explicit:
        raise ThermoLensInputError("measures is empty; name at least one measurement, or leave measures=None for "
                                   "the whole battery")
    chosen = (registry.measurements(in_profile=True) if explicit is None
              else tuple(registry.measurement(n) for n in explicit))
    requests: dict[str, dict[str, Any]] = {}
    for m in chosen:
        if m.name == "attribution" and not attribution:
            continue
        # The profile's options go to every measurement that declares them; a token scope a
        # measurement's option type does not hold (frobenius, for the per-token terms) is "all".
        given = {k: v for k, v in (("token_scope", token_scope), ("regime_by", regime_by),
                                   ("variant", l_star_variant)) if m.takes(k)}
        scopes = m.option_values("token_scope")
        if "token_scope" in given and scopes is not None and token_scope not in scopes:
            given["token_scope"] = "all"  # frobenius has no per-token form
        requests[m.name] = {**given, **(explicit or {}).get(m.name, {})}
    # The device is looked up once for the whole profile (the pass, the spectral signature, the metadata
    # of every result): for a dispatched model each lookup walks every module.
    with view.pinned_device():
        return _profile(view, ps, prompts, requests, run_settings, cache, attribution, token_scope,
                        dict(name=name, lab=lab, family=family, twin_of=twin_of, source=source))


def _profile(view: ModelView, ps: PromptList, prompts: Prompts, requests: dict[str, dict[str, Any]],
             run_settings: RunSettings, cache: object, attribution: bool, token_scope: str,
             names: dict[str, str | None]) -> ThermoProfile:
    """The body of :func:`profile` (``names``: its name, lab, family, twin_of and source)."""
    out, collected = run_measurements(view, prompts if cache is not None else ps, requests, run_settings,
                                      skip_inapplicable=True, cache=cache)
    if collected is None:  # pragma: no cover - the battery always holds activation measurements
        raise ThermoLensInputError("profile: no measurement of the battery ran a forward pass")
    skipped = dict(out.skipped)
    if not attribution:
        skipped["attribution"] = "not requested (attribution=False)"
    meta = dict(view.metadata())
    meta.update(
        name=names["name"] or view.name, lab=names["lab"], family=names["family"], twin_of=names["twin_of"],
        source=names["source"] or view.name,
        prepend_bos=collected.prepend_bos, prepend_bos_requested=run_settings.prepend_bos,
        token_scope=token_scope, prompt_set=ps.name,
        n_prompts=len(ps), categories=list(ps.categories), hooks=collected.provenance().hooks_text,
        batch_size=run_settings.batch_size, skipped=skipped,
        attribution_skipped=skipped.get("attribution"), versions=_versions(),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    return ThermoProfile(meta=meta, results=dict(out.results))


def profiles_frame(profiles: Iterable[ThermoProfile]) -> pd.DataFrame:
    """One row per profile (:meth:`ThermoProfile.to_row`): the table :mod:`thermo_lens.laws` takes."""
    rows = [p.to_row() for p in profiles]
    if not rows:
        raise ValueError("no profiles given")
    return pd.DataFrame(rows)
