"""TLS and mutual TLS, token authentication, tenant isolation (memory and Redis), secrets kept out of
logs and metrics. Certificates are made by the test; every server and client is real."""

from __future__ import annotations

import logging
import urllib.request

import grpc
import pytest
from certificates import CertificateAuthority
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_helpers import (
    CALL_TIMEOUT_S,
    OpenStream,
    assert_event_error,
    assert_forecast,
    ev,
    reason_of,
    stub_for,
)

from aaren.server.contract.errors import ConfigError
from aaren.server.security.auth import hash_token, new_token
from aaren.v1 import aaren_pb2 as pb

pytestmark = pytest.mark.layouts  # every server of this module runs in both process layouts


# --------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    server_ca = CertificateAuthority(directory, "server")
    client_ca = CertificateAuthority(directory, "client")
    rogue_ca = CertificateAuthority(directory, "rogue")
    return {
        "dir": directory,
        "server_ca": server_ca,
        "client_ca": client_ca,
        "server": server_ca.issue("server"),
        "client": client_ca.issue("client", server=False),
        "rogue_client": rogue_ca.issue("rogue-client", server=False),
        "rogue_ca": rogue_ca,
    }


def describe(channel: grpc.Channel, timeout: float = CALL_TIMEOUT_S) -> pb.DescribeModelResponse:
    return stub_for(channel).DescribeModel(pb.DescribeModelRequest(), timeout=timeout)


def tls_channel(address: str, ca, client=None) -> grpc.Channel:
    cert_chain = key = None
    if client is not None:
        cert_chain, key = client[0].read_bytes(), client[1].read_bytes()
    credentials = grpc.ssl_channel_credentials(ca.path.read_bytes(), private_key=key, certificate_chain=cert_chain)
    return grpc.secure_channel(address, credentials)


def refused(channel: grpc.Channel) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        describe(channel, timeout=5)
    return info.value


def test_tls_serves_tls_clients_and_refuses_plaintext_and_unknown_cas(start_server, pki):
    cert, key = pki["server"]
    srv = start_server(tls_cert_file=cert, tls_key_file=key)
    with tls_channel(srv.address, pki["server_ca"]) as channel:
        assert describe(channel).num_marks == 5
    with grpc.insecure_channel(srv.address) as channel:
        assert refused(channel).code() == grpc.StatusCode.UNAVAILABLE
    with tls_channel(srv.address, pki["rogue_ca"]) as channel:  # the server's certificate is not signed by it
        assert refused(channel).code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate_from_the_client_ca(start_server, pki):
    cert, key = pki["server"]
    srv = start_server(tls_cert_file=cert, tls_key_file=key, tls_client_ca_file=pki["client_ca"].path)
    with tls_channel(srv.address, pki["server_ca"], pki["client"]) as channel:
        assert describe(channel).num_marks == 5
    with tls_channel(srv.address, pki["server_ca"]) as channel:  # no client certificate
        assert refused(channel).code() == grpc.StatusCode.UNAVAILABLE
    with tls_channel(srv.address, pki["server_ca"], pki["rogue_client"]) as channel:  # signed by another CA
        assert refused(channel).code() == grpc.StatusCode.UNAVAILABLE


def test_plaintext_is_refused_off_loopback_unless_asked_for(start_server):
    from servers import ServerThread

    refusing = ServerThread(address="0.0.0.0:0")
    with pytest.raises(ConfigError, match=r"refusing to serve plaintext gRPC on 0\.0\.0\.0:0"):
        refusing.__enter__()
    refusing.stop()
    srv = start_server(address="0.0.0.0:0", plaintext=True)
    with grpc.insecure_channel(f"127.0.0.1:{srv.server.grpc_port}") as channel:
        assert describe(channel).num_marks == 5


