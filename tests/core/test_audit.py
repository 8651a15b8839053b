"""zarrtorch.audit: the report agrees with what the loader really yields; the CLI's exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

import zarrtorch.cli
from zarrtorch import AuditReport, Windows, ZarrDataLoader, ZarrIterableDataset, audit, prepare_zarr

ROWS, CHUNK = 437, 20


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("audit") / "data.zarr"
    prepare_zarr({"x": np.arange(ROWS, dtype=np.float32)}, path, chunk_rows=CHUNK, progress=False)
    return path


def yielded(store, world, workers, drop_last, *, state=None, stop_after=None):
    out = []
    for rank in range(world):
        loader = ZarrDataLoader(
            ZarrIterableDataset(store, seed=4, buffer_chunks=2, return_index=True),
            batch_size=16,
            drop_last=drop_last,
            num_workers=workers,
            rank=rank,
            world_size=world,
        )
        loader.set_epoch(1)
        if state is not None:
            loader.load_state_dict(state)
        rows = []
        for batch in loader:
            rows.append(batch["index"].numpy())
            if len(rows) == stop_after:
                break
        out.append((rows, loader))
    return out


@pytest.mark.parametrize("drop_last", [True, False])
def test_report_matches_the_loader(store, drop_last):
    report = audit(
        store, world_size=3, num_workers=2, batch_size=16, drop_last=drop_last, seed=4, epoch=1, buffer_chunks=2
    )
    runs = yielded(store, 3, 2, drop_last)
    assert report.batches_per_rank == [len(rows) for rows, _ in runs]
    read = np.concatenate([b for rows, _ in runs for b in rows])
    assert report.rows_read == len(read)
    assert report.rows_left_out == ROWS - len(np.unique(read))
    assert report.padding_rows == len(read) - len(np.unique(read))
    assert report.duplicates == 0 and report.ok
    assert (report.rows_left_out > 0) == drop_last and (report.padding_rows > 0) == (not drop_last)


def test_report_of_a_resume_matches_the_resumed_loader(store):
    first = yielded(store, 2, 1, False, stop_after=4)
    state = first[0][1].state_dict()
    report = audit(store, world_size=3, num_workers=0, batch_size=1, state=state)  # settings come from the state
    rest = yielded(store, 3, 0, False, state=state)
    assert report.batches_per_rank == [len(rows) for rows, _ in rest]
    assert report.rows_consumed_before == 2 * 4 * 16
    assert report.rows_left_out == 0 and report.duplicates == 0 and report.ok


def test_ok_is_false_when_ranks_disagree():
    fields = dict(
        epoch=0,
        world_size=2,
        num_workers=0,
        batch_size=8,
        drop_last=True,
        rows=100,
        rows_consumed_before=0,
        rows_read=96,
        rows_left_out=4,
        padding_rows=0,
        duplicates=0,
        chunk_diversity=1.0,
        order_correlation=0.0,
    )
    assert AuditReport(batches_per_rank=[6, 6], **fields).ok
    assert not AuditReport(batches_per_rank=[7, 5], **fields).ok
    assert "UNEQUAL [7, 5]" in AuditReport(batches_per_rank=[7, 5], **fields).summary()
    assert not AuditReport(batches_per_rank=[6, 6], **{**fields, "duplicates": 1}).ok


def test_cli(store, tmp_path):
    run = [sys.executable, "-m", "zarrtorch", "audit", str(store)]
    ok = subprocess.run(run + ["--world-size", "2", "--batch-size", "16", "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["batches_per_rank"] == [13, 13]
    loader = yielded(store, 2, 0, True, stop_after=2)[0][1]
    state = tmp_path / "state.json"
    saved = loader.state_dict()
    state.write_text(json.dumps({**saved, "spec": {**saved["spec"], "rows": ROWS + 1}}))
    bad = subprocess.run(run + ["--world-size", "3", "--state", str(state)], capture_output=True, text=True)
    assert bad.returncode == 2 and "the state was saved on 438 rows" in bad.stderr


def test_memory_per_node_is_every_ranks_loader_and_refuses_a_node_too_small(store):
    """The loader memory of a node's ranks is ranks x loader_memory of one rank's loader (its workers included);
    a node that cannot hold it makes the report a problem, and the CLI says what to change."""
    from zarrtorch import loader_memory

    one = loader_memory(ZarrDataLoader(ZarrIterableDataset(store, seed=0), batch_size=16, num_workers=2)).total
    report = audit(store, world_size=8, batch_size=16, num_workers=2, ranks_per_node=4, node_memory_gib=64)
    assert report.loader_bytes_per_rank == one and report.loader_bytes_per_node == 4 * one
    assert report.fits and report.ok and "left on the node" in report.summary()
    too_small_gib = 3 * one / 2**30
    small = audit(store, world_size=8, batch_size=16, num_workers=2, ranks_per_node=4, node_memory_gib=too_small_gib)
    assert not small.fits and not small.ok and "DOES NOT FIT" in small.summary()
    run = [sys.executable, "-m", "zarrtorch", "audit", str(store), "--world-size", "8", "--batch-size", "16"]
    run += ["--num-workers", "2", "--ranks-per-node", "4", "--node-memory-gib", f"{too_small_gib}", "--json"]
    cli = subprocess.run(run, capture_output=True, text=True)
    assert cli.returncode == 1 and json.loads(cli.stdout)["fits"] is False
    assert audit(store, world_size=2, batch_size=16).fits  # no node given: nothing to refuse


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--world-size", "0", "--batch-size", "4"], "--world-size must be >= 1, got 0"),
        (["--world-size", "2", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--world-size", "2", "--batch-size", "4", "--node-memory-gib", "nan"], "--node-memory-gib must be"),
        (["--world-size", "2", "--state", "{cut}"], "is not valid JSON .*cut short or damaged"),
        (["--world-size", "2", "--state", "{junk}"], "neither a JSON state .* nor a readable PyTorch"),
        (["--world-size", "2", "--state", "{cut}", "--batch-size", "4"], "--batch-size comes from --state"),
    ],
)
def test_cli_refuses_bad_arguments_with_a_message(store, tmp_path, capsys, args, needle):
    """These were tracebacks (IndexError, UnpicklingError, a bare JSON error), or a batch size of 0 audited as 1.
    The command runs in this process (``python -m zarrtorch`` is ``raise SystemExit(cli.main())``, which
    ``test_cli`` runs as a process): an exception escaping it would be the traceback, and fail the test."""
    (tmp_path / "cut.json").write_text('{"epoch": 0, "batches_se')
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    args = [a.format(cut=tmp_path / "cut.json", junk=tmp_path / "junk.ckpt") for a in args]
    try:
        code = zarrtorch.cli.main(["audit", str(store), *args])
    except SystemExit as exit_:  # argparse's refusals
        code = exit_.code
    stderr = capsys.readouterr().err
    assert code == 2 and "Traceback" not in stderr, stderr
    assert re.search(needle, stderr), stderr


def cgroup_memory_max(root, limit: str):
    """A cgroup v2 fixture tree under ``root`` standing for ``/``: this process in /pod, ``memory.max`` there."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "cgroup").write_text("0::/pod\n")
    (root / "sys" / "fs" / "cgroup" / "pod").mkdir(parents=True)
    (root / "sys" / "fs" / "cgroup" / "pod" / "memory.max").write_text(limit + "\n")
    return root


