"""scripts/hub_rehearsal.py, the parts that need neither root nor time: its argument checks, its refusal where
cgroups cannot be made (a temporary folder stands for the cgroup root), the staggered lesson order, the check
that the shared data was only read, and the report built from made-up measurements. The rehearsal itself runs
kernels for many minutes under cgroups (its results: docs/hub.md); one real run of one kernel on lesson 00 at
tiny checks the whole path where cgroup v1 can be used, and is skipped, saying why, elsewhere."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def load_script():
    spec = importlib.util.spec_from_file_location("hub_rehearsal", ROOT / "scripts" / "hub_rehearsal.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


hub = load_script()


def test_the_defaults_are_the_hubs_common_limits_and_the_lessons_that_read_data():
    s = hub.parse_settings([], cpu_count=2)
    assert (s.kernels, s.memory_bytes, s.cpus) == (6, 2 * GIB, 1.0)
    assert [name[:2] for name in s.lessons] == ["01", "02", "03", "04", "05", "06", "07"]
    assert all((ROOT / "notebooks" / name).exists() for name in s.lessons)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--kernels", "0"], "--kernels 0: give between 1 and 64"),
        (["--memory-gib", "0"], "--memory-gib 0.0: a memory limit must be positive"),
        (["--cpus", "0"], "--cpus 0.0: give a quota between 0.01 and this machine's 2 CPUs"),
        (["--cpus", "3"], "a larger quota limits nothing"),
        (["--size", "huge"], "--size 'huge': choose one of tiny, small, workshop"),
        (["--lessons", "99"], "--lessons 99: no single notebook numbered so; choose among 00, 01"),
        (["--lessons", "04", "04"], "--lessons 04: named twice"),
        (["--sample-s", "0"], "--cell-timeout and --sample-s must be positive"),
    ],
)
def test_a_wrong_argument_exits_naming_it(argv, said, capsys):
    with pytest.raises(SystemExit) as stop:
        hub.parse_settings(argv, cpu_count=2)
    assert stop.value.code == 2 and said in capsys.readouterr().err


def test_kernel_k_starts_at_lesson_k_mod_n_and_goes_round():
    lessons = ("01", "02", "03")
    assert hub.lesson_order(lessons, 0) == ["01", "02", "03"]
    assert hub.lesson_order(lessons, 2) == ["03", "01", "02"]
    assert hub.lesson_order(lessons, 4) == ["02", "03", "01"]


def v1_tree(root: Path, controllers=("memory", "cpu")) -> Path:
    """What a cgroup v1 root looks like from outside: a folder per controller holding its files."""
    files = {"memory": "memory.limit_in_bytes", "cpu": "cpu.cfs_quota_us"}
    for name in controllers:
        (root / name).mkdir(parents=True)
        (root / name / files[name]).write_text("0\n")
    return root


def test_refuses_without_root_and_says_to_use_sudo(tmp_path):
    said = hub.cgroup_problem(v1_tree(tmp_path), euid=1000)
    assert "needs root" in said and "sudo" in said


def test_refuses_cgroup_v2_only_and_says_what_would_work(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    said = hub.cgroup_problem(tmp_path, euid=0)
    assert "cgroup v2 only" in said and "systemd.unified_cgroup_hierarchy=0" in said and "MemoryMax=2G" in said


def test_refuses_a_missing_controller_with_the_mount_command(tmp_path):
    said = hub.cgroup_problem(v1_tree(tmp_path, ("memory",)), euid=0)
    assert "controller(s) cpu are not mounted" in said and f"mount -t cgroup -o cpu cgroup {tmp_path}/cpu" in said


def test_refuses_a_folder_that_is_not_a_cgroup_file_system_and_leaves_nothing_behind(tmp_path):
    root = v1_tree(tmp_path)
    said = hub.cgroup_problem(root, euid=0)
    assert "is not a cgroup file system: a new directory there gets no memory.limit_in_bytes" in said
    assert sorted(p.name for p in (root / "memory").iterdir()) == ["memory.limit_in_bytes"]  # the probe is gone


def test_refuses_a_read_only_cgroup_file_system(tmp_path, monkeypatch):
    def read_only(path, *args):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    root = v1_tree(tmp_path)
    monkeypatch.setattr(hub.os, "mkdir", read_only)
    said = hub.cgroup_problem(root, euid=0)
    assert "cannot create a cgroup" in said and "Read-only file system" in said and "--privileged" in said


def test_the_command_line_refuses_and_exits_2_before_starting_anything(tmp_path, capsys):
    code = hub.main(["--cgroup-root", str(v1_tree(tmp_path)), "--kernels", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("hub_rehearsal: cannot rehearse: ")
    assert not list(tmp_path.glob("**/kernel-*"))


def test_incomplete_shared_data_is_refused_with_the_command_that_makes_it(tmp_path):
    folder = tmp_path / "small"
    (folder / "train.zarr").mkdir(parents=True)
    said = hub.data_problem(folder)
    assert "not complete (no .complete, archive.zarr, era5_like/.complete)" in said and "make-data --size small" in said


def test_shared_data_without_lesson_08s_files_is_incomplete_as_make_data_writes_them(tmp_path):
    """Lesson 08 once wrote its ERA5-like files into the shared data on first use: on a hub that folder is
    read-only, and in CI the lesson changed data/tiny while this file's real run compared it before and after.
    make-data writes them now, and the rehearsal asks for them under the marker make-data leaves."""
    from zarrtorch.course import era5_like

    folder = tmp_path / "tiny"
    for name in ("archive.zarr", "train.zarr", "era5_like"):
        (folder / name).mkdir(parents=True)
    (folder / ".complete").write_text("{}")
    said = hub.data_problem(folder)
    assert f"not complete (no era5_like/{era5_like.MARKER})" in said and "make-data --size tiny" in said
    (folder / "era5_like" / era5_like.MARKER).write_text("{}")
    assert hub.data_problem(folder) is None


def test_the_data_check_finds_a_file_added_removed_or_rewritten(tmp_path):
    (tmp_path / "a").write_text("1")
    (tmp_path / "b").write_text("2")
    before = hub.snapshot(tmp_path)
    assert hub.changes(before, hub.snapshot(tmp_path)) == []
    (tmp_path / "a").write_text("longer")
    (tmp_path / "b").unlink()
    (tmp_path / "c").write_text("3")
    assert hub.changes(before, hub.snapshot(tmp_path)) == ["added c", "removed b", "modified a"]


def test_the_data_check_leaves_out_the_single_user_scratch_folder(tmp_path):
    """The rehearsal of 2026-11-28 failed on "modified scratch": another user of the machine ran a lesson on
    the same data folder, whose scratch/ is a single-user machine's writing place; the kernels write their own."""
    (tmp_path / "train.zarr").mkdir()
    (tmp_path / "scratch").mkdir()
    before = hub.snapshot(tmp_path)
    (tmp_path / "scratch" / "lesson01").mkdir()
    (tmp_path / "train.zarr" / "x").write_text("1")
    assert hub.changes(before, hub.snapshot(tmp_path)) == ["added train.zarr/x", "modified train.zarr"]


