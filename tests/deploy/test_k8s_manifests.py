"""The Kubernetes manifests of deploy/k8s, checked without a cluster.

Each kustomization is rendered by the small renderer below (and by ``kubectl kustomize`` where it is
installed, which must agree), every resource validates against the Kubernetes API schemas
(kubernetes-validate, offline, strict), and the pieces fit together: gRPC probes on the gRPC port,
drain time inside the termination grace period, Services and budgets that select the server's pods,
the Secret the pods need but no rendered Secret, real ``aaren serve`` settings only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import jsonpatch
import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate

from aaren.server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SERVER_KUSTOMIZATIONS = ["base", "overlays/dev", "overlays/gpu"]
ALL_KUSTOMIZATIONS = [*SERVER_KUSTOMIZATIONS, "redis"]
SECRET_EXAMPLE = K8S / "redis" / "secret.example.yaml"
SETTINGS = {f"AAREN_{name.upper()}": name for name in ServerSettings.model_fields}
# The oldest Kubernetes the README promises and the newest one kubernetes-validate has schemas for.
KUBERNETES_VERSIONS = ["1.30", kubernetes_validate.major_minor(kubernetes_validate.latest_version())]
# Time the server needs after the drain grace to close its streams and exit.
EXIT_MARGIN_S = 5
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


# A renderer for the part of kustomize these manifests use. It refuses anything else, so a
# kustomization can never use a feature that is silently skipped here.

KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "patches", "images"}


def load_documents(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def render(directory: Path) -> list[dict]:
    """What ``kustomize build directory`` gives: ``resources`` (files, and directories holding a
    kustomization, rendered first), then ``patches`` (RFC 6902 operation files on the resources a
    kind/name target matches), then ``images`` (name -> newName / newTag)."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - KUSTOMIZATION_FIELDS
    if unknown:
        raise ValueError(f"{directory}: kustomization fields this renderer does not implement: {sorted(unknown)}")
    resources: list[dict] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        resources += render(path) if path.is_dir() else load_documents(path)
    for patch in spec.get("patches", []):
        target = patch.get("target", {})
        if set(patch) != {"path", "target"} or not target or set(target) - {"kind", "name"}:
            raise ValueError(f"{directory}: only a path with a kind/name target is implemented: {patch}")
        operations = yaml.safe_load((directory / patch["path"]).read_text())
        matched = [
            i
            for i, resource in enumerate(resources)
            if target.get("kind", resource["kind"]) == resource["kind"]
            and target.get("name", resource["metadata"]["name"]) == resource["metadata"]["name"]
        ]
        if not matched:
            raise ValueError(f"{directory}: patch {patch['path']} matches no resource")
        for i in matched:
            resources[i] = jsonpatch.apply_patch(resources[i], operations)
    for rule in spec.get("images", []):
        if set(rule) - {"name", "newName", "newTag"}:
            raise ValueError(f"{directory}: only name/newName/newTag image rules are implemented: {rule}")
        for resource in resources:
            for container in containers(resource):
                name, tag = split_image(container["image"])
                if name == rule["name"]:
                    name, tag = rule.get("newName", name), rule.get("newTag", tag)
                    container["image"] = f"{name}:{tag}" if tag else name
    return resources


def split_image(image: str) -> tuple[str, str]:
    """``registry:5000/name:tag`` -> (``registry:5000/name``, ``tag``); a port is not a tag."""
    if "@" in image:
        raise ValueError(f"image digests are not implemented: {image}")
    head, _, last = image.rpartition("/")
    name, _, tag = last.partition(":")
    return (f"{head}/{name}" if head else name), tag


def pod_spec(resource: dict) -> dict | None:
    if resource["kind"] not in WORKLOAD_KINDS:
        return None
    return resource["spec"]["template"]["spec"]


def containers(resource: dict) -> list[dict]:
    spec = pod_spec(resource)
    return [] if spec is None else spec.get("initContainers", []) + spec["containers"]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(K8S / name) for name in ALL_KUSTOMIZATIONS}


def find(resources: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [r for r in resources if r["kind"] == kind and name in (None, r["metadata"]["name"])]


def one(resources: list[dict], kind: str, name: str) -> dict:
    matches = find(resources, kind, name)
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def server(resources: list[dict]) -> tuple[dict, dict]:
    """The server's Deployment and its container."""
    deployment = one(resources, "Deployment", "aaren")
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "aaren"]
    return deployment, container


