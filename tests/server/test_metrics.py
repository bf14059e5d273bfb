"""Prometheus metrics: scraped over HTTP after traffic and parsed with prometheus_client's parser."""

from __future__ import annotations

import math

import grpc
import pytest
from server_helpers import (
    OpenStream,
    assert_event_error,
    assert_forecasts,
    ev,
    metric,
    scrape,
    stub_for,
    wait_until,
)

from aaren.v1 import aaren_pb2 as pb

pytestmark = pytest.mark.layouts  # every server of this module runs in both process layouts


SIDS = ("sid-alpha-7f3e", "sid-beta-91c2", "sid-gamma-04aa")


def test_metrics_present_and_moving(start_server):
    srv = start_server()
    a, b, c = SIDS
    before = scrape(srv.metrics_url)
    for outcome in ("applied", "duplicate", "rejected"):
        assert metric(before, "aaren_events_total", outcome=outcome) == 0
    for phase in ("queue", "model", "store", "total"):
        assert metric(before, "aaren_event_latency_seconds_count", phase=phase) == 0
    assert metric(before, "aaren_open_streams") == 0
    assert metric(before, "aaren_active_sessions") == 0

    with grpc.insecure_channel(srv.address) as channel:
        stub = stub_for(channel)
        per_session = stub.DescribeModel(pb.DescribeModelRequest()).state_bytes_per_session
        stream = OpenStream(stub)
        assert_forecasts(stream.send([ev(a, 1, 1.0), ev(b, 1, 1.0), ev(c, 1, 1.0)]), [(a, 1), (b, 1), (c, 1)])
        assert metric(scrape(srv.metrics_url), "aaren_open_streams") == 1
        assert_forecasts(stream.send([ev(a, 2, 2.0), ev(b, 2, 2.0)]), [(a, 2), (b, 2)])
        response = stream.send([ev(a, 1, 1.0), ev(a, 9, 9.0), ev(b, 3, math.nan), ev(c, 2, 2.0, mark=7)])
        assert response.results[0].duplicate
        assert_event_error(response.results[1], pb.ERROR_CODE_FAILED_PRECONDITION, "seq_gap")
        assert_event_error(response.results[2], pb.ERROR_CODE_INVALID_ARGUMENT, "time_not_finite")
        assert_event_error(response.results[3], pb.ERROR_CODE_INVALID_ARGUMENT, "mark_out_of_range")
        assert stub.EndSession(pb.EndSessionRequest(session_id=c)).existed
        stub.Forecast(pb.ForecastRequest(session_id=a))
        stream.close()
        wait_until(lambda: metric(scrape(srv.metrics_url), "aaren_open_streams") == 0, "open streams back to 0")

    s = scrape(srv.metrics_url)
    for phase in ("queue", "model", "store", "total"):
        assert metric(s, "aaren_event_latency_seconds_count", phase=phase) > 0, phase
        assert metric(s, "aaren_event_latency_seconds_bucket", phase=phase, le="+Inf") > 0, phase
        assert metric(s, "aaren_event_latency_seconds_sum", phase=phase) >= 0, phase
    assert metric(s, "aaren_event_latency_seconds_count", phase="total") == 3  # one per request with events
    assert metric(s, "aaren_batch_size_count") > 0
    assert metric(s, "aaren_batch_size_sum") >= metric(s, "aaren_batch_size_count")
    assert metric(s, "aaren_events_total", outcome="applied") == 5
    assert metric(s, "aaren_events_total", outcome="duplicate") == 1
    assert metric(s, "aaren_events_total", outcome="rejected") == 3
    for reason in ("seq_gap", "time_not_finite", "mark_out_of_range"):
        assert metric(s, "aaren_events_rejected_total", reason=reason) == 1, reason
    assert metric(s, "aaren_sessions_started_total") == 3
    assert metric(s, "aaren_sessions_ended_total") == 1
    assert metric(s, "aaren_active_sessions") == 2
    assert per_session > 0
    assert metric(s, "aaren_state_bytes_per_session") == per_session
    assert metric(s, "aaren_state_bytes") == 2 * per_session
    assert metric(s, "aaren_request_latency_seconds_count", method="Stream") >= 3
    assert metric(s, "aaren_request_latency_seconds_count", method="Forecast") >= 1
    assert metric(s, "aaren_open_streams") == 0

    # No session id anywhere in the names or labels.
    for name, labels in s:
        for sid in SIDS:
            assert sid not in name and all(sid not in value for _, value in labels), (name, labels)


def test_too_many_events_counted_as_rejected(start_server):
    srv = start_server(max_events_per_request=2)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        response = stream.send([ev("x", 1, 1.0), ev("y", 1, 1.0), ev("z", 1, 1.0)])
        assert response.request_error.reason == "too_many_events"
        stream.close()
    s = scrape(srv.metrics_url)
    assert metric(s, "aaren_events_rejected_total", reason="too_many_events") == 3
    assert metric(s, "aaren_events_total", outcome="rejected") == 3
    assert metric(s, "aaren_events_total", outcome="applied") == 0


