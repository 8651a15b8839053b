"""A process's CPUs and memory under a control group's limits (a container, a Kubernetes pod, a JupyterHub
kernel): the CPU quota caps the CPUs counted from the affinity mask, the memory limit is read for the loader's
budget, and every file is read from a fixture tree standing for ``/``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import zarrtorch
from zarrtorch import ReadPlan, ZarrIterableDataset, available_cpus, prepare_zarr
from zarrtorch._util import cgroup
from zarrtorch._util.cgroup import cgroup_cpu_limit, cgroup_memory_limit

AFFINITY = len(os.sched_getaffinity(0))
GiB = 2**30
V2_MOUNT = "31 23 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"


def cgroup_tree(root: Path, membership: str, mountinfo: str | None, files: dict[str, str | bytes]) -> Path:
    """A fixture tree under ``root``: /proc/self/cgroup, /proc/self/mountinfo (unless None) and cgroup files."""
    proc = root / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(membership)
    if mountinfo is not None:
        (proc / "mountinfo").write_text(mountinfo)
    for name, content in files.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


def v2(root: Path, files: dict[str, str | bytes], path: str = "/kubepods/pod1/kernel") -> Path:
    """Cgroup v2, this process in ``path``; ``files`` relative to the unified hierarchy's mount."""
    return cgroup_tree(root, f"0::{path}\n", V2_MOUNT, {f"/sys/fs/cgroup/{k}": v for k, v in files.items()})


def test_v2_quota_caps_the_cpus_and_rounds_a_fraction_up(tmp_path):
    """``cpu.max`` of 1.5 CPUs is 2 CPUs (a thread per started CPU); the memory limit is read in bytes."""
    root = v2(
        tmp_path,
        {"kubepods/pod1/kernel/cpu.max": "150000 100000\n", "kubepods/pod1/kernel/memory.max": f"{4 * GiB}\n"},
    )
    assert cgroup_cpu_limit(root) == 2 and cgroup_memory_limit(root) == 4 * GiB
    assert available_cpus(root) == min(AFFINITY, 2)


def test_a_kernel_limited_to_2_cpus_on_a_64_core_node_decodes_in_2_threads(tmp_path, monkeypatch):
    """The JupyterHub pod: 64 CPUs in the affinity mask, a quota of 2. Its decode threads (and with them the
    requests in flight and the memory they hold) are sized for 2 CPUs, not 64 (63 threads, before)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    root = v2(tmp_path, {"kubepods/pod1/kernel/cpu.max": "200000 100000\n"})
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", str(root))
    assert available_cpus() == 2
    store = tmp_path / "data.zarr"
    # chunks of 128 KiB: a local store of chunks of 64 KiB or less is decoded in one thread whatever the CPUs
    prepare_zarr({"x": np.zeros((40, 8192), np.float32)}, store, chunk_rows=4, progress=False)
    ds = ZarrIterableDataset(store)
    assert ReadPlan.of(ds, 0).decode_threads == 2 and ReadPlan.of(ds, 2).decode_threads == 1
    assert ReadPlan.of(ds, 0).most_in_flight == 3


def test_v2_max_is_no_limit(tmp_path):
    root = v2(tmp_path, {"kubepods/pod1/kernel/cpu.max": "max 100000\n", "kubepods/pod1/kernel/memory.max": "max\n"})
    assert cgroup_cpu_limit(root) is None and cgroup_memory_limit(root) is None
    assert available_cpus(root) == AFFINITY


def test_v2_a_parents_limit_applies_to_its_children(tmp_path):
    """A pod's limit is on the pod's cgroup, the kernel's own says ``max``: the tightest on the way up counts."""
    root = v2(
        tmp_path,
        {
            "kubepods/pod1/kernel/cpu.max": "max 100000\n",
            "kubepods/pod1/kernel/memory.max": "max\n",
            "kubepods/pod1/cpu.max": "100000 100000\n",
            "kubepods/pod1/memory.max": f"{2 * GiB}\n",
            "kubepods/cpu.max": "400000 100000\n",
            "kubepods/memory.max": f"{8 * GiB}\n",
        },
    )
    assert cgroup_cpu_limit(root) == 1 and cgroup_memory_limit(root) == 2 * GiB
    assert available_cpus(root) == 1


def test_v2_without_mountinfo_looks_in_sys_fs_cgroup(tmp_path):
    root = cgroup_tree(tmp_path, "0::/user.slice\n", None, {"/sys/fs/cgroup/user.slice/cpu.max": "100000 100000"})
    assert cgroup_cpu_limit(root) == 1