def container_ports(container: dict) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container.get("ports", [])}


def effective_env(resources: list[dict], container: dict) -> dict[str, object]:
    """The container's environment as the kubelet builds it: envFrom ConfigMaps, then env on top.
    Literal values are strings; ``valueFrom`` entries stay dicts."""
    env: dict[str, object] = {}
    for source in container.get("envFrom", []):
        assert set(source) <= {"configMapRef", "prefix"}, f"unexpected envFrom source {source}"
        config_map = one(resources, "ConfigMap", source["configMapRef"]["name"])
        env.update({source.get("prefix", "") + key: value for key, value in config_map.get("data", {}).items()})
    for var in container.get("env", []):
        env[var["name"]] = var["value"] if "value" in var else var["valueFrom"]
    return env


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def workloads_selected(resources: list[dict], selector: dict) -> list[dict]:
    return [
        r
        for r in resources
        if pod_spec(r) is not None and selects(selector, r["spec"]["template"]["metadata"]["labels"])
    ]


def kubernetes_files() -> dict[Path, list[dict]]:
    """Every YAML file under deploy/k8s that holds Kubernetes resources (not kustomizations or patches)."""
    out = {}
    for path in sorted(K8S.rglob("*.yaml")):
        docs = [d for d in load_documents(path) if isinstance(d, dict) and "apiVersion" in d and "kind" in d]
        docs = [d for d in docs if not d["apiVersion"].startswith("kustomize.config.k8s.io/")]
        if docs:
            out[path] = docs
    return out


def schema_error(resource: dict, version: str) -> str | None:
    """Why ``resource`` is not valid Kubernetes ``version`` (strict: no unknown fields), or None."""
    where = f"{resource['kind']}/{resource['metadata']['name']}"
    try:
        kubernetes_validate.validate(resource, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return f"{where}: {'.'.join(str(p) for p in error.path)}: {error.message}"
    except kubernetes_validate.SchemaNotFoundError as error:
        return f"{where}: {error.message}"
    return None


def test_renderer_refuses_what_it_does_not_implement(tmp_path):
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [cm.yaml]\nnamePrefix: dev-\n")
    with pytest.raises(ValueError, match="namePrefix"):
        render(tmp_path)
    (tmp_path / "ops.yaml").write_text("- {op: add, path: /data, value: {}}\n")
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [cm.yaml]\npatches: [{path: ops.yaml, target: {kind: ConfigMap, name: y}}]\n"
    )
    with pytest.raises(ValueError, match="matches no resource"):
        render(tmp_path)


def test_renderer_applies_patches_and_images(tmp_path):
    (tmp_path / "pod.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n"
        "spec: {template: {spec: {containers: [{name: c, image: 'registry:5000/app:1'}, {name: d, image: other}]}}}\n"
    )
    (tmp_path / "ops.yaml").write_text("- {op: add, path: /spec/replicas, value: 3}\n")
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [pod.yaml]\npatches: [{path: ops.yaml, target: {kind: Deployment, name: x}}]\n"
        "images: [{name: 'registry:5000/app', newTag: '2'}]\n"
    )
    (deployment,) = render(tmp_path)
    assert deployment["spec"]["replicas"] == 3
    assert [c["image"] for c in containers(deployment)] == ["registry:5000/app:2", "other"]


@pytest.mark.parametrize("name", ALL_KUSTOMIZATIONS)
def test_rendered_resources_are_the_expected_ones(rendered, name):
    server_kinds = {
        ("ServiceAccount", "aaren"),
        ("ConfigMap", "aaren"),
        ("Deployment", "aaren"),
        ("Service", "aaren"),
        ("Service", "aaren-headless"),
        ("PodDisruptionBudget", "aaren"),
        ("HorizontalPodAutoscaler", "aaren"),
    }
    redis_kinds = {("StatefulSet", "aaren-redis"), ("Service", "aaren-redis")}
    expected = {
        "base": server_kinds,
        "overlays/gpu": server_kinds,
        "overlays/dev": server_kinds | redis_kinds,
        "redis": redis_kinds,
    }[name]
    keys = [(r["kind"], r["metadata"]["name"]) for r in rendered[name]]
    assert len(keys) == len(set(keys)), f"{name} renders a resource twice: {keys}"
    assert set(keys) == expected


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", ALL_KUSTOMIZATIONS)
def test_rendered_resources_validate(rendered, name, version):
    errors = [error for resource in rendered[name] if (error := schema_error(resource, version))]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_file_validates(version):
    files = kubernetes_files()
    assert SECRET_EXAMPLE in files
    errors = [
        f"{path.relative_to(K8S)}: {error}"
        for path, docs in files.items()
        for resource in docs
        if (error := schema_error(resource, version))
    ]
    assert not errors, "\n".join(errors)


