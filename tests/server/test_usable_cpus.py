"""``--frontends -1``: the CPUs the process may use (affinity cut to its cgroup's quota), and the layout
they choose; cgroup files as the kernel writes them (v2 ``cpu.max``, v1 ``cpu.cfs_*``), in a folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aaren.server.app import MIN_CPUS_FOR_FRONTENDS, cgroup_cpu_quota, cpus_within, resolve_frontends, usable_cpus


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("files", "membership", "quota"),
    [
        ({"cpu.max": "max 100000\n"}, "0::/\n", None),  # v2, no limit
        ({"cpu.max": "150000 100000\n"}, "0::/\n", 1.5),  # v2, 1.5 CPUs (docker --cpus 1.5)
        ({"kubepods/pod1/cpu.max": "200000 100000\n", "cpu.max": "max 100000\n"}, "0::/kubepods/pod1\n", 2.0),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, "", 3.0),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "", None),  # v1, no limit
        ({}, "", None),  # nothing readable
    ],
)
def test_the_cgroup_quota_is_read_as_the_kernel_writes_it(tmp_path, files, membership, quota):
    root = tmp_path / "cgroup"
    root.mkdir()
    _write(root, files)
    cgroup = tmp_path / "self-cgroup"
    cgroup.write_text(membership)
    assert cgroup_cpu_quota(root, cgroup) == quota


def test_a_quota_cuts_the_affinity_and_the_layout_follows():
    assert cpus_within(64, None) == 64
    assert cpus_within(64, 2.0) == 2  # a 2-CPU container on a 64-core host
    assert cpus_within(64, 1.5) == 2 and cpus_within(1, 4.0) == 1 and cpus_within(8, 0.1) == 1
    assert [resolve_frontends(-1, cpus) for cpus in (1, 2, 3, 4, 9, 64)] == [0, 0, 0, 3, 8, 8]
    assert MIN_CPUS_FOR_FRONTENDS == 4
    assert resolve_frontends(2, cpus=1) == 2 and resolve_frontends(0, cpus=64) == 0  # an explicit count stands


def test_this_machine_counts_its_own_cpus():
    quota = cgroup_cpu_quota()
    assert usable_cpus() == cpus_within(len(os.sched_getaffinity(0)), quota)
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
