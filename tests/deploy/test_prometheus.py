"""deploy/prometheus and deploy/grafana, checked with the real tools: promtool validates the config and the
rules and runs their unit tests; a real Prometheus scrapes a real server that serves real streams, and every
PromQL expression of the alert rules and of the Grafana dashboard is evaluated against it."""

from __future__ import annotations

import json
import math
import queue
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
import yaml
from prometheus_process import PrometheusProcess, promtool

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA_DIR / "dashboards" / "aaren.json"
DASHBOARDS_MOUNT = "/var/lib/grafana/dashboards"  # where compose mounts deploy/grafana/dashboards
SEVERITIES = {"critical", "warning", "info"}
# An alert's expression is `<signal> <comparison> <number>` (alerts.yml's convention).
ALERT_EXPR = re.compile(
    r"^(?P<signal>.+?)\s*(?P<op>==|!=|>=|<=|>|<)\s*(?P<threshold>-?[0-9.]+(?:e-?[0-9]+)?)\s*$", re.S
)
# Grafana's variables, replaced by what Grafana would send for the default selection.
GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "job": "aaren", "instance": ".*"}
# Alerts whose state on this machine depends on its speed (a loaded CI machine may be slow): left out of the
# "nothing fires on a healthy server" check; their thresholds are unit-tested by promtool (alerts_test.yml).
SPEED_DEPENDENT_ALERTS = {"AarenEventLatencyP99High", "AarenEventLatencyP99Critical"}
DEADLINE_S = 20.0


def rule_groups() -> list[dict[str, Any]]:
    return yaml.safe_load(ALERTS.read_text())["groups"]


def rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(items: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in dashboard()["panels"] if items is None else items:
        yield panel
        yield from panels(panel.get("panels", []))


def substitute(expr: str) -> str:
    """The expression Grafana would send: its variables ($name, ${name}, [[name]]) replaced."""

    def value(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        assert name in GRAFANA_VARIABLES, f"unknown Grafana variable {name!r} in {expr!r}"
        return GRAFANA_VARIABLES[name]

    out = re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", value, expr)
    assert "$" not in out, out
    return out


def dashboard_exprs() -> list[str]:
    exprs = [substitute(t["expr"]) for p in panels() for t in p.get("targets", []) if t.get("expr")]
    assert len(exprs) >= 20, exprs
    return exprs


def template_queries() -> list[tuple[str, str]]:
    """(metric selector, label) of the dashboard's `label_values(selector, label)` variables."""
    out = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert match, f"variable {variable['name']}: {query!r} is not label_values(selector, label)"
        out.append((substitute(match[1]), match[2]))
    return out


def metric_names() -> set[str]:
    """Every metric server/observability/metrics.py defines."""
    names = set(re.findall(r'"(aaren_[a-z_]+)"', (ROOT / "server" / "observability" / "metrics.py").read_text()))
    assert len(names) >= 19, names
    return names


def server_reasons() -> set[str]:
    """Every rejection reason the server can send: the proto's list and the reasons in server/'s sources."""
    proto = (ROOT / "proto" / "aaren" / "v1" / "aaren.proto").read_text()
    listed = proto[proto.index("Sent by this server") : proto.index("New reasons may be added")]
    reasons = set(re.findall(r'"([a-z_]+)"', listed))
    for source in (ROOT / "server").rglob("*.py"):
        text = source.read_text()
        reasons |= set(re.findall(r'(?:ErrorInfo|ServiceError)\(\s*Code\.[A-Z_]+,\s*"([a-z_]+)"', text))
        reasons |= set(re.findall(r'reason="([a-z_]+)"', text))
    return reasons


# ----------------------------------------------------------------------------------------- promtool, files


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout, result.stdout


def test_promtool_check_config() -> None:
    """The compose config (its rule_files, relative to it, are checked too)."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "aaren" and job["scrape_interval"] == "15s"
    # The server replicas and the event-log consumer: both compose services serve /metrics on 9464.
    names = ["aaren", "consumer"]
    assert job["dns_sd_configs"] == [{"names": names, "type": "A", "port": 9464, "refresh_interval": "15s"}]
    services = yaml.safe_load((PROMETHEUS_DIR.parent.parent / "docker-compose.yml").read_text())["services"]
    assert set(names) <= set(services), "a scraped name that is no compose service"
    result = promtool("check", "config", str(PROMETHEUS_DIR / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is valid prometheus config file syntax" in result.stdout and "SUCCESS: 1 rule files found" in result.stdout


def kubernetes_example() -> dict[str, Any]:
    """The commented Kubernetes scrape job of prometheus.yml, uncommented."""
    text = (PROMETHEUS_DIR / "prometheus.yml").read_text()
    block = text[text.index("# --- kubernetes example begin") : text.index("# --- kubernetes example end")]
    lines = [line for line in block.splitlines()[1:] if line.strip()]
    assert lines and all(line.lstrip().startswith("#") for line in lines), lines
    (job,) = yaml.safe_load("\n".join(re.sub(r"^(\s*)# ?", r"\1", line) for line in lines))
    return job


def test_commented_kubernetes_example_is_a_valid_scrape_config(tmp_path: Path) -> None:
    job = kubernetes_example()
    assert job["job_name"] == "aaren"  # the alert rules select job="aaren"
    assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
    # Debian's prometheus is built without Kubernetes discovery (promtool: "field kubernetes_sd_configs not
    # found"), so promtool checks the job with a static target in its place: the relabel rules (actions,
    # regexes, labels) are still checked; test_kubernetes_example_relabels_pods runs them.
    job["static_configs"] = [{"targets": ["127.0.0.1:9464"]}]
    config = {"global": {"scrape_interval": "15s"}, "rule_files": [str(ALERTS)], "scrape_configs": [job]}
    path = tmp_path / "kubernetes.yml"
    path.write_text(yaml.safe_dump(config))
    result = promtool("check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_of_the_alerts() -> None:
    """alerts_test.yml: latency, server-error ratio (store_unavailable pages, seq_gap does not), store down and
    store errors, capacity evictions, sessions near capacity, target down: each fires and stays quiet."""
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])}
    assert len(tested) >= 2 and tested <= {a["alert"] for a in alerts()}, tested
    fired = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    silent = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", []) if not t["exp_alerts"]}
    assert len(fired & silent) >= 2, (fired, silent)  # at least two alerts are seen both firing and not
    result = promtool("test", "rules", "alerts_test.yml", cwd=PROMETHEUS_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_alert_rules_are_complete() -> None:
    for group in rule_groups():
        assert "interval" not in group, f"group {group['name']}: rules run at the global evaluation_interval"
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names)) and len(names) >= 8, names
    for alert in alerts():
        name = alert["alert"]
        assert alert.get("for"), f"{name}: no `for`"
        assert alert["labels"]["severity"] in SEVERITIES, name
        assert alert["annotations"]["summary"].strip() and alert["annotations"]["description"].strip(), name
        assert ALERT_EXPR.match(alert["expr"].strip()), f"{name}: expr is not `<signal> <op> <number>`"
    exprs = " ".join(rule["expr"] for rule in rules())
    for metric in ("up", "aaren_event_latency_seconds_bucket", "aaren_events_rejected_total", "aaren_store_up"):
        assert re.search(rf"\b{metric}\b", exprs), metric
    for metric in ("aaren_store_errors_total", "aaren_active_sessions", "aaren_sessions_evicted_total"):
        assert re.search(rf"\b{metric}\b", exprs), metric
    assert re.search(r"\baaren_state_conflicts_total\b", exprs)


def test_alert_rules_name_real_rejection_reasons() -> None:
    """A misspelt reason in a label matcher would silently match nothing."""
    known = server_reasons()
    assert {"seq_gap", "store_unavailable", "batch_aborted", "internal", "state_conflict"} <= known, known
    named = set()
    for rule in rules():
        for values in re.findall(r'reason\s*=~?\s*"([^"]*)"', rule["expr"]):
            named |= set(values.split("|"))
    assert {"store_unavailable", "batch_aborted", "internal", "server_busy"} <= named, named
    assert named <= known, named - known
    assert not {"seq_gap", "tenant_rate_limited"} & named  # a client's mistake or quota never pages


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] == "aaren" and 36 <= board["schemaVersion"] <= 41
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["datasource"]["current"]["value"] == "prometheus"  # the provisioned data source's uid
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids)), ids
    cells: set[tuple[int, int]] = set()
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        new = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & new, f"panel {panel['title']!r} overlaps another"
        cells |= new
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"].strip(), panel["title"]
    titles = " | ".join(p["title"].lower() for p in panels())
    for word in ("events/s by outcome", "latency", "batch size", "active sessions", "state bytes", "by reason"):
        assert word in titles, word
    for word in ("store latency", "store errors", "cas conflicts", "open streams", "pending events", "store up"):
        assert word in titles, word
    for word in ("process memory", "process cpu", "open file descriptors"):
        assert word in titles, word


def test_dashboard_shows_every_metric() -> None:
    exprs = " ".join(dashboard_exprs())
    missing = {m for m in metric_names() if not re.search(rf"\b{m}(_bucket|_sum|_count)?\b", exprs)}
    assert not missing, f"metrics on no dashboard panel: {sorted(missing)}"


def test_grafana_provisioning() -> None:
    datasources = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert datasources["apiVersion"] == 1
    assert (source["uid"], source["type"], source["url"]) == ("prometheus", "prometheus", "http://prometheus:9090")
    providers = yaml.safe_load((GRAFANA_DIR / "provisioning" / "dashboards" / "aaren.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == DASHBOARDS_MOUNT


# ------------------------------------------------------------------------------------ real Prometheus, e2e


class EventFeeder(threading.Thread):
    """Streams events of a few sessions over one real Stream call until stopped: one event per session per
    request, and after the first request one duplicate and one seq gap (a client mistake, so that
    aaren_events_rejected_total has a series)."""

    def __init__(self, address: str, sessions: int = 4, period_s: float = 0.02) -> None:
        super().__init__(name="event-feeder", daemon=True)
        self.address = address
        self.sessions = [f"s{i}" for i in range(sessions)]
        self.period_s = period_s
        self.stopping = threading.Event()
        self.applied = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        requests: queue.Queue[pb.StreamRequest | None] = queue.Queue()
        try:
            with grpc.insecure_channel(self.address) as channel:
                call = aaren_pb2_grpc.ForecastServiceStub(channel).Stream(iter(requests.get, None), timeout=60)
                n = 0

                def send(*events: pb.Event) -> list[pb.EventResult]:
                    nonlocal n
                    n += 1
                    requests.put(pb.StreamRequest(request_id=f"r{n}", events=list(events)))
                    response = next(call)
                    assert response.request_id == f"r{n}" and not response.HasField("request_error"), response
                    return list(response.results)

                seq = 0
                while not self.stopping.is_set():
                    seq += 1
                    results = send(*(event(sid, seq, float(seq)) for sid in self.sessions))
                    assert [r.WhichOneof("outcome") for r in results] == ["forecast"] * len(self.sessions), results
                    self.applied += len(results)
                    if seq == 1:
                        again, gap = send(event(self.sessions[0], 1, 1.0), event(self.sessions[1], 3, 1.0))
                        assert again.duplicate, again
                        assert gap.WhichOneof("outcome") == "error" and gap.error.reason == "seq_gap", gap
                    self.stopping.wait(self.period_s)
                requests.put(None)
                assert list(call) == []
        except BaseException as exc:  # reported by stop() in the test's thread
            self.error = exc
            requests.put(None)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=20)
        assert not self.is_alive(), "the event feeder did not stop"
        if self.error is not None:
            raise AssertionError(f"streaming failed: {self.error!r}") from self.error


def event(session_id: str, seq: int, t: float) -> pb.Event:
    return pb.Event(session_id=session_id, seq=seq, time=t, mark=seq % 5, values=[0.0, 0.0])


def wait_for(check: Callable[[], Any], what: str, prometheus: PrometheusProcess, timeout: float = DEADLINE_S) -> Any:
    """Poll ``check`` until it returns something truthy; fail with its last answer after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}; last: {value!r}\n{prometheus.log()}")
        time.sleep(0.25)


def exported(metrics_url: str) -> tuple[set[str], set[str]]:
    """(metric names the server declares with # TYPE, names that have samples) in its /metrics now."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    declared = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    sampled = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))
    return declared, sampled


def never_incremented(expr: str, declared: set[str], sampled: set[str]) -> bool:
    """Whether ``expr`` is empty only because it reads a labelled counter the server exports (# TYPE) but
    nothing has incremented yet (no series: e.g. aaren_auth_refusals_total without authentication). Every
    metric it names must be exported, and one of them must have no sample at all; an empty result over
    metrics that do have samples (a misspelt label or label value) is not excused."""
    names = set(re.findall(r"\b(aaren_[a-z_]+)\b", expr))
    if not names or not all(
        name in declared or re.sub(r"_(bucket|sum|count)$", "", name) in declared for name in names
    ):
        return False
    return any(name not in sampled for name in names)


def values(result: list[dict[str, Any]]) -> list[float]:
    return [float(sample["value"][1]) for sample in result]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], PrometheusProcess]]:
    """``prometheus(config)``: a real Prometheus running ``config`` (stopped after the test)."""
    started: list[PrometheusProcess] = []

    def start(config: dict[str, Any]) -> PrometheusProcess:
        process = PrometheusProcess(tmp_path / f"prometheus-{len(started)}", config)
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.stop()


# Series of prometheus_client's process, platform and GC collectors that the dashboard or an operator reads.
PROCESS_METRICS = {
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
    "python_info",
    "python_gc_objects_collected_total",
}


def test_promtool_checks_the_metrics_of_a_real_server(start_server) -> None:
    """`promtool check metrics` on a real server's /metrics after real traffic (applied events, a duplicate and a
    seq gap, so that labelled series exist) reports nothing: names, suffixes, types and help all pass Prometheus'
    own linter. The scrape also has the process_* (memory, CPU, open files) and python_* series."""
    server = start_server()
    feeder = EventFeeder(server.address)
    feeder.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while feeder.applied < 2 * len(feeder.sessions) and feeder.error is None:  # past the duplicate and the gap
            assert time.monotonic() < deadline, "the event feeder applied nothing"
            time.sleep(0.05)
    finally:
        feeder.stop()
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    result = promtool("check", "metrics", stdin=text)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr
    assert "aaren_events_rejected_total{" in text, "the scrape has no labelled rejection series to check"
    declared, sampled = exported(server.metrics_url)
    missing = PROCESS_METRICS - (declared & sampled)
    assert not missing, sorted(missing)


def test_kubernetes_example_relabels_pods(prometheus, tmp_path: Path) -> None:
    """The example's relabel rules on pods as Kubernetes discovery describes them (fed through file_sd, as
    Debian's Prometheus has no Kubernetes discovery): only annotated aaren pods are kept, on their metrics port,
    with namespace and pod labels."""
    pod = {
        "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
        "__meta_kubernetes_pod_annotation_prometheus_io_port": "9464",
        "__meta_kubernetes_pod_annotation_prometheus_io_path": "/metrics",
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "aaren",
        "__meta_kubernetes_namespace": "prod",
        "__meta_kubernetes_pod_name": "aaren-0",
    }
    pods = [
        {"targets": ["10.1.2.3:50051"], "labels": pod},
        {"targets": ["10.1.2.4"], "labels": {**pod, "__meta_kubernetes_pod_name": "aaren-1"}},  # no container port
        {"targets": ["10.1.2.5:50051"], "labels": {**pod, "__meta_kubernetes_pod_annotation_prometheus_io_scrape": ""}},
        {
            "targets": ["10.1.2.6:6379"],
            "labels": {**pod, "__meta_kubernetes_pod_label_app_kubernetes_io_name": "redis"},
        },
    ]
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    job = kubernetes_example()
    job.pop("kubernetes_sd_configs")
    job["file_sd_configs"] = [{"files": [str(tmp_path / "pods.json")]}]
    prom = prometheus({"global": {"scrape_interval": "15s"}, "scrape_configs": [job]})

    def targets() -> dict[str, Any] | None:
        status, body = prom.api("/api/v1/targets")
        assert status == 200, body
        data = body["data"]
        return data if len(data["activeTargets"]) + len(data["droppedTargets"]) == len(pods) else None

    data = wait_for(targets, "the discovered pods", prom)
    active = sorted(((t["labels"], t["scrapeUrl"]) for t in data["activeTargets"]), key=lambda t: t[1])
    assert active == [
        (
            {"instance": "10.1.2.3:9464", "job": "aaren", "namespace": "prod", "pod": "aaren-0"},
            "http://10.1.2.3:9464/metrics",
        ),
        (
            {"instance": "10.1.2.4:9464", "job": "aaren", "namespace": "prod", "pod": "aaren-1"},
            "http://10.1.2.4:9464/metrics",
        ),
    ], active
    assert len(data["droppedTargets"]) == 2


def scraping(metrics_port: int) -> dict[str, Any]:
    """A config that scrapes 127.0.0.1:metrics_port every second as job "aaren" and evaluates the real
    alerts.yml every second."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "aaren", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }


def test_prometheus_scrapes_a_real_server_and_evaluates_every_expression(
    start_server, prometheus, redis_server
) -> None:
    # The server also consumes a log (a few events and one message that is not an event), so that the
    # event-log panels have data too.
    log = f"redis-stream://127.0.0.1:{redis_server.port}/prom-{uuid.uuid4().hex[:8]}"
    with redis.Redis(port=redis_server.port) as client:
        stream = log.rsplit("/", 1)[1]
        for seq in range(1, 4):
            client.xadd(stream, {"session_id": "log-1", "seq": seq, "time": float(seq), "values": "[0.5, 1.0]"})
        client.xadd(stream, {"data": b"not an event"})
    server = start_server(consume_source=log, consume_sink=f"{log}-forecasts")
    prom = prometheus(scraping(server.server.metrics_port))
    wait_for(lambda: values(prom.query('up{job="aaren"}')) == [1.0], "the first scrape", prom)

    feeder = EventFeeder(server.address)
    feeder.start()
    try:
        rate = 'sum(rate(aaren_events_total{job="aaren", outcome="applied"}[30s]))'
        applied = wait_for(lambda: [v for v in values(prom.query(rate)) if v > 0], "a non-zero applied rate", prom)
        assert applied[0] > 0
        p99 = (
            'histogram_quantile(0.99, sum by (le) (rate(aaren_event_latency_seconds_bucket{job="aaren", '
            'phase="total"}[30s])))'
        )
        (latency,) = wait_for(lambda: [v for v in values(prom.query(p99)) if math.isfinite(v)], "a finite p99", prom)
        # Never a time bound: a finite quantile means the samples fell in the finite buckets the server declares.
        assert latency > 0, latency
        count = 'sum(aaren_event_latency_seconds_count{job="aaren", phase="total"})'
        assert wait_for(lambda: [v for v in values(prom.query(count)) if v > 0], "latency samples", prom)

        # Every expression must parse and evaluate (prom.query asserts HTTP 200 and status success) and return
        # data. Dashboard expressions and recording rules must return a non-empty vector as they are. An alert's
        # expression is legitimately empty while nothing is wrong, so it is evaluated as it is (it must parse)
        # and then without its final comparison (`<signal> <op> <number>`): the signal it compares must return
        # data, which catches misspelt metrics, labels and label values that would keep the alert silent forever.
        # Recording rules are also queried by their recorded name: Prometheus has evaluated and stored them.
        checks: list[str] = list(dashboard_exprs())
        for rule in rules():
            expr = rule["expr"].strip()
            if "record" in rule:
                checks += [expr, rule["record"]]
            else:
                prom.query(expr)
                checks.append(ALERT_EXPR.match(expr)["signal"])

        # The one exception: an expression over a labelled counter that has no series until something happens
        # (never_incremented) can only be checked to parse, and that the server exports its metrics.
        declared, sampled = exported(server.metrics_url)
        quiet = [expr for expr in checks if never_incremented(expr, declared, sampled)]
        assert len(quiet) <= 2, quiet  # the auth and limit refusals; everything else must show data

        def empty() -> list[str]:
            return [expr for expr in checks if not prom.query(expr) and expr not in quiet]

        deadline = time.monotonic() + DEADLINE_S
        while missing := empty():
            if time.monotonic() > deadline:
                pytest.fail(f"expressions without data after {DEADLINE_S}s: {missing}\n{prom.log()}")
            time.sleep(0.25)
        for selector, label in template_queries():
            result = prom.query(selector)
            assert result and all(label in sample["metric"] for sample in result), (selector, label, result)
        assert "aaren" in {s["metric"]["job"] for s in prom.query("aaren_events_total")}

        # Prometheus loaded every rule of the file and evaluates each without error.
        expected = {(("alerting" if "alert" in r else "recording"), r.get("alert") or r["record"]) for r in rules()}

        def loaded() -> list[dict[str, Any]]:
            status, body = prom.api("/api/v1/rules")
            assert status == 200 and body["status"] == "success", body
            return [rule for group in body["data"]["groups"] for rule in group["rules"]]

        wait_for(lambda: all(r["health"] == "ok" for r in loaded()) and len(loaded()) == len(expected), "rules", prom)
        got = loaded()
        assert {(r["type"], r["name"]) for r in got} == expected
        assert all(r["health"] == "ok" and not r.get("lastError") for r in got), got
        # A healthy server fires nothing (an inverted comparison would).
        active = [(r["name"], r["state"]) for r in got if r["type"] == "alerting" and r["state"] != "inactive"]
        assert [a for a in active if a[0] not in SPEED_DEPENDENT_ALERTS] == [], active
    finally:
        feeder.stop()
    assert feeder.applied > 0