def test_batches_hold_at_most_max_batch_events(start_server):
    """A request of 6 sessions with 3 events each and a cap of 4 events: the request is split over
    batches of 4, 4, 4, 4 and 2 events, in order (a session split over two batches resumes from its
    stored state), and every event is forecast."""
    srv = start_server(max_batch_events=4)
    with grpc.insecure_channel(srv.address) as channel:
        stream = OpenStream(stub_for(channel))
        events = [ev(f"cap-{s}", k, float(k)) for s in range(6) for k in (1, 2, 3)]
        results = stream.send(events).results
        stream.close()
    assert [r.WhichOneof("outcome") for r in results] == ["forecast"] * 18
    samples = scrape(srv.metrics_url)
    assert metric(samples, "aaren_batch_events_count") == 5
    assert metric(samples, "aaren_batch_events_sum") == 18
    assert metric(samples, "aaren_batch_size_sum") == 9  # sessions per batch: 2, 2, 2, 2, 1
    assert metric(samples, "aaren_batch_events_bucket", le="2.0") == 1
    assert metric(samples, "aaren_batch_events_bucket", le="4.0") == 5  # none above the cap


def test_every_server_of_a_process_exports_the_process_metrics(start_server):
    """Two servers in one process (each with its own registry) both export the process_* and python_* series:
    the collectors are registered per registry, so a second server neither fails nor goes without them."""
    servers = [start_server(), start_server()]
    scrapes = [scrape(srv.metrics_url) for srv in servers]
    for s in scrapes:
        assert metric(s, "process_resident_memory_bytes") > 0
        assert metric(s, "process_open_fds") > 0
        assert metric(s, "process_cpu_seconds_total") > 0
        assert any(name == "python_info" for name, _ in s)
        assert any(name == "python_gc_objects_collected_total" for name, _ in s)
    assert metric(scrapes[0], "process_start_time_seconds") == metric(scrapes[1], "process_start_time_seconds")


def test_observe_many_and_deferred_histograms_count_as_observe_does():
    """A batch's latencies observed at once, and a DeferredHistogram's deferred observations, give the same
    buckets, count and sum as prometheus_client's own observe one by one: at the bucket bounds, between, past
    the last and below the first, and NaN (in no bucket; the sum NaN)."""
    from prometheus_client import CollectorRegistry, Histogram

    from aaren.server.observability.metrics import LATENCY_BUCKETS, DeferredHistogram, observe_many

    amounts = [0.0, -1.0, 0.0001, 0.00011, 0.0025, 0.0025, 0.7, 10.0, 10.5, 1e9, *[0.003 * i for i in range(40)]]
    ways = ("one by one", "observe_many", "deferred one by one", "deferred observe_many")
    families = []
    for way in ways:
        registry = CollectorRegistry()
        kind = DeferredHistogram if way.startswith("deferred") else Histogram
        h = kind("x_seconds", "x", ["phase"], buckets=LATENCY_BUCKETS, registry=registry).labels("total")
        if way.endswith("one by one"):
            for a in amounts:
                h.observe(a)
        else:
            observe_many(h, amounts[:5])
            observe_many(h, [])
            observe_many(h, amounts[5:])
        families.append({(s.name, s.labels.get("le")): s.value for f in registry.collect() for s in f.samples
                         if not s.name.endswith("_created")})  # fmt: skip
    for got in families[1:]:
        assert got == pytest.approx(families[0])
    assert families[0][("x_seconds_count", None)] == len(amounts)
    # a scrape counted them in: a second scrape of the same histogram gives the same numbers
    assert {(s.name, s.labels.get("le")): s.value for f in registry.collect() for s in f.samples
            if not s.name.endswith("_created")} == families[-1]  # fmt: skip


def test_a_deferred_histogram_loses_nothing_to_scrapes_from_another_thread():
    """Observations from two threads while a third scrapes over and over, past FOLD_EVERY (so folds come from
    both sides): every one is counted once."""
    import threading

    from prometheus_client import CollectorRegistry

    from aaren.server.observability.metrics import FOLD_EVERY, DeferredHistogram

    registry = CollectorRegistry()
    h = DeferredHistogram("y_seconds", "y", buckets=(0.5, 1.0), registry=registry)
    n = FOLD_EVERY * 3 + 17
    done = threading.Event()

    def observe(amount: float) -> None:
        for _ in range(n):
            h.observe(amount)

    def scrape() -> None:
        while not done.is_set():
            list(registry.collect())

    scraper = threading.Thread(target=scrape)
    scraper.start()
    observers = [threading.Thread(target=observe, args=(a,)) for a in (0.25, 0.75)]
    for t in observers:
        t.start()
    for t in observers:
        t.join()
    done.set()
    scraper.join()
    samples = {(s.name, s.labels.get("le")): s.value for f in registry.collect() for s in f.samples}
    assert samples[("y_seconds_count", None)] == 2 * n
    assert samples[("y_seconds_bucket", "0.5")] == n
    assert samples[("y_seconds_bucket", "1.0")] == 2 * n
    assert samples[("y_seconds_sum", None)] == pytest.approx(n * (0.25 + 0.75))
    with pytest.raises(ValueError):  # a parent with labels cannot observe, as in prometheus_client
        DeferredHistogram("z_seconds", "z", ["phase"], registry=registry).observe(1.0)
