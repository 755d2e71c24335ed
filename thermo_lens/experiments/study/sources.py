"""Check a model name before anything is loaded: embedded names first, then folders, then the hub.

:func:`check_model_name` is what ``thermo-lens profile`` runs on every MODEL before a model is
booted, so a typo or an offline machine costs a second, not the hub client's retries:

1. an embedded model (:func:`thermo_lens.zoo.names`) or an existing local folder: fine;
2. a near miss of an embedded name (``gpt2-tiny-wdd``): "did you mean gpt2-tiny-wd?" and the list;
3. a name that can only be a path, or cannot be a hub id: said so (:func:`thermo_lens.core.validate.model_name`);
4. a hub id: fine when its ``config.json`` is in the local Hugging Face cache; otherwise an error
   when ``HF_HUB_OFFLINE`` is set, or when the hub's host does not accept a connection within
   :data:`HUB_PROBE_TIMEOUT` seconds (skipped behind an HTTP proxy, which the probe cannot see
   through). Each error says how to work offline.
"""

from __future__ import annotations

import difflib
import os
import socket
from urllib.parse import urlsplit

from thermo_lens.core import validate as V
from thermo_lens.core.errors import ThermoLensInputError

__all__ = ["check_model_name", "suggest_zoo_name", "HUB_PROBE_TIMEOUT"]

#: Seconds the hub's host has to accept a TCP connection before it counts as unreachable.
HUB_PROBE_TIMEOUT = 3.0
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy")


def _zoo_names() -> list[str]:
    from thermo_lens import zoo

    return zoo.names()


def suggest_zoo_name(name: str) -> str | None:
    """The embedded model ``name`` most likely misspells (one or two letters off), or None."""
    close = difflib.get_close_matches(name.lower(), _zoo_names(), n=1, cutoff=0.8)
    return close[0] if close else None


def _offline_hint() -> str:
    return (f"To work offline, profile an embedded model ({', '.join(_zoo_names())}; `thermo-lens zoo` lists them) "
            "or a local checkpoint folder, or download the model once on a connected machine and set "
            "HF_HUB_OFFLINE=1")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _cached(repo_id: str) -> bool:
    """Whether the hub model's ``config.json`` is in the local Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers always brings huggingface_hub
        return False
    try:
        hit = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - an odd id or cache layout: not cached
        return False
    return isinstance(hit, str)


def _endpoint() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.ENDPOINT)
    except Exception:  # noqa: BLE001  # pragma: no cover
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def hub_unreachable(endpoint: str | None = None, timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """Why the hub cannot be reached (``None`` when its host accepts a TCP connection)."""
    url = urlsplit(endpoint or _endpoint())
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return f"{host}:{port}: {e.strerror or type(e).__name__}" if not isinstance(e, TimeoutError) \
            else f"{host}:{port}: no answer within {timeout:g} s"


def check_model_name(name: str, what: str = "model") -> None:
    """Raise :class:`~thermo_lens.core.errors.ThermoLensInputError` when ``name`` cannot be loaded
    (see the module docstring for the order of the checks); return quietly otherwise."""
    names = _zoo_names()
    if name in names or os.path.exists(os.path.expanduser(name)):
        return
    # Only a bare name can be a misspelt embedded one ("org/gpt2-tiny-wd" is a hub id, "./x" a path).
    guess = None if "/" in name or "\\" in name or V.looks_like_path(name) else suggest_zoo_name(name)
    if guess is not None:
        raise ThermoLensInputError(
            f"{what} {V.excerpt(name)} is not an embedded model: did you mean {guess}? "
            f"Embedded models: {', '.join(names)}")
    try:
        V.model_name(name, what)
    except ThermoLensInputError as e:
        raise ThermoLensInputError(f"{e}. Embedded models: {', '.join(names)}") from None
    if _cached(name):
        return
    if _truthy(os.environ.get("HF_HUB_OFFLINE")) or _truthy(os.environ.get("TRANSFORMERS_OFFLINE")):
        raise ThermoLensInputError(
            f"{what} {V.excerpt(name)} is not an embedded model or a local folder, and as a hub id it is not in "
            "the local Hugging Face cache while HF_HUB_OFFLINE is set (nothing is downloaded). Unset "
            f"HF_HUB_OFFLINE to download it. {_offline_hint()}")
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return  # behind a proxy the direct probe says nothing; the hub client reports its own error
    why = hub_unreachable()
    if why is not None:
        raise ThermoLensInputError(
            f"{what} {V.excerpt(name)} is not an embedded model or a local folder, and the Hugging Face hub "
            f"cannot be reached to download it ({why}). {_offline_hint()}")