def test_processes_are_named_from_their_command_lines():
    py = "/venv/bin/python"
    assert hub.process_role([py, "-m", "ipykernel_launcher", "-f", "k.json"]) == "forked worker"
    assert hub.process_role([py, "-c", "from multiprocessing.spawn import spawn_main"]) == "spawned worker"
    assert hub.process_role([py, "-m", "torch.distributed.run", "--nproc-per-node", "2"]) == "torchrun"
    assert hub.process_role([py, "-u", "-m", "zarrtorch", "train", "--epochs", "1"]) == "training rank"
    assert hub.process_role([py, "-m", "zarrtorch.course.ddp_demo", "--split", "naive"]) == "ddp_demo"


def record(lesson="04_streaming.ipynb", start=100.0, end=200.0, oom_kill=0, status="ok"):
    """A lesson's record as a kernel's client writes it: cells 1 (100-150 s) and 3 (150-190 s) ran."""
    deltas = {"failcnt": 7, "oom_kill": oom_kill, "throttled_ns": 12 * 10**9, "cpu_ns": 80 * 10**9}
    cells = [[1, 100.0, 150.0], [3, 150.0, 190.0]]
    return {
        "lesson": lesson,
        "start": start,
        "end": end,
        "status": status,
        "peak_bytes": 2 * GIB - 4096,
        "deltas": deltas,
        "cells": cells,
    }


