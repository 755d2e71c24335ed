"""Where a study's models run: here, one after another (``"local"``), or one Ray task per model
(``"ray"``, each asking for its ``num_gpus``). Results are written only by the driver.

A Ray address is checked before anything is written: its spelling (``auto``, ``local``,
``HOST:PORT`` of a head node, ``ray://HOST:PORT`` for the Ray client), then whether anything
answers there as a gRPC server (Ray's head and client servers both are) within
:data:`RAY_CONNECT_TIMEOUT` seconds. Ray itself would wait for minutes on an address where nothing
listens; here it is a clear error at once ("connection refused", "no answer within 10 s").
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
import time
import traceback
from typing import Any, Callable, Protocol, no_type_check, runtime_checkable

from thermo_lens.core import validate as V
from thermo_lens.core.errors import ThermoLensInputError
from thermo_lens.core.safe_io import os_error_reason, printable
from thermo_lens.experiments.study.spec import ModelSpec

__all__ = ["EXECUTORS", "RAY_CONNECT_TIMEOUT", "StudyExecutorError", "check_executor", "probe_ray", "run_local",
           "run_ray", "describe"]

EXECUTORS = ("local", "ray")
#: Seconds to wait for a Ray cluster to answer before giving up with a clear error.
RAY_CONNECT_TIMEOUT = 10.0
_RAY_CLIENT_PORT = 10001
_ADDRESS = re.compile(r"(?:(?P<scheme>ray)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)"
                      r"(?::(?P<port>\d{1,5}))?")
# The HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with its SETTINGS.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04
_FIX = "start it (ray start --head) or check --ray-address"

Start = Callable[[list[ModelSpec]], None]  # marks models as running (one manifest write)
Record = Callable[[ModelSpec, "str | None", "str | None", float, "str | None"], None]
ProfileFn = Callable[[ModelSpec, dict[str, Any]], str]


@runtime_checkable
class ProgressBar(Protocol):
    """What the executors tell the progress bar (``tqdm``'s names)."""

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...

    def update(self, n: int = 1) -> object: ...


class StudyExecutorError(ThermoLensInputError):
    """A bad executor or Ray address, Ray missing, or a Ray cluster that cannot be reached."""


def describe(exc: BaseException) -> str:
    """``"Type: message"`` of an exception, cut to 2,000 characters (what the manifest records)."""
    msg = f"{type(exc).__name__}: {exc}".strip()
    return msg if len(msg) < 2000 else msg[:2000] + " ..."


# ---------------------------------------------------------------------------- checks
def check_executor(executor: object, ray_address: object) -> None:
    """The executor's name and the Ray address's spelling; Ray importable (no network yet)."""
    if executor not in EXECUTORS:
        raise StudyExecutorError(f"executor must be 'local' or 'ray', got {V.excerpt(executor)}")
    if executor == "local":
        if ray_address is not None:
            raise StudyExecutorError("a Ray address is for the Ray executor (--executor ray); "
                                     "the local executor runs every model here")
        return
    if ray_address is not None:
        parse_ray_address(ray_address)
    if importlib.util.find_spec("ray") is None:
        raise StudyExecutorError("the Ray executor needs Ray: pip install 'thermo-lens[ray]' (or pip install ray)")


def parse_ray_address(address: object) -> tuple[str | None, str, int | None]:
    """``(scheme, host, port)`` of a Ray address; ``(None, "auto"|"local", None)`` for the keywords."""
    if not isinstance(address, str):
        raise StudyExecutorError(f"the Ray address must be a string, got {type(address).__name__}")
    a = address.strip()
    if a in ("auto", "local"):
        return None, a, None
    m = _ADDRESS.fullmatch(a)
    port = int(m.group("port")) if m and m.group("port") else None
    if m is None or (port is None and not m.group("scheme")) or (port is not None and not 0 < port < 65536):
        raise StudyExecutorError(
            f"the Ray address {V.excerpt(address, 80)} is not one: give auto (the cluster this machine belongs to), "
            "local (start one here), HOST:PORT of a head node (e.g. 10.0.0.5:6379) or ray://HOST:PORT "
            "(the Ray client, port 10001)")
    return m.group("scheme"), m.group("host"), port if port is not None else _RAY_CLIENT_PORT


def probe_ray(address: str | None, timeout: float | None = None) -> None:
    """Raise :class:`StudyExecutorError` unless something answers as gRPC at the Ray address
    (``address``, else ``$RAY_ADDRESS``; ``auto`` is resolved as Ray resolves it). Nothing to do
    for a local Ray (no address, ``local``) or when Ray is already initialised in this process."""
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return
    given = address if address is not None else os.environ.get("RAY_ADDRESS") or None
    if given is None:
        return
    _, host, port = parse_ray_address(given)
    if host == "local":
        return
    if host == "auto":
        resolved = _resolve_auto()
        if resolved is None:
            return
        _, host, port = parse_ray_address(resolved)
    _probe_grpc(host.strip("[]"), port or _RAY_CLIENT_PORT, RAY_CONNECT_TIMEOUT if timeout is None else timeout,
                printable(given))


def _resolve_auto() -> str | None:
    """The address ``auto`` means (``$RAY_ADDRESS`` or the cluster started on this machine), as
    Ray resolves it; ``None`` if this Ray has no such helper (then ``ray.init`` decides)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except Exception:  # noqa: BLE001 - a private Ray helper: without it, ray.init decides
        return None
    try:
        found = canonicalize_bootstrap_address("auto")
    except Exception as e:  # noqa: BLE001 - Ray's own words say why
        found, why = None, f" ({printable(describe(e)[:200])})"
    else:
        why = ""
    if not found:
        raise StudyExecutorError(f"no Ray cluster runs on this machine for --ray-address auto{why}; "
                                 "start one (ray start --head), give its address, or leave --ray-address out "
                                 "to start a local Ray for this run")
    return found


def _probe_grpc(host: str, port: int, timeout: float, shown: str) -> None:
    where = f"cannot reach the Ray cluster at {shown}"
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            if os.environ.get("RAY_USE_TLS", "0").lower() not in ("", "0", "false"):
                return  # a TLS cluster answers only after a handshake: connecting is all we check
            s.settimeout(timeout)
            s.sendall(_H2_PREFACE)
            head = _recv(s, 9, time.monotonic() + timeout)
    except socket.gaierror:
        raise StudyExecutorError(f"{where}: unknown host {printable(host)}; check --ray-address") from None
    except (TimeoutError, socket.timeout):
        raise StudyExecutorError(f"{where}: no answer within {timeout:g} s; {_FIX}") from None
    except ConnectionRefusedError:
        raise StudyExecutorError(f"{where}: connection refused (nothing listens at port {port}); {_FIX}") from None
    except OSError as e:
        raise StudyExecutorError(f"{where}: {os_error_reason(e)}; {_FIX}") from None
    if len(head) < 9 or head[3] != _H2_SETTINGS:
        raise StudyExecutorError(
            f"{shown} answers, but not as a Ray cluster (no gRPC); give a head node's address (port 6379 "
            f"unless it was started with another --port) or ray://HOST:{_RAY_CLIENT_PORT} for the Ray client")


def _recv(s: socket.socket, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
        s.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = s.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


# ---------------------------------------------------------------------------- running
def run_local(todo: list[ModelSpec], settings: dict[str, Any], profile_fn: ProfileFn, start: Start,
              record: Record, bar: ProgressBar) -> None:
    """Profile each model here, one after another; failures are recorded, never raised."""
    for m in todo:
        bar.set_postfix_str(m.id)
        start([m])
        t0 = time.perf_counter()
        tb = None
        try:
            text, error = profile_fn(m, settings), None
        except (Exception, MemoryError) as e:  # noqa: BLE001 - recorded, the study goes on
            text, error, tb = None, describe(e), traceback.format_exc(limit=8)
        record(m, text, error, time.perf_counter() - t0, tb)
        bar.update(1)


def run_ray(todo: list[ModelSpec], settings: dict[str, Any], profile_fn: ProfileFn, start: Start,
            record: Record, bar: ProgressBar, ray_address: str | None) -> None:
    """One Ray task per model (``num_cpus=1``, the model's ``num_gpus``, no retries)."""
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
        except Exception as e:  # noqa: BLE001 - any failure to join is the user's cluster setup
            shown = printable(ray_address or os.environ.get("RAY_ADDRESS") or "a new local Ray")
            raise StudyExecutorError(f"cannot start or join Ray at {shown}: {printable(describe(e)[:400])}") from None

    # Ray pickles this closure by value; a runtime type-check wrapper (the test suite's jaxtyping
    # hook) holds weakrefs that cannot be pickled, so it opts out.
    @no_type_check
    def task(m: ModelSpec, s: dict) -> tuple[str | None, str | None, float]:
        t0 = time.perf_counter()
        try:
            return profile_fn(m, s), None, time.perf_counter() - t0
        except (Exception, MemoryError) as e:  # noqa: BLE001 - sent back and recorded
            return None, describe(e), time.perf_counter() - t0

    remote = ray.remote(task)
    pending = {}
    start(todo)
    for m in todo:
        opts = {"num_cpus": 1, "num_gpus": m.num_gpus or 0, "max_retries": 0}
        pending[remote.options(**opts).remote(m, settings)] = m
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            m = pending.pop(ready[0])
            try:
                text, error, seconds = ray.get(ready[0])
            except Exception as e:  # noqa: BLE001 - a crashed worker (e.g. OOM-killed)
                text, error, seconds = None, describe(e), 0.0
            record(m, text, error, seconds, None)
            bar.update(1)
    finally:
        if started_here:
            ray.shutdown()
