"""What only the Redis backend has: TLS, unreadable records, outages as errors, key layout, URL options."""

from __future__ import annotations

import asyncio
import struct
import time

import pytest
import torch
from certificates import CertificateAuthority
from redis_process import RedisProcess, free_port

from aaren.server.stores import SaveBatch, SessionMeta, StateLayout, StoreUnavailableError, open_store

LAYOUT = StateLayout({"m": torch.full((2, 3), float("-inf")), "n": torch.zeros((), dtype=torch.long)})


def meta(seq: int, version: str = "v1") -> SessionMeta:
    now = time.time()
    return SessionMeta(last_seq=seq, last_time=float(seq), created_at=now, updated_at=now, model_version=version)


def rows(fill: float) -> dict[str, torch.Tensor]:
    out = LAYOUT.empty(1)
    out["m"].fill_(fill)
    out["n"].fill_(int(fill))
    return out


def with_store(url: str, body, **options):
    """Open a store on ``url``, run ``await body(store)`` and close it, all on one event loop."""

    async def go():
        store = open_store(url, LAYOUT, capacity=10, idle_ttl_s=options.get("idle_ttl_s", 3600.0))
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(go())


def test_tls_round_trip_and_plaintext_refused(tmp_path):
    ca = CertificateAuthority(tmp_path)
    cert, key = ca.issue("redis")
    server = RedisProcess(tmp_path / "redis", tls=(cert, key, ca.path)).start()
    try:

        async def round_trip(store):
            assert await store.healthy()
            assert await store.save(SaveBatch.of(["a"], rows(2.0), [meta(1)], [0])) == [True]
            return await store.get("a")

        got = with_store(server.url, round_trip)
        assert got is not None and got[0].last_seq == 1 and (got[1]["m"] == 2.0).all()

        async def plaintext(store):
            assert not await store.healthy()
            with pytest.raises(StoreUnavailableError, match="redis load failed"):
                await store.load(["a"])

        with_store(f"redis://127.0.0.1:{server.port}/0?timeout_s=0.5", plaintext)

        other = CertificateAuthority(tmp_path, name="other")  # a CA that did not sign the server's certificate

        async def wrong_ca(store):
            with pytest.raises(StoreUnavailableError, match="certificate verify failed"):
                await store.load(["a"])

        with_store(f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={other.path}&timeout_s=0.5", wrong_ca)
    finally:
        server.stop()


def test_nothing_listening_is_unavailable_not_a_hang(tmp_path):
    """A refused connection is an error at once (the store does not retry into a hang): each call says
    which call failed and why, naming the address, and the store reports itself unhealthy."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0?timeout_s=0.5"

    async def body(store):
        messages = []
        for name, call in (
            ("load", store.load(["a"])),
            ("save", store.save(SaveBatch.of(["a"], rows(1.0), [meta(1)], [0]))),
            ("delete", store.delete("a")),
        ):
            with pytest.raises(StoreUnavailableError, match=f"redis {name} failed: ConnectionError") as info:
                await call
            messages.append(str(info.value))
        return messages, await store.healthy()

    messages, healthy = with_store(url, body)
    assert all(f"127.0.0.1:{port}" in m and "Timeout" not in m for m in messages), messages
    assert healthy is False


def test_record_layout_one_string_and_a_tombstone_per_session(redis_server, redis_url):
    prefix = redis_url.split("prefix=")[1]

    async def body(store):
        await store.save(SaveBatch.of(["s{1}"], rows(3.0), [meta(4)], [0]))

    with_store(redis_url, body)
    client = redis_server.client()
    key = f"{prefix}{{s{{1}}}}".encode()
    assert client.type(key) == b"string" and client.type(key + b":t") == b"string"
    record = client.get(key)
    assert record[:20] == b"%020d" % 4, "seq leads the record as 20 digits"
    assert 0 < client.pttl(key) <= 3600_000 < client.pttl(key + b":t")
    assert len(record) == 20 + 24 + 1 + len(b"v1") + LAYOUT.row_nbytes + 16, "a 16-byte write id ends it"

    m = meta(4)

    async def same_again(store):  # another save call with the same bytes: a different write id
        await store.delete("s{1}")
        await store.save(SaveBatch.of(["s{1}"], rows(3.0), [m], [0]))

    with_store(redis_url, same_again)
    first = client.get(key)
    with_store(redis_url, same_again)
    assert client.get(key)[:-16] == first[:-16] and client.get(key)[-16:] != first[-16:]


def test_a_record_written_before_write_ids_is_still_read(redis_server, redis_url):
    prefix = redis_url.split("prefix=")[1]
    state = rows(5.0)
    old = b"%020d" % 7 + struct.pack("<ddd", 7.0, 1.0, 2.0) + b"\x02v1" + state["m"].numpy().tobytes()
    old += state["n"].numpy().tobytes()
    redis_server.client().set(f"{prefix}{{old}}", old)

    async def body(store):
        return await store.get("old"), await store.save(SaveBatch.of(["old"], rows(6.0), [meta(8)], [7]))

    (m, r), written = with_store(redis_url, body)
    assert (m.last_seq, m.last_time, m.created_at, m.updated_at, m.model_version) == (7, 7.0, 1.0, 2.0, "v1")
    assert (r["m"] == 5.0).all() and (r["n"] == 5).all() and written == [True]


def test_unreadable_record_is_reported_as_a_foreign_state_not_a_crash(redis_server, redis_url):
    prefix = redis_url.split("prefix=")[1]
    client = redis_server.client()
    client.set(f"{prefix}{{short}}", b"garbage")
    client.set(f"{prefix}{{wrong-size}}", b"%020d" % 3 + b"\0" * 24 + b"\x02v1" + b"\0" * 5)

    async def body(store):
        return await store.load(["short", "wrong-size", "fine"])

    loaded = with_store(redis_url, body)
    short, wrong, fine = loaded.metas
    assert short is not None and "unreadable record" in short.model_version
    assert (
        wrong is not None
        and wrong.last_seq == 3
        and "5 state bytes, expected" in wrong.model_version
        and "write id" in wrong.model_version
    )
    assert fine is None
    assert torch.isneginf(loaded.tensors["m"]).all(), "unreadable rows load as fresh rows"


class ReplyLosingProxy:
    """A TCP proxy in front of Redis that, once armed, lets a request through to Redis, drops
    Redis's reply and closes the client's connection: a reply lost after the write landed."""

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.armed = False
        self.lost = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection("127.0.0.1", self.redis_port)

        async def up() -> None:
            while data := await client_r.read(65536):
                redis_w.write(data)
                await redis_w.drain()
            redis_w.close()

        async def down() -> None:
            while data := await redis_r.read(65536):
                if self.armed:
                    self.armed, self.lost = False, self.lost + 1
                    break
                client_w.write(data)
                await client_w.drain()
            client_w.close()
            redis_w.close()

        await asyncio.gather(up(), down(), return_exceptions=True)

    async def close(self) -> None:
        self.server.close()


def test_a_write_resent_after_its_reply_was_lost_answers_written(redis_server):
    """redis-py resends a pipeline whose connection died before the reply came; the script then
    finds this very call's write (its seq and write id) and answers written, not a conflict."""
    proxy = ReplyLosingProxy(redis_server.port)

    async def body():
        port = await proxy.start()
        store = open_store(
            f"redis://127.0.0.1:{port}/0?prefix=lost{time.time_ns()}:", LAYOUT, capacity=10, idle_ttl_s=3600
        )
        try:
            # Connection, handshake and script in place, so the next reply is the save's own.
            assert await store.save(SaveBatch.of(["warm"], rows(1.0), [meta(1)], [0])) == [True]
            proxy.armed = True
            resent = await store.save(SaveBatch.of(["a"], rows(2.0), [meta(1)], [0]))
            return resent, await store.get("a")
        finally:
            await store.close()
            await proxy.close()

    resent, (m, r) = asyncio.run(body())
    assert proxy.lost == 1, "the proxy never lost a reply: the test did not test a resend"
    assert resent == [True] and m.last_seq == 1 and (r["m"] == 2.0).all()


def test_script_cache_flushed_by_redis_is_reloaded(redis_server, redis_url):
    async def body(store):
        await store.save(SaveBatch.of(["a"], rows(1.0), [meta(1)], [0]))
        redis_server.client().script_flush()
        return await store.save(SaveBatch.of(["a"], rows(2.0), [meta(2)], [1])), await store.get("a")

    written, (m, r) = with_store(redis_url, body)
    assert written == [True] and m.last_seq == 2 and (r["m"] == 2.0).all()


@pytest.mark.parametrize(
    ("query", "message"),
    [("timeout_s=0", "timeout_s must be > 0"), ("timeout_s=x", "must be numbers"), ("tombstone_ttl_s=-1", ">= 0")],
)
def test_bad_url_options_are_refused(query, message):
    with pytest.raises(ValueError, match=message):
        open_store(f"redis://127.0.0.1:1/0?{query}", LAYOUT, capacity=1, idle_ttl_s=1)