def test_audit_says_the_cgroup_memory_limit_and_warns_over_half_of_it(store, tmp_path, monkeypatch, capsys):
    """In a JupyterHub pod or a container the kernel kills at the cgroup's memory limit: ``python -m zarrtorch
    audit`` prints the limit and, where the loaders of the node's ranks would take more than half of it, says
    so and names what to lower. A warning, not a failure (exit 0, ``ok``): the audit may run elsewhere than the
    training (a login node), in a cgroup that is not the job's."""
    from zarrtorch import loader_memory
    from zarrtorch._util import cgroup
    from zarrtorch.audit import main

    monkeypatch.setattr(cgroup, "CGROUP_ROOT", str(cgroup_memory_max(tmp_path / "none", "max")))
    one = loader_memory(ZarrDataLoader(ZarrIterableDataset(store, seed=0), batch_size=16, num_workers=2)).total
    argv = [str(store), "--world-size", "4", "--batch-size", "16", "--num-workers", "2", "--ranks-per-node", "2"]
    assert main(argv) == 0
    assert re.search(r"memory limit +none", capsys.readouterr().out)

    roomy = 8 * one
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", str(cgroup_memory_max(tmp_path / "roomy", str(roomy))))
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(rf"memory limit +{roomy / 2**30:,.2f} GiB", out) and "25%" in out and "OVER" not in out

    tight = 3 * one  # the node's 2 loaders take 67% of it
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", str(cgroup_memory_max(tmp_path / "tight", str(tight))))
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "67%" in out and "OVER 50% OF LIMIT" in out
    assert all(name in out for name in ("num_workers", "buffer_chunks", "requests_in_flight", "decode_threads"))
    assert main(argv + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory_limit_bytes"] == tight
    report = audit(store, world_size=4, batch_size=16, num_workers=2, ranks_per_node=2)
    assert report.ok and report.memory_limit_bytes == tight


WINDOWS = Windows(history=3, lead=2, stride=2, block_chunks=2)


def windows_loader(store, rank, world, state=None, windows=WINDOWS):
    ds = ZarrIterableDataset(store, seed=4, buffer_chunks=2, return_index=True, windows=windows)
    loader = ZarrDataLoader(ds, batch_size=8, rank=rank, world_size=world)
    loader.set_epoch(1)
    if state is not None:
        loader.load_state_dict(state)
    return loader


def test_cli_audits_a_windows_state_on_its_own_store(store, tmp_path, capsys):
    """``audit --state`` of a windows loader's state blamed the very store it was saved on ("audit the store ... the
    state belongs to"): the command had no way to say windows. They are rebuilt from the state's description, and
    the report matches what loaders resumed from that state yield on the new topology."""
    first = windows_loader(store, 0, 2)
    for seen, _ in enumerate(first, start=1):
        if seen == 3:
            break
    state = tmp_path / "windows_state.json"
    state.write_text(json.dumps(first.state_dict()))
    argv = ["audit", str(store), "--world-size", "3", "--state", str(state), "--json"]
    code = zarrtorch.cli.main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    saved = json.loads(state.read_text())
    rest = [list(windows_loader(store, rank, 3, saved)) for rank in range(3)]
    read = np.concatenate([b["index"].numpy() for batches in rest for b in batches])
    assert report["batches_per_rank"] == [len(batches) for batches in rest]
    assert report["rows_read"] == len(read) and report["rows_consumed_before"] == 2 * 3 * 8
    assert report["duplicates"] == 0 and report["rows"] == first.data.rows  # window starts

    other = tmp_path / "other.zarr"  # a state of another store still gets the clear message
    prepare_zarr({"x": np.arange(ROWS - 40, dtype=np.float32)}, other, chunk_rows=CHUNK, progress=False)
    assert zarrtorch.cli.main(["audit", str(other), "--world-size", "3", "--state", str(state)]) == 2
    assert "audit the store (and row_range) the state belongs to" in capsys.readouterr().err
    # windows given that are not the state's: named, both
    assert zarrtorch.cli.main([*argv[:-1], "--windows", "3", "2", "1"]) == 2
    err = capsys.readouterr().err
    assert "Windows(history=3, lead=2, stride=2, block_chunks=2)" in err and "stride=1" in err


def test_cli_audits_windows_without_a_state(store, capsys):
    argv = ["audit", str(store), "--world-size", "2", "--batch-size", "8", "--windows", "3", "2", "2", "--json"]
    assert zarrtorch.cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    expected = audit(store, world_size=2, batch_size=8, windows=Windows(history=3, lead=2, stride=2))
    assert (report["rows"], report["batches_per_rank"]) == (expected.rows, expected.batches_per_rank)
    assert expected.rows == ROWS - 8  # window starts, not rows


def test_a_sharded_store_is_audited_saying_the_shard_is_the_unit_and_its_cost(store, tmp_path, capsys):
    """Sharded stores are read with no setting since issue 43, the shard being the unit read, distributed and
    shuffled: the report (and the CLI) says so, with the shard's rows, inner chunks and decoded size, and what
    reading whole shards costs; a store of plain chunks says its chunk."""
    values = np.arange(64 * ROWS, dtype=np.float32).reshape(ROWS, 64)  # 256 bytes a row
    sharded = prepare_zarr({"x": values}, tmp_path / "s.zarr", chunk_rows=5, shard_chunks=4, progress=False)
    assert sharded["x"].shards == (20, 64)
    report = audit(str(tmp_path / "s.zarr"), world_size=2, batch_size=16)
    said = "  read unit            the shard: 20 rows, 4 inner chunks of 5 rows, 5 KiB decoded; each read brings "
    assert report.ok and said + "a whole shard, the shuffle mixes whole shards (not inner chunks)" in report.summary()
    assert "loader memory counts a shard per unit held" in report.summary()
    assert zarrtorch.cli.main(["audit", str(tmp_path / "s.zarr"), "--world-size", "2", "--batch-size", "16"]) == 0
    assert said in capsys.readouterr().out
    plain = audit(str(store), world_size=2, batch_size=16).summary()
    assert "  read unit            the chunk: 20 rows, 80 bytes decoded\n" in plain  # 20 rows of 4 bytes


def test_audit_says_whether_each_arrays_chunks_carry_a_checksum_and_how_to_get_one(store, tmp_path):
    """A store written before prepare_zarr wrote checksums (Blosc, or zstd without its content checksum): a byte
    flipped inside a chunk's compressed data decodes to other values, unnoticed. The audit says so per array, and
    how to get checksums; a prepare_zarr store's arrays carry one."""
    import zarr

    old = tmp_path / "old.zarr"
    prepare_zarr({"x": np.arange(ROWS, dtype=np.float32)}, old, chunk_rows=CHUNK, progress=False)
    zarr.create_array(
        str(old), name="b", shape=(ROWS,), chunks=(CHUNK,), dtype="f4", compressors=[zarr.codecs.BloscCodec()]
    )[:] = np.arange(ROWS, dtype=np.float32)
    zarr.consolidate_metadata(str(old))
    report = audit(old, variables=["x", "b"], batch_size=16, world_size=1)
    assert report.checksums == {"x": "zstd content checksum", "b": "none"}
    text = report.summary()
    assert "checksum             'x': zstd content checksum" in text, text
    assert re.search(r"checksum +'b': none: a byte flipped inside compressed data is not detected.*prepare_zarr", text)
    assert report.ok  # a warning: the rows are read as stored
    fresh = audit(store, batch_size=16, world_size=1)
    assert fresh.checksums == {"x": "zstd content checksum"}
    assert "not detected" not in fresh.summary()