def test_every_file_is_used_and_the_example_secret_is_not():
    """Each resource and patch file is named by a kustomization (a forgotten file would never be
    applied), except secret.example.yaml, which no kustomization may name."""
    referenced: set[Path] = set()
    for kustomization in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        entries = spec.get("resources", []) + [patch["path"] for patch in spec.get("patches", [])]
        for entry in entries:
            path = (kustomization.parent / entry).resolve()
            assert path.exists(), f"{kustomization} names {entry}, which does not exist"
            referenced.add(path)
    yaml_files = {p.resolve() for p in K8S.rglob("*.y*ml") if p.name != "kustomization.yaml"}
    assert SECRET_EXAMPLE.resolve() not in referenced
    assert yaml_files - referenced == {SECRET_EXAMPLE.resolve()}


@pytest.mark.parametrize("name", SERVER_KUSTOMIZATIONS)
def test_probes_are_grpc_health_checks_on_the_grpc_port(rendered, name):
    _, container = server(rendered[name])
    grpc_port = container_ports(container)["grpc"]
    assert grpc_port == 50051
    tolerance = {}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        assert probe is not None, f"no {kind}"
        handlers = {"grpc", "httpGet", "tcpSocket", "exec"} & set(probe)
        assert handlers == {"grpc"}, f"{kind} must be a native gRPC health check, not {handlers}"
        assert probe["grpc"]["port"] == grpc_port
        assert probe["grpc"].get("service", "") in ("", "aaren.v1.ForecastService")
        tolerance[kind] = probe.get("failureThreshold", 3) * probe.get("periodSeconds", 10)
    # Readiness follows NOT_SERVING quickly; liveness outlasts a Redis outage of minutes, during which
    # every pod is NOT_SERVING and restarting them would not help.
    assert tolerance["readinessProbe"] <= 15
    assert tolerance["livenessProbe"] >= 120
    assert tolerance["startupProbe"] >= 60


