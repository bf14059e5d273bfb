"""KServe's Python SDK speaks the Open Inference Protocol: its own gRPC client
(``kserve.InferenceGRPCClient``, from a throwaway venv with ``kserve==0.21.0``; the dev extra's
grpcio-tools pin keeps it out of the dev venv) drives a real aaren server, sequences included,
and gets aaren.v1's numbers for the same events."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import grpc
import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_versions import resolve
from throwaway_venvs import cached_venv, pip

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc

pytestmark = pytest.mark.venvs

KSERVE = "kserve==0.21.0"
PROBE = Path(__file__).with_name("kserve_probe.py")
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_a_users_venv_resolves_aarens_requirements_beside_kserve():
    """pip resolves aaren's runtime requirements together with kserve 0.21.0 (torch aside: a user
    takes its CPU build from PyTorch's own index), each within aaren's own range."""
    runtime = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    requirements = [Requirement(r) for r in runtime if Requirement(r).name != "torch"]
    versions = {canonicalize_name(k): v for k, v in resolve([*map(str, requirements), KSERVE]).items()}
    assert versions["kserve"] == "0.21.0"
    for requirement in requirements:
        version = versions[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(version, prereleases=True), (str(requirement), version)


def _install_kserve(python: Path) -> None:
    done = pip("--python", str(python), "install", "--quiet", KSERVE)
    assert done.returncode == 0, done.stderr[-2000:]


def test_kserves_grpc_client_drives_sequences_with_aaren_v1s_numbers(start_server):
    venv = cached_venv("kserve0.21.0", [KSERVE, "without-base"], _install_kserve)
    srv = start_server(metrics_port=-1, default_top_k=3)
    rng = np.random.default_rng(4)
    events = [(float(t), int(m), v.tolist()) for t, m, v in zip(
        np.cumsum(rng.exponential(2.0, 5)), rng.integers(0, 5, 5), rng.normal(size=(5, 2)).astype(np.float32),
        strict=True)]  # fmt: skip
    requests = [
        {"sequence_id": "k-1", "start": i == 0, "end": i == len(events) - 1, "time": t, "mark": m, "values": v}
        for i, (t, m, v) in enumerate(events)
    ]
    requests.append({**requests[0], "start": False, "end": False})  # after END: the sequence is gone
    job = {"address": srv.address, "model": "tiny", "requests": requests}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK")}
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(PROBE)], input=json.dumps(job), capture_output=True, text=True,
        timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    out = json.loads(done.stdout)
    assert out["kserve"] == "0.21.0" and Path(out["file"]).is_relative_to(venv)
    assert out["server_ready"] and out["model_ready"]
    *answers, late = out["answers"]
    assert "must specify the START flag" in late["error"]
    assert [a["id"] for a in answers] == [f"k{n}" for n in range(len(events))]
    assert [a["outputs"]["SEQ"] for a in answers] == [[1], [2], [3], [4], [5]]

    with grpc.insecure_channel(srv.address) as channel:
        stub = aaren_pb2_grpc.ForecastServiceStub(channel)
        same = [pb.Event(session_id="v1-1", seq=i + 1, time=t, mark=m, values=v) for i, (t, m, v) in enumerate(events)]
        request = pb.StreamRequest(request_id="v1", top_k=3, events=same)
        (response,) = stub.Stream(iter([request]), timeout=20)
    for answer, result in zip(answers, response.results, strict=True):
        f, o = result.forecast, answer["outputs"]
        np.testing.assert_allclose(o["MEAN_GAP"], [f.next_time.mean], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(o["GAP_QUANTILES"], [q.value for q in f.next_time.quantiles], rtol=1e-5, atol=1e-6)
        assert o["TOP_MARKS"] == [m.mark for m in f.marks]
        np.testing.assert_allclose(o["TOP_PROBS"], [m.probability for m in f.marks], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(o["VALUE_MEAN"], [v.mean for v in f.values], rtol=1e-5, atol=1e-6)
