"""The multi-process layout: front-end processes on one port beside the engine core's process.

A front end that dies is started again and the service goes on; a dead engine core turns the
front ends NOT_SERVING and every answer UNAVAILABLE (never a wrong one), then they stop; the
front ends never load torch; connections spread over the front ends; metrics add up.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_helpers import (
    CALL_TIMEOUT_S,
    OpenStream,
    ServerProcess,
    assert_forecast,
    ev,
    metric,
    scrape,
    stub_for,
    wait_until,
)

from aaren.oip.v2 import grpc_service_pb2 as oip
from aaren.v1 import aaren_pb2 as pb


def children_of(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    found = []
    for task in tasks.iterdir():
        children = (task / "children").read_text().split()
        found += [int(c) for c in children]
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def health_status(address: str, fresh: bool = False) -> int | None:
    """The overall health status, or None when nothing answers; ``fresh``: on a connection of its own (so that
    the kernel's SO_REUSEPORT hash picks a front end for it anew)."""
    options = [("grpc.use_local_subchannel_pool", 1)] if fresh else []
    with grpc.insecure_channel(address, options=options) as channel:
        try:
            return (
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
            )
        except grpc.RpcError:
            return None


def test_front_ends_serve_one_port_without_torch(start_server):
    srv = start_server(frontends=2)
    processes = srv.server.processes
    assert len(processes) == 2 and all(p is not None and p.poll() is None for p in processes)
    for process in processes:
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        assert "libtorch" not in maps, "a front-end process loaded torch"
    # Connections spread over the front ends (SO_REUSEPORT): with enough of them, both answer.
    opened = []
    for i in range(24):
        channel = grpc.insecure_channel(srv.address, options=[("grpc.use_local_subchannel_pool", 1)])
        stream = OpenStream(stub_for(channel))
        assert_forecast(stream.send([ev(f"spread-{i}", 1, 1.0)]).results[0], f"spread-{i}", 1)
        opened.append((channel, stream))
    samples = scrape(srv.metrics_url)
    assert metric(samples, "aaren_open_streams") == 24  # summed over the front ends
    per_front_end = [metric(f, "aaren_open_streams") for f in srv.call(_front_end_families(srv))]
    assert sorted(per_front_end) != [0, 24] and sum(per_front_end) == 24, per_front_end
    for channel, stream in opened:
        stream.close()
        channel.close()
    assert metric(scrape(srv.metrics_url), "aaren_request_latency_seconds_count", method="Stream") == 24


async def _front_end_families(srv):
    families = await srv.server.core_server.collect_metrics()
    out = []
    for front_end in families:
        samples = {}
        for _, _, _, _, rows in front_end:
            for name, labels, value in rows:
                samples[(name, tuple(sorted(labels.items())))] = value
        out.append(samples)
    return out


def _own(srv, name: str) -> float:
    """The core process's own sample ``name`` (its registry, without the front ends)."""
    return next(s.value for f in srv.server.metrics.registry.collect() for s in f.samples if s.name == name)


def test_process_series_add_up_over_the_front_ends(start_server):
    """Memory, CPU and open files are the service's: the core's plus every front end's; the start
    time is the earliest process's (the core's) and the descriptor limit the core's own."""
    srv = start_server(frontends=2)
    # Read before the scrape: a counter only grows, so the scrape is at least their sum.
    front_ends = srv.call(_front_end_families(srv))
    core_cpu = _own(srv, "process_cpu_seconds_total")
    front_end_cpu = [f[("process_cpu_seconds_total", ())] for f in front_ends]
    assert len(front_end_cpu) == 2 and all(cpu > 0 for cpu in front_end_cpu)
    samples = scrape(srv.metrics_url)
    # The scrape adds in its own order: float sums differ in the last bit (68.99 < 68.23 + 0.38 + 0.38).
    assert metric(samples, "process_cpu_seconds_total") >= core_cpu + sum(front_end_cpu) - 1e-9
    for name in ("process_resident_memory_bytes", "process_open_fds"):
        assert metric(samples, name) > max(f[(name, ())] for f in front_ends), name
    assert metric(samples, "process_start_time_seconds") == _own(srv, "process_start_time_seconds")
    assert metric(samples, "process_max_fds") == _own(srv, "process_max_fds")


def _oip_event(sequence_id: str) -> oip.ModelInferRequest:
    request = oip.ModelInferRequest(model_name="tiny", id=sequence_id)
    request.parameters["sequence_id"].string_param = sequence_id
    request.parameters["sequence_start"].bool_param = True
    request.inputs.add(name="TIME", datatype="FP64", shape=[1]).contents.fp64_contents.append(1.0)
    request.inputs.add(name="MARK", datatype="INT64", shape=[1]).contents.int64_contents.append(1)
    request.inputs.add(name="VALUES", datatype="FP32", shape=[2]).contents.fp32_contents.extend([0.5, -0.5])
    return request


def _oip_call(channel: grpc.Channel, method: str, response: type) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response.FromString,
    )