@pytest.mark.parametrize("name", SERVER_KUSTOMIZATIONS)
def test_drain_fits_in_the_termination_grace_period(rendered, name):
    deployment, container = server(rendered[name])
    pre_stop = container["lifecycle"]["preStop"]
    if "sleep" in pre_stop:
        sleep_s = float(pre_stop["sleep"]["seconds"])
    else:
        match = re.fullmatch(r"sleep (\d+(?:\.\d+)?)", pre_stop["exec"]["command"][-1])
        assert match, f"preStop should only sleep: {pre_stop}"
        sleep_s = float(match.group(1))
    assert sleep_s >= 1, "the preStop sleep lets endpoint removal spread before the drain starts"
    env = effective_env(rendered[name], container)
    drain_s = float(env.get("AAREN_DRAIN_GRACE_S", ServerSettings.model_fields["drain_grace_s"].default))
    grace_s = deployment["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    assert grace_s >= sleep_s + drain_s + EXIT_MARGIN_S, (grace_s, sleep_s, drain_s)


@pytest.mark.parametrize("name", SERVER_KUSTOMIZATIONS)
def test_the_server_listens_where_ports_and_scrapers_expect(rendered, name):
    deployment, container = server(rendered[name])
    ports = container_ports(container)
    env = effective_env(rendered[name], container)
    assert env["AAREN_ADDRESS"] == f"0.0.0.0:{ports['grpc']}"
    assert env["AAREN_METRICS_ADDRESS"] == "0.0.0.0"
    assert int(env["AAREN_METRICS_PORT"]) == ports["metrics"] == 9464
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(ports["metrics"])
    assert annotations["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize("name", ALL_KUSTOMIZATIONS)
def test_each_service_selects_one_workload_and_its_named_ports(rendered, name):
    resources = rendered[name]
    for service in find(resources, "Service"):
        selected = workloads_selected(resources, service["spec"]["selector"])
        assert len(selected) == 1, f"Service {service['metadata']['name']} selects {len(selected)} workloads"
        ports = {n: p for c in containers(selected[0]) for n, p in container_ports(c).items()}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports or port["targetPort"] in ports.values(), port
    for workload in find(resources, "StatefulSet"):
        governing = one(resources, "Service", workload["spec"]["serviceName"])
        assert governing["spec"].get("clusterIP") == "None"


@pytest.mark.parametrize("name", SERVER_KUSTOMIZATIONS)
def test_server_services(rendered, name):
    resources = rendered[name]
    deployment, _ = server(resources)
    for service_name in ("aaren", "aaren-headless"):
        service = one(resources, "Service", service_name)
        assert workloads_selected(resources, service["spec"]["selector"]) == [deployment]
        grpc = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
        assert grpc == [{"name": "grpc", "port": 50051, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"}]
    assert one(resources, "Service", "aaren-headless")["spec"]["clusterIP"] == "None"
    cluster_ip = one(resources, "Service", "aaren")["spec"]
    assert cluster_ip.get("type", "ClusterIP") == "ClusterIP" and "clusterIP" not in cluster_ip
    assert {p["name"]: p["targetPort"] for p in cluster_ip["ports"]}["metrics"] == "metrics"


@pytest.mark.parametrize("name", SERVER_KUSTOMIZATIONS)
def test_disruption_budget_and_autoscaler_target_the_deployment(rendered, name):
    resources = rendered[name]
    deployment, container = server(resources)
    pdb = one(resources, "PodDisruptionBudget", "aaren")
    assert workloads_selected(resources, pdb["spec"]["selector"]["matchLabels"]) == [deployment]
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert pdb["spec"]["minAvailable"] == 1 < deployment["spec"]["replicas"]
    hpa = one(resources, "HorizontalPodAutoscaler", "aaren")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "aaren"}
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu" and metric["resource"]["target"]["type"] == "Utilization"
    assert "cpu" in container["resources"]["requests"], "CPU utilization is measured against the request"


@pytest.mark.parametrize("name", ALL_KUSTOMIZATIONS)
def test_pods_run_locked_down(rendered, name):
    resources = rendered[name]
    for workload in filter(pod_spec, resources):
        spec = pod_spec(workload)
        where = workload["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec.get("automountServiceAccountToken") is False, where
        mounts_from = {v["name"]: v for v in spec.get("volumes", [])}
        for container in containers(workload):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in context["capabilities"], where
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in mounts_from or mount["name"] in {
                    t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])
                }, f"{where}: mount {mount['name']} has no volume"
    if name in SERVER_KUSTOMIZATIONS:
        deployment, container = server(resources)
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsUser"] == 10001, "the image's user"
        account = one(resources, "ServiceAccount", spec["serviceAccountName"])
        assert account["automountServiceAccountToken"] is False
        tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert len(tmp) == 1 and "emptyDir" in {v["name"]: v for v in spec["volumes"]}[tmp[0]["name"]]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        spread = [c["labelSelector"]["matchLabels"] for c in spec.get("topologySpreadConstraints", [])]
        anti = spec.get("affinity", {}).get("podAntiAffinity")
        assert anti or any(selects(s, labels) for s in spread), "replicas should spread over nodes"


@pytest.mark.parametrize("name", ALL_KUSTOMIZATIONS)
def test_secrets_are_referenced_never_rendered(rendered, name):
    """No overlay carries a Secret; every Secret key the pods need is one secret.example.yaml documents,
    or it is optional."""
    resources = rendered[name]
    assert find(resources, "Secret") == []
    (example,) = load_documents(SECRET_EXAMPLE)
    documented = {(example["metadata"]["name"], key) for key in example["stringData"]}
    for workload in filter(pod_spec, resources):
        for container in containers(workload):
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    assert (ref["name"], ref["key"]) in documented, f"{var['name']} needs {ref}"
        for volume in pod_spec(workload).get("volumes", []):
            if "secret" in volume:
                assert volume["secret"].get("optional") is True, f"volume {volume['name']} needs a Secret"
    if name in SERVER_KUSTOMIZATIONS:
        _, container = server(resources)
        store_url = effective_env(resources, container)["AAREN_STORE_URL"]
        assert store_url == {"secretKeyRef": {"name": "aaren-redis", "key": "store-url"}}


def test_the_example_secret_points_at_the_bundled_redis(rendered):
    (example,) = load_documents(SECRET_EXAMPLE)
    assert example["metadata"]["name"] == "aaren-redis" and "data" not in example
    url = urlparse(example["stringData"]["store-url"])
    resources = rendered["overlays/dev"]
    service = one(resources, "Service", url.hostname)
    assert url.scheme == "redis"
    assert url.password == example["stringData"]["password"]
    assert url.port in {p["port"] for p in service["spec"]["ports"]}
    assert workloads_selected(resources, service["spec"]["selector"]) == [one(resources, "StatefulSet", "aaren-redis")]


def bytes_of(quantity: str) -> int:
    """A Redis size (``512mb``) or a Kubernetes quantity (``1Gi``), in bytes."""
    number, unit = re.fullmatch(r"(\d+)([a-zA-Z]*)", quantity).groups()
    scale = {"": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
    return int(number) * scale[unit]


def test_redis_is_durable_bounded_and_password_protected(rendered):
    resources = rendered["redis"]
    statefulset = one(resources, "StatefulSet", "aaren-redis")
    assert statefulset["spec"]["replicas"] == 1
    (container,) = containers(statefulset)
    args = container["args"]
    assert all(isinstance(a, str) for a in args)
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "always"
    assert options["--maxmemory-policy"] == "noeviction"
    assert bytes_of(options["--maxmemory"]) < bytes_of(container["resources"]["limits"]["memory"])
    variable = re.fullmatch(r"\$\((\w+)\)", options["--requirepass"]).group(1)
    env = {var["name"]: var for var in container["env"]}
    assert env[variable]["valueFrom"]["secretKeyRef"] == {"name": "aaren-redis", "key": "password"}
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    (data,) = [m for m in container["volumeMounts"] if m["mountPath"] == options["--dir"]]
    assert data["name"] == claim["metadata"]["name"]


@pytest.mark.parametrize("name", SERVER_KUSTOMIZATIONS)
def test_settings_are_real_and_parse(rendered, name, monkeypatch):
    resources = rendered[name]
    _, container = server(resources)
    config_map = one(resources, "ConfigMap", "aaren")
    assert all(key.startswith("AAREN_") for key in config_map["data"]), "other keys would be ignored"
    env = effective_env(resources, container)
    unknown = sorted(key for key in env if key.startswith("AAREN_") and key not in SETTINGS)
    assert not unknown, f"not settings of aaren serve: {unknown}"
    for key in [key for key in os.environ if key.startswith("AAREN_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if isinstance(value, str):
            monkeypatch.setenv(key, value)
    settings = ServerSettings()
    assert settings.address == "0.0.0.0:50051"
    assert settings.device == ("cuda" if name == "overlays/gpu" else "cpu")


@pytest.mark.parametrize("name", SERVER_KUSTOMIZATIONS)
def test_only_the_gpu_overlay_asks_for_a_gpu(rendered, name):
    resources = rendered[name]
    deployment, container = server(resources)
    spec = deployment["spec"]["template"]["spec"]
    device = effective_env(resources, container)["AAREN_DEVICE"]
    gpu_resources = [
        c["name"]
        for r in resources
        for c in containers(r)
        for key in ("limits", "requests")
        if "nvidia.com/gpu" in c.get("resources", {}).get(key, {})
    ]
    if name == "overlays/gpu":
        assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == "1"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule" for t in spec["tolerations"])
        assert device == "cuda"
        assert container["image"] == "aaren:latest-cuda"
    else:
        assert gpu_resources == [] and "nodeSelector" not in spec
        assert device == "cpu"
        assert container["image"] == "aaren:latest"


@pytest.mark.parametrize("name", ALL_KUSTOMIZATIONS)
def test_renderer_agrees_with_kubectl_kustomize(rendered, name):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the renderer is not compared with kustomize itself")
    result = subprocess.run([kubectl, "kustomize", str(K8S / name)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    theirs = {(r["kind"], r["metadata"]["name"]): r for r in yaml.safe_load_all(result.stdout) if r}
    ours = {(r["kind"], r["metadata"]["name"]): r for r in rendered[name]}
    assert sorted(ours) == sorted(theirs)
    for key, resource in ours.items():
        assert resource == theirs[key], f"{key} differs from kubectl kustomize"