V1_MOUNTS = (
    "32 31 0:29 {root} /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 {root} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
V1_MEMBERSHIP = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/docker/abc\n"


@pytest.mark.parametrize("mount_root", ["/", "/docker/abc"])
def test_v1_quota_and_memory_limit(tmp_path, mount_root):
    """cgroup v1 (docker without a cgroup namespace, as on this machine): the cpu controller's cfs quota over
    its period, the memory controller's limit. The mount shows the whole hierarchy ("/": the files are under the
    process's path) or only the container's own cgroup (its root is the process's path: the files are at the
    mount point)."""
    inside = "docker/abc/" if mount_root == "/" else ""
    root = cgroup_tree(
        tmp_path,
        V1_MEMBERSHIP,
        V1_MOUNTS.format(root=mount_root),
        {
            f"/sys/fs/cgroup/cpu,cpuacct/{inside}cpu.cfs_quota_us": "50000\n",
            f"/sys/fs/cgroup/cpu,cpuacct/{inside}cpu.cfs_period_us": "100000\n",
            f"/sys/fs/cgroup/memory/{inside}memory.limit_in_bytes": f"{3 * GiB}\n",
        },
    )
    assert cgroup_cpu_limit(root) == 1 and cgroup_memory_limit(root) == 3 * GiB
    assert available_cpus(root) == 1


def test_v1_minus_one_and_the_page_rounded_maximum_are_no_limit(tmp_path):
    root = cgroup_tree(
        tmp_path,
        V1_MEMBERSHIP,
        V1_MOUNTS.format(root="/"),
        {
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1\n",
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "9223372036854771712\n",
        },
    )
    assert cgroup_cpu_limit(root) is None and cgroup_memory_limit(root) is None
    assert available_cpus(root) == AFFINITY


def test_no_cgroup_files_at_all_is_no_limit(tmp_path):
    """Not Linux, a sandbox without /proc: the affinity mask alone, as before."""
    assert cgroup_cpu_limit(tmp_path) is None and cgroup_memory_limit(tmp_path) is None
    assert available_cpus(tmp_path) == AFFINITY


@pytest.mark.parametrize(
    "cpu_max, memory_max",
    [
        ("banana", "lots"),
        ("0 100000", "0"),
        ("100000 0", "-5"),
        ("-5 100000", "1e9"),
        ("100000", ""),
        (b"\xff\xfe\x00", b"\xff\xfe\x00"),
    ],
)
def test_garbage_is_ignored_and_a_sound_parent_still_counts(tmp_path, cpu_max, memory_max):
    root = v2(
        tmp_path,
        {
            "kubepods/pod1/kernel/cpu.max": cpu_max,
            "kubepods/pod1/kernel/memory.max": memory_max,
            "kubepods/pod1/cpu.max": "300000 100000",
            "kubepods/pod1/memory.max": str(GiB),
        },
    )
    assert cgroup_cpu_limit(root) == 3 and cgroup_memory_limit(root) == GiB


@pytest.mark.parametrize(
    "membership, mountinfo",
    [
        ("garbage\n::::\n0::/../../../etc\n", V2_MOUNT),
        ("0::/kubepods/pod1/kernel\n", "nonsense\n- - -\n1 2 3\n"),
        (b"\xff\xfe", b"\x00\x01"),
        ("", ""),
    ],
)
def test_garbage_membership_or_mounts_are_ignored(tmp_path, membership, mountinfo):
    """Unreadable /proc/self files never raise: a path that climbs out of its hierarchy ("..") is not followed,
    and nothing found is no limit."""
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    for name, content in (("cgroup", membership), ("mountinfo", mountinfo)):
        (proc / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "cpu.max").write_text("100000 100000")
    assert cgroup_cpu_limit(tmp_path) is None and cgroup_memory_limit(tmp_path) is None
    assert available_cpus(tmp_path) == AFFINITY


def test_the_real_machine_has_at_least_one_cpu_and_no_more_than_its_affinity():
    assert 1 <= available_cpus() <= AFFINITY
    limit = cgroup_memory_limit()
    assert limit is None or limit > 0


def test_a_forked_child_sees_the_same_limits(tmp_path, monkeypatch):
    """The read is cached per process; a fork inherits the cache, which stays right because a fork stays in its
    parent's cgroup."""
    root = v2(tmp_path, {"kubepods/pod1/kernel/cpu.max": "100000 100000"})
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", str(root))
    assert available_cpus() == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, str(available_cpus()).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"1"


def test_every_cpu_count_goes_through_available_cpus():
    """Threads sized from CPUs anywhere in the package (the core and the course) come from one function, which
    counts the quota: no other reads the affinity mask or the machine's CPU count."""
    package = Path(zarrtorch.__file__).parent
    allowed = {package / "_util" / "process.py"}
    pattern = re.compile(r"os\.cpu_count|sched_getaffinity|multiprocessing\.cpu_count|psutil\.cpu_count")
    offenders = [str(p) for p in package.rglob("*.py") if p not in allowed and pattern.search(p.read_text())]
    assert not offenders, offenders