def test_oip_statistics_add_up_over_the_front_ends(start_server):
    """ModelStatistics counts what every front-end process served, whichever one is asked."""
    srv = start_server(frontends=2)
    n = 16
    for i in range(n):
        with grpc.insecure_channel(srv.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            _oip_call(channel, "ModelInfer", oip.ModelInferResponse)(_oip_event(f"stats-{i}"), timeout=CALL_TIMEOUT_S)
    served = [
        f.get(("aaren_request_latency_seconds_count", (("method", "ModelInfer"),)), 0)
        for f in srv.call(_front_end_families(srv))
    ]
    assert sum(served) == n and 0 not in served, served  # both front ends answered some
    for _ in range(4):
        with grpc.insecure_channel(srv.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            ask = _oip_call(channel, "ModelStatistics", oip.ModelStatisticsResponse)
            (stats,) = ask(oip.ModelStatisticsRequest(name="tiny"), timeout=CALL_TIMEOUT_S).model_stats
        assert (stats.inference_stats.success.count, stats.inference_count) == (n, n)
        assert stats.inference_stats.fail.count == 0 and stats.inference_stats.success.ns > 0


def test_a_killed_front_end_is_started_again(start_server):
    srv = start_server(frontends=2)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        assert_forecast(stream.send([ev("survivor", 1, 1.0)]).results[0], "survivor", 1)
        stream.close()
    victim = srv.server.processes[0]
    os.kill(victim.pid, signal.SIGKILL)
    wait_until(lambda: srv.server.processes[0] is not victim and srv.server.processes[0].poll() is None,
               "the front end to be started again", timeout=30)  # fmt: skip
    wait_until(lambda: metric(scrape(srv.metrics_url), "aaren_frontend_restarts_total") == 1, "the restart counted")
    # The new front end shares the port from its bind on and answers NOT_SERVING ("loading") until it has
    # attached to the core: wait until fresh connections, spread over both by the kernel, all find one serving.
    wait_until(
        lambda: all(health_status(srv.address, fresh=True) == health_pb2.HealthCheckResponse.SERVING for _ in range(8)),
        "both front ends serving",
        timeout=30,
    )
    # Sessions live in the core: the session goes on through whichever front end answers now.
    for seq in (2, 3):
        with grpc.insecure_channel(srv.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            stream = OpenStream(stub_for(channel))
            assert_forecast(stream.send([ev("survivor", seq, float(seq))]).results[0], "survivor", seq)
            stream.close()


def test_a_dead_core_means_not_serving_and_unavailable(tmp_path, tiny_checkpoint):
    server = ServerProcess(tmp_path / "server.log", checkpoint=tiny_checkpoint, frontends=2)
    front_ends = children_of(server.process.pid)
    try:
        assert len(front_ends) == 2
        assert health_status(server.address) == health_pb2.HealthCheckResponse.SERVING
        channel = grpc.insecure_channel(server.address)
        stream = OpenStream(stub_for(channel))
        assert_forecast(stream.send([ev("doomed", 1, 1.0)]).results[0], "doomed", 1)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
        # The front ends still answer for a few seconds: NOT_SERVING, and UNAVAILABLE for everything.
        wait_until(
            lambda: health_status(server.address) == health_pb2.HealthCheckResponse.NOT_SERVING,
            "front ends to say NOT_SERVING",
            timeout=4,
        )
        with pytest.raises(grpc.RpcError) as info:
            stream.send([ev("doomed", 2, 2.0)])
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(server.address) as fresh:
            with pytest.raises(grpc.RpcError) as info:
                stub_for(fresh).DescribeModel(pb.DescribeModelRequest(), timeout=CALL_TIMEOUT_S)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        channel.close()
        # ... and then stop: no orphans are left behind.
        deadline = time.monotonic() + 20
        while any(alive(pid) for pid in front_ends) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in front_ends), "front ends outlived their core"
    finally:
        for pid in front_ends:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        server.kill()
