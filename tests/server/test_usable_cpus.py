"""``--frontends -1``: the CPUs the process may use (affinity cut to its cgroup's quota), and the layout
they choose; cgroup files as the kernel writes them (v2 ``cpu.max``, v1 ``cpu.cfs_*``), in a folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aaren.server.app import (
    MAX_KERNEL_THREADS,
    MIN_CPUS_FOR_FRONTENDS,
    apply_threads,
    cgroup_cpu_quota,
    cpus_within,
    resolve_frontends,
    resolve_kernel_threads,
    usable_cpus,
)
from aaren.server.settings import ServerSettings
from aaren_core.tasks.event import row_parts


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


def test_the_kernel_threads_are_the_cpus_the_front_ends_leave():
    """``--kernel-threads -1``: one process on 2 CPUs splits a large batch in 2; with front ends beside the core
    (4 CPUs and up by default) the core keeps one CPU, so one thread; at most MAX_KERNEL_THREADS; a count stands."""
    assert MAX_KERNEL_THREADS == 4
    auto = [resolve_kernel_threads(-1, resolve_frontends(-1, cpus), cpus) for cpus in (1, 2, 3, 4, 9, 64)]
    assert auto == [1, 2, 3, 1, 1, 4]
    assert resolve_kernel_threads(-1, 0, cpus=64) == 4 and resolve_kernel_threads(-1, 2, cpus=2) == 1
    assert resolve_kernel_threads(3, 8, cpus=2) == 3
    with pytest.raises(ValueError, match="kernel_threads: expected -1"):
        ServerSettings(kernel_threads=0)
    try:
        apply_threads(ServerSettings(kernel_threads=3, torch_threads=0), frontends=0)
        assert row_parts.threads() == 3
        apply_threads(ServerSettings(torch_threads=0), frontends=0)
        assert row_parts.threads() == min(MAX_KERNEL_THREADS, usable_cpus())
    finally:
        row_parts.set_threads(1)