# --------------------------------------------------------------------------- tokens and tenants


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """Two tenants' tokens and the token file (digests only) the server reads."""
    values = {"tenant-a": new_token(), "tenant-b": new_token()}
    path = tmp_path_factory.mktemp("auth") / "tokens.txt"
    lines = ["# tenant digest"] + [f"{tenant} {hash_token(token)}" for tenant, token in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return values, path


def as_tenant(token: str | None) -> list[tuple[str, str]]:
    return [] if token is None else [("authorization", f"Bearer {token}")]


class TenantClient:
    """Calls of one tenant (its token on every call) on one channel."""

    def __init__(self, channel: grpc.Channel, token: str | None) -> None:
        self.stub = stub_for(channel)
        self.metadata = as_tenant(token)

    def stream(self) -> OpenStream:
        return OpenStream(self.stub, metadata=self.metadata)

    def session(self, session_id: str) -> pb.GetSessionResponse | None:
        try:
            return self.stub.GetSession(
                pb.GetSessionRequest(session_id=session_id, include_state=True),
                metadata=self.metadata,
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def forecast(self, session_id: str) -> pb.ForecastResponse:
        return self.stub.Forecast(
            pb.ForecastRequest(session_id=session_id), metadata=self.metadata, timeout=CALL_TIMEOUT_S
        )

    def end(self, session_id: str) -> pb.EndSessionResponse:
        return self.stub.EndSession(
            pb.EndSessionRequest(session_id=session_id), metadata=self.metadata, timeout=CALL_TIMEOUT_S
        )


@pytest.fixture(params=["memory", "redis"])
def auth_server(request, start_server, tokens):
    _, path = tokens
    settings = {"auth_tokens_file": path}
    if request.param == "redis":
        settings["store_url"] = request.getfixturevalue("redis_url")
    return start_server(**settings)


def test_calls_without_a_valid_token_are_unauthenticated_but_health_is_open(auth_server, tokens):
    values, _ = tokens
    with grpc.insecure_channel(auth_server.address) as channel:
        for token, reason in ((None, "token_missing"), ("aaren_not-a-real-token", "token_invalid")):
            client = TenantClient(channel, token)
            calls = [
                lambda c=client: c.stub.DescribeModel(pb.DescribeModelRequest(), metadata=c.metadata, timeout=5),
                lambda c=client: c.session("s"),
                lambda c=client: c.forecast("s"),
                lambda c=client: c.end("s"),
                lambda c=client: list(
                    c.stub.Stream(iter([pb.StreamRequest(events=[ev("s", 1, 1.0)])]), metadata=c.metadata, timeout=5)
                ),
            ]
            for call in calls:
                with pytest.raises(grpc.RpcError) as info:
                    call()
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value
                assert reason_of(info.value) == reason
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        # A token of the wrong case or with spaces around is not the token.
        client = TenantClient(channel, values["tenant-a"].upper())
        with pytest.raises(grpc.RpcError) as info:
            client.session("s")
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_tenants_never_reach_each_others_sessions(auth_server, tokens):
    values, _ = tokens
    with grpc.insecure_channel(auth_server.address) as channel:
        a, b = TenantClient(channel, values["tenant-a"]), TenantClient(channel, values["tenant-b"])
        stream_a, stream_b = a.stream(), b.stream()
        # The same session id under two tenants is two sessions.
        for seq in (1, 2, 3):
            assert_forecast(stream_a.send([ev("shared", seq, float(seq), mark=1)]).results[0], "shared", seq)
        for seq in (1, 2):
            assert_forecast(stream_b.send([ev("shared", seq, 10.0 * seq, mark=3)]).results[0], "shared", seq)
        assert_forecast(stream_b.send([ev("b-only", 1, 5.0)]).results[0], "b-only", 1)
        before = {sid: b.session(sid) for sid in ("shared", "b-only")}
        assert before["shared"].last_seq == 2 and a.session("shared").last_seq == 3

        # A reaching for B's session: it does not exist for A, exactly as a session nobody has.
        assert a.session("b-only") is None
        for sid in ("b-only", "nobody-has-this"):
            with pytest.raises(grpc.RpcError) as info:
                a.forecast(sid)
            assert (info.value.code(), reason_of(info.value)) == (grpc.StatusCode.NOT_FOUND, "session_not_found")
            assert info.value.details() == f"session {sid!r} does not exist"
        assert a.end("b-only").existed is False
        late = stream_a.send([ev("b-only", 2, 6.0)]).results[0]
        assert_event_error(late, pb.ERROR_CODE_NOT_FOUND, "session_not_found")
        # A writing and ending its own "shared" changes nothing of B's.
        assert_forecast(stream_a.send([ev("shared", 4, 4.0)]).results[0], "shared", 4)
        assert a.end("shared").existed is True
        after = {sid: b.session(sid) for sid in ("shared", "b-only")}
        for sid in before:
            assert after[sid].state == before[sid].state and after[sid].last_seq == before[sid].last_seq, sid
        stream_a.close()
        stream_b.close()


def test_token_file_errors_name_the_line_not_the_token(tmp_path, start_server):
    from servers import ServerThread

    bad = tmp_path / "tokens.txt"
    for content, message in (
        ("tenant-a aaren_plaintext-token\n", r"tokens.txt:1: expected a token digest"),
        ("# ok\nTenant/A sha256:" + "0" * 64 + "\n", r"tokens.txt:2: tenant 'Tenant/A' must match"),
        ("# nothing\n", "no tokens"),
    ):
        bad.write_text(content)
        srv = ServerThread(auth_tokens_file=bad)
        with pytest.raises(ConfigError, match=message) as info:
            srv.__enter__()
        srv.stop()
        assert "aaren_plaintext-token" not in str(info.value)


def test_tokens_never_appear_in_logs_or_metrics(start_server, tokens, caplog):
    values, path = tokens
    caplog.set_level(logging.DEBUG)
    srv = start_server(auth_tokens_file=path)
    with grpc.insecure_channel(srv.address) as channel:
        client = TenantClient(channel, values["tenant-a"])
        stream = client.stream()
        assert_forecast(stream.send([ev("s", 1, 1.0)]).results[0], "s", 1)
        stream.close()
        for token in ("aaren_wrong-token", None):
            with pytest.raises(grpc.RpcError):
                TenantClient(channel, token).session("s")
    with urllib.request.urlopen(srv.metrics_url, timeout=10) as response:
        metrics = response.read().decode()
    assert 'aaren_auth_refusals_total{reason="token_invalid"} 1.0' in metrics
    everything = caplog.text + metrics
    for secret in (*values.values(), "aaren_wrong-token"):
        assert secret not in everything
