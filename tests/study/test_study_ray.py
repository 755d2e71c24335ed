"""The Ray executor's address: checked before anything is written, and an unreachable cluster is a
clear error within seconds instead of a hang (issue 27: ``--ray-address 127.0.0.1:1`` hung)."""

import contextlib
import signal
import socket
import threading
import time

import pytest
from study_helpers import fake_profile, run_cli, write_spec

from thermo_lens.experiments import study
from thermo_lens.experiments.study import ModelSpec, StudyExecutorError, StudySpec, executors, run_study


@pytest.fixture
def calls(monkeypatch):
    out: list = []
    monkeypatch.setattr(study.run, "profile_one", fake_profile(out))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return out


@contextlib.contextmanager
def _deadline(seconds):
    """Fail instead of hanging (the old code waited on an unreachable cluster for minutes)."""
    def hung(*_):
        raise TimeoutError(f"still waiting after {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def _server(reply: bytes | None):
    """A TCP server on localhost that accepts and then sends ``reply`` (or stays silent)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conns.append(conn)
            if reply:
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()
        for c in conns:
            c.close()


def _study(tmp_path, capsys, *options):
    spec = write_spec(tmp_path / "spec.toml", [{"zoo": "gpt2-tiny-wd", "id": "a"}])
    t0 = time.monotonic()
    with _deadline(60):
        rc, _, err = run_cli(["study", spec, "--out", tmp_path / "out", *options], capsys)
    return rc, err, time.monotonic() - t0


def test_nothing_listening_is_a_clear_error_at_once(tmp_path, capsys, calls):
    rc, err, seconds = _study(tmp_path, capsys, "--executor", "ray", "--ray-address", "127.0.0.1:1")
    assert rc == 2 and "cannot reach the Ray cluster at 127.0.0.1:1" in err and "connection refused" in err, err
    assert "ray start --head" in err and seconds < 10
    assert not (tmp_path / "out").exists() and not calls  # refused before anything was written


@pytest.mark.parametrize("address", ["not an address", "127.0.0.1:99999", "127.0.0.1", "http://x:1", "", "ray://"])
def test_a_malformed_address_is_named(tmp_path, capsys, calls, address):
    rc, err, _ = _study(tmp_path, capsys, "--executor", "ray", "--ray-address", address)
    assert rc == 2 and "is not one: give auto" in err and "HOST:PORT" in err, err
    assert not (tmp_path / "out").exists() and not calls


@pytest.mark.slow
def test_a_silent_server_times_out_with_a_clear_message(tmp_path, capsys, calls, monkeypatch):
    monkeypatch.setattr(executors, "RAY_CONNECT_TIMEOUT", 0.5)
    with _server(None) as port:
        rc, err, seconds = _study(tmp_path, capsys, "--executor", "ray", "--ray-address", f"127.0.0.1:{port}")
    assert rc == 2 and "no answer within 0.5 s" in err and seconds < 10, err
    assert not (tmp_path / "out").exists()


def test_a_server_that_is_not_ray_is_named(tmp_path, capsys, calls):
    with _server(b"SSH-2.0-OpenSSH_9.6\r\n") as port:
        rc, err, _ = _study(tmp_path, capsys, "--executor", "ray", "--ray-address", f"ray://127.0.0.1:{port}")
    assert rc == 2 and "answers, but not as a Ray cluster" in err, err


def test_a_ray_address_with_the_local_executor_is_an_error(tmp_path, capsys, calls):
    rc, err, _ = _study(tmp_path, capsys, "--ray-address", "127.0.0.1:6379")
    assert rc == 2 and "is for the Ray executor" in err and not calls


def test_the_api_checks_the_same(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = StudySpec(name="s", models=(ModelSpec(id="a", zoo="gpt2-tiny-wd"),))
    with _deadline(60), pytest.raises(StudyExecutorError, match="connection refused"):
        run_study(spec, tmp_path / "out", executor="ray", ray_address="127.0.0.1:1")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # what ray.init() would use
    with _deadline(60), pytest.raises(StudyExecutorError, match="connection refused"):
        run_study(spec, tmp_path / "out", executor="ray")
    assert not (tmp_path / "out").exists()
    assert executors.parse_ray_address("ray://head.example.org") == ("ray", "head.example.org", 10001)
    assert executors.parse_ray_address("[::1]:6379") == (None, "[::1]", 6379)
    assert executors.parse_ray_address(" auto ") == (None, "auto", None)


@pytest.mark.slow
def test_the_probe_accepts_a_real_ray_head():
    """Against a real GCS (a local Ray started here): the gRPC check passes."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        host, port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
        executors._probe_grpc(host, int(port), 5.0, "the local head")
    finally:
        ray.shutdown()