def test_a_lessons_peak_is_found_in_its_samples_with_the_cell_and_processes_then():
    samples = [
        hub.Sample(90.0, GIB, 3 * GIB, (("kernel", 3 * GIB),)),  # before the lesson: not its peak
        hub.Sample(120.0, GIB, GIB // 2, (("kernel", GIB // 2),)),
        hub.Sample(160.0, 2 * GIB, GIB + GIB // 2, (("kernel", GIB // 2), ("forked worker", GIB))),
    ]
    r = hub.lesson_result(3, record(), samples)
    assert (r.kernel, r.lesson, r.wall_s, r.peak_anon_bytes, r.peak_cell) == (3, "04", 100.0, GIB + GIB // 2, 3)
    assert r.peak_processes == [("forked worker", GIB), ("kernel", GIB // 2)]
    assert (r.limit_hits, r.oom_kills, r.cpu_s, r.throttled_s) == (7, 0, 80.0, 12.0)


def made_up_rehearsal(oom_kill=0):
    machine = hub.Machine(2, 24 * GIB, (4.0, 3.5, 3.0), [8.0, 10.0], 4000.0, 3000.0, 1800.0)
    r = hub.Rehearsal(
        2,
        2 * GIB,
        1.0,
        "small",
        ["04_streaming.ipynb", "05_training.ipynb"],
        "bind-mounted read-only",
        951,
        [],
        machine,
    )
    r.probes = [hub.Probe(k, 1, 2, 2, 2, 2 * GIB) for k in range(2)]
    samples = [hub.Sample(150.0, GIB, GIB, (("kernel", GIB // 2), ("forked worker", GIB // 4)))]
    for k in range(2):
        for j, lesson in enumerate(r.lessons):
            killed = oom_kill if (k, j) == (1, 0) else 0
            status = "DeadKernelError: Kernel died" if killed else "ok"
            r.results.append(hub.lesson_result(k, record(lesson, oom_kill=killed, status=status), samples))
    return r


def test_the_report_gives_the_load_what_kernels_see_the_data_check_and_one_row_per_kernel_and_lesson():
    r = made_up_rehearsal()
    text = hub.format_report(r)
    assert "2 kernels at once, each limited to 2 GiB and 1 CPU; size `small`; lessons 04 05" in text
    assert "load average before the run 4.0 / 3.5 / 3.0 (1, 5, 15 min), during it 9.0 on average" in text
    assert "3,000 of them the kernels' and 1,000 the rest of the machine's" in text
    assert "`zarrtorch.available_cpus()` = 1 (as its quota says; `os.cpu_count()` 2" in text
    assert "951 files and folders compared before and after (size, modification time): none changed." in text
    row = "| 1 | 05 | 100 | 2.00 | 1.00 | 3 | kernel 0.50, forked worker 0.25 | 7 | 0 | 80 | 12 | ok |"
    assert row in text
    assert "| 0 | 100 s / 1.00 | 100 s / 1.00 |" in text
    assert "No kernel was OOM-killed. Every lesson passed." in text
    assert "The largest anonymous peak: 1.00 GiB (50% of the limit), lesson 04 in kernel 0, cell 3." in text
    assert r.passed()


def test_the_report_names_a_killed_lesson_and_the_run_fails():
    r = made_up_rehearsal(oom_kill=1)
    text = hub.format_report(r)
    assert "| 1 | 100 s / 1.00 KILLED | 100 s / 1.00 |" in text
    assert "OOM KILLED: kernel 1 lesson 04." in text and "FAILED: kernel 1 lesson 04: DeadKernelError" in text
    assert not r.passed()


def test_a_kernel_that_sees_more_cpus_than_its_quota_fails_the_run():
    r = made_up_rehearsal()
    r.probes[1].available_cpus = 2
    assert "Kernels see (differing)" in hub.format_report(r) and not r.passed()


def test_per_kernel_takes_the_first_lessons_of_each_kernels_round_and_must_cover_every_lesson(capsys):
    lessons = ("01", "02", "03")
    assert [hub.lesson_order(lessons, k, 2) for k in range(3)] == [["01", "02"], ["02", "03"], ["03", "01"]]
    s = hub.parse_settings(["--kernels", "6", "--per-kernel", "3"], cpu_count=2)
    assert s.per_kernel == 3
    with pytest.raises(SystemExit):
        hub.parse_settings(["--kernels", "2", "--per-kernel", "3"], cpu_count=2)
    assert "2 kernels x 3 lessons leave some of the 7 lessons unrun; give at least 4" in capsys.readouterr().err


def test_a_client_killed_for_memory_mid_lesson_is_reported_as_oom_killed_not_only_as_died(tmp_path):
    """The OOM killer may pick the client (it is in the kernel's cgroup too): the lesson then has no record,
    and its OOM kill is counted from the cgroup's counter at the lesson's start to the end of the run."""
    r = made_up_rehearsal()
    r.results = [x for x in r.results if x.kernel == 0]
    events = [{"t": 100.0, "event": "lesson-start", "lesson": "04_streaming.ipynb", "counters": {"oom_kill": 2}}]
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    (tmp_path / "client.log").write_text("Killed\n")
    hub.collect(r, 1, tmp_path, [], ["04_streaming.ipynb", "05_training.ipynb"], {"oom_kill": 3})
    dead, never = [x for x in r.results if x.kernel == 1]
    assert (dead.lesson, dead.oom_kills, dead.status) == ("04", 1, "its client died mid-lesson: Killed")
    assert (never.lesson, never.oom_kills) == ("05", 0) and never.status.startswith("not started")
    text = hub.format_report(r)
    assert "| 1 | - / 0.00 KILLED | - / 0.00 FAILED |" in text and "OOM KILLED: kernel 1 lesson 04." in text
    assert not r.passed()


def test_a_killed_runs_leftovers_are_swept_and_a_live_runs_are_kept(tmp_path):
    """A run killed outright (SIGKILL) cannot clean up: the next one removes what its ledger names."""
    dead_group, live_group = tmp_path / "cg-dead", tmp_path / "cg-live"
    for group in (dead_group, live_group):
        group.mkdir()
    ledger = hub.Ledger("zarrtorch-hub-live", tmp_path)
    ledger.note(groups=[live_group])
    record = {"pid": 2**22 + 1, "started": 1, "groups": [str(dead_group)], "mount": None}  # no such process
    (tmp_path / "zarrtorch-hub-dead.json").write_text(json.dumps(record))
    assert hub.sweep_leftovers(tmp_path) == [str(dead_group)]
    assert not dead_group.exists() and live_group.exists() and ledger.path.exists()
    ledger.close()
    assert not ledger.path.exists()


def test_a_bind_mount_of_a_folder_of_the_same_file_system_is_seen_as_a_mount_point():
    """os.path.ismount said no to the run's own read-only bind mount, so it was never unmounted."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    assert hub.is_mount_point(Path(points[0])) and not hub.is_mount_point(ROOT / "scripts")


def real_run_problem() -> str | None:
    if sys.platform != "linux":
        return "cgroups are Linux's"
    problem = hub.cgroup_problem(Path("/sys/fs/cgroup"), os.geteuid())
    return problem or hub.data_problem(ROOT / "data" / "tiny")


@pytest.fixture
def short_tmp():
    """A folder with a short path: a kernel's IPC socket lies under it, and a Unix socket's path has at most
    107 bytes (pytest's tmp_path is too deep: the kernel cannot bind and the client waits)."""
    folder = Path(tempfile.mkdtemp(prefix="hub-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_real_run_of_one_kernel_under_its_limits_passes_and_leaves_nothing_behind(short_tmp):
    """One kernel, lesson 00 at tiny, 1 GiB and 1 CPU: every step for real (cgroups, read-only bind mount,
    probe, report), then no cgroup, mount, ledger or folder of the run is left."""
    problem = real_run_problem()
    if problem:
        pytest.skip(f"a real rehearsal cannot run here: {problem}")
    out = short_tmp / "run.json"
    argv = ["--kernels", "1", "--lessons", "00", "--size", "tiny", "--memory-gib", "1", "--cpus", "1"]
    argv += ["--data-dir", str(ROOT / "data"), "--work-dir", str(short_tmp), "--json", str(out)]
    handlers = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        assert hub.main(argv) == 0
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    run = json.loads(out.read_text())
    assert run["data"].startswith("bind-mounted read-only") and run["data_changes"] == []
    assert [(x["lesson"], x["status"], x["oom_kills"]) for x in run["results"]] == [("00", "ok", 0)]
    assert run["probes"][0]["available_cpus"] == 1 and run["probes"][0]["memory_limit"] == GIB
    assert list(short_tmp.glob("zarrtorch-hub-*")) == []
    assert "zarrtorch-hub-" not in Path("/proc/self/mountinfo").read_text()
    assert not list(hub.LEDGER_DIR.glob("*.json")) or all(
        hub.process_start(json.loads(p.read_text())["pid"]) for p in hub.LEDGER_DIR.glob("*.json")
    )
