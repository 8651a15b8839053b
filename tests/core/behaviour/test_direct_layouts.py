"""Every common layout is decoded directly, to exactly what zarr reads; the others go through zarr, saying why.

The property test draws a layout (Zarr v2 or v3; no compressor, zstd, Blosc with each of its compressors and
shuffles, gzip, zlib; little or big endian; int8 to float64; v3 shards of several inner chunks, their index at
the start or the end; a local directory or a store read through its ``get``, as a remote one) and compares the
loader's rows, and pieces cut anywhere inside a chunk (a shard then reads only some of its inner chunks), with
``array[:]``. Before issue 43 only Zarr v3 + zstd without shards was decoded directly: each of the other layouts
here was read by zarr's general path, about 4x slower per window (``benchmarks/README.md``).
"""

from __future__ import annotations

import os
import tempfile

import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset
from zarrtorch._read.fastpath import (
    SHARD_INDEXES,
    DirectLayout,
    Span,
    _index_entry_bytes,
    _IndexCache,
    direct_decoder,
    read_buffer_bytes,
    read_path,
    read_path_text,
)
from zarrtorch._read.reader import PieceReader

EXAMPLES = int(os.environ.get("ZARRTORCH_FUZZ_EXAMPLES", "40"))
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")
CNAMES = ("lz4", "lz4hc", "zstd", "blosclz")
SHUFFLES = ("noshuffle", "shuffle", "bitshuffle")


@st.composite
def layouts(draw) -> dict:
    fmt = draw(st.sampled_from((2, 3)))
    compressor = draw(st.sampled_from(("none", "zstd", "blosc", "gzip") + (("zlib",) if fmt == 2 else ())))
    chunk_rows = draw(st.integers(1, 9))
    inner = draw(st.sampled_from([d for d in range(1, chunk_rows + 1) if chunk_rows % d == 0])) if fmt == 3 else None
    return {
        "format": fmt,
        "compressor": compressor,
        "cname": draw(st.sampled_from(CNAMES)),
        "shuffle": draw(st.sampled_from(SHUFFLES)),
        "big_endian": draw(st.booleans()),
        "dtype": draw(st.sampled_from(DTYPES)),
        "rows": draw(st.integers(1, 40)),
        "row_shape": draw(st.sampled_from(((), (3,), (2, 5)))),
        "chunk_rows": chunk_rows,
        "inner_rows": inner if fmt == 3 and draw(st.booleans()) else None,
        "index_at": draw(st.sampled_from(("end", "start"))),
        "in_files": draw(st.booleans()),
        "crc32c": fmt == 3 and draw(st.booleans()),  # the compressed chunk followed by its checksum
    }


def codec_options(layout: dict) -> dict:
    """zarr.create_array's keywords for the layout's compressor and byte order."""
    fmt, name, shuffle = layout["format"], layout["compressor"], layout["shuffle"]
    dtype = np.dtype(layout["dtype"])
    if fmt == 2:
        compressor = {
            "none": None,
            "zstd": numcodecs.Zstd(),
            "blosc": numcodecs.Blosc(cname=layout["cname"], shuffle=SHUFFLES.index(shuffle)),
            "gzip": numcodecs.GZip(),
            "zlib": numcodecs.Zlib(),
        }[name]
        return {"compressors": compressor, "dtype": dtype.newbyteorder(">" if layout["big_endian"] else "<")}
    compressor = {
        "none": None,
        "zstd": zarr.codecs.ZstdCodec(),
        "blosc": zarr.codecs.BloscCodec(cname=layout["cname"], shuffle=shuffle),
        "gzip": zarr.codecs.GzipCodec(),
    }[name]
    compressors = [c for c in (compressor,) if c is not None] + [zarr.codecs.Crc32cCodec()] * layout["crc32c"]
    options = {"compressors": compressors, "dtype": dtype}
    options["serializer"] = zarr.codecs.BytesCodec(endian="big" if layout["big_endian"] else "little")
    if layout["inner_rows"]:
        options["shards"] = {
            "shape": (layout["chunk_rows"], *layout["row_shape"]),
            "index_location": layout["index_at"],
        }
    return options


def write(layout: dict, where: str) -> zarr.Array:
    store = zarr.storage.LocalStore(where) if layout["in_files"] else zarr.storage.MemoryStore()
    shape = (layout["rows"], *layout["row_shape"])
    inner = layout["inner_rows"] or layout["chunk_rows"]
    arr = zarr.create_array(
        store,
        shape=shape,
        chunks=(inner, *layout["row_shape"]),
        zarr_format=layout["format"],
        fill_value=0,
        config={"write_empty_chunks": True},
        **codec_options(layout),
    )
    rng = np.random.default_rng(layout["rows"] * 31 + layout["chunk_rows"])
    dtype = np.dtype(layout["dtype"])
    if dtype.kind == "f":
        values = rng.standard_normal(shape) * 1e3
    else:
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    arr[...] = values.astype(dtype)
    return arr


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(layout=layouts(), cuts=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), max_size=4))
def test_every_common_layout_is_decoded_directly_to_what_zarr_reads(layout, cuts):
    with tempfile.TemporaryDirectory() as where:
        arr = write(layout, os.path.join(where, "a.zarr"))
        expected = arr[...]
        assert isinstance(read_path(arr), DirectLayout), read_path_text(arr)
        ds = ZarrIterableDataset({"x": arr}, shuffle=False)
        got = np.concatenate([b["x"].numpy() for b in ZarrDataLoader(ds, batch_size=4)])
        assert got.dtype == expected.dtype.newbyteorder("=") and got.dtype.isnative
        np.testing.assert_array_equal(got, expected)
        # pieces cut anywhere inside a chunk (or shard): a shard decodes only the inner chunks holding them
        chunk_rows = layout["chunk_rows"]
        reader = PieceReader({"x": arr}, chunk_rows)
        for a, b in cuts:
            chunk = a % layout["rows"] // chunk_rows
            first, last = chunk * chunk_rows, min((chunk + 1) * chunk_rows, layout["rows"])
            start = first + a % (last - first)
            stop = start + 1 + b % (last - start)
            np.testing.assert_array_equal(reader.read_piece(start, stop)["x"], expected[start:stop])


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"zarr_format": 2, "compressors": numcodecs.Blosc("lz4", shuffle=1)}, "direct (v2, blosc lz4 shuffle)"),
        ({"zarr_format": 2, "compressors": numcodecs.Blosc("zstd", shuffle=2)}, "direct (v2, blosc zstd bitshuffle)"),
        ({"zarr_format": 2, "compressors": numcodecs.Zlib()}, "direct (v2, zlib)"),
        ({"zarr_format": 2, "compressors": None}, "direct (v2, no compressor)"),
        ({"zarr_format": 2, "dtype": ">f4"}, "direct (v2, zstd, big-endian, byte-swapped)"),
        ({"compressors": zarr.codecs.GzipCodec()}, "direct (v3, gzip)"),
        ({"compressors": [zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()]}, "direct (v3, zstd, crc32c)"),
        (
            {"chunks": (2, 3), "shards": (8, 3), "compressors": [zarr.codecs.BloscCodec(), zarr.codecs.Crc32cCodec()]},
            "direct (v3 sharded, 4 inner chunks of 2 rows per shard, blosc zstd shuffle, crc32c)",
        ),
        ({"chunks": (2, 3), "shards": (8, 3)}, "direct (v3 sharded, 4 inner chunks of 2 rows per shard, zstd)"),
    ],
)
def test_the_read_path_says_the_layout(tmp_path, options, said):
    options = {"chunks": (8, 3), "dtype": "f4", **options}
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=(16, 3), **options)
    assert read_path_text(arr) == said
    assert direct_decoder(arr) is not None


NESTED_SHARDS = zarr.codecs.ShardingCodec(chunk_shape=(4, 3), codecs=[zarr.codecs.ShardingCodec(chunk_shape=(2, 3))])


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"zarr_format": 2, "filters": [numcodecs.Delta(dtype="i4")]}, "zarr's path: filter Delta not read directly"),
        (
            {"zarr_format": 2, "filters": [numcodecs.FixedScaleOffset(0, 10, dtype="i4")]},
            "zarr's path: filter FixedScaleOffset not read directly",
        ),
        ({"zarr_format": 2, "order": "F"}, "zarr's path: order F (column-major chunks) not read directly"),
        ({"zarr_format": 2, "compressors": numcodecs.BZ2()}, "zarr's path: compressor BZ2 not read directly"),
        (
            {"compressors": [zarr.codecs.ZstdCodec(), zarr.codecs.GzipCodec()]},
            "zarr's path: codecs Zstd + Gzip not read directly (one compressor at most)",
        ),
        ({"filters": [zarr.codecs.TransposeCodec(order=(1, 0))]}, "zarr's path: codec Transpose not read directly"),
        (
            {"chunks": (2, 1), "shards": (8, 3)},
            "zarr's path: inner chunks (2, 1) split a shard (8, 3) along another axis than the first: not read "
            "directly",
        ),
        (
            {"serializer": NESTED_SHARDS, "compressors": None, "read": ReadOptions(missing_chunks="fill")},
            "zarr's path: nested shards (inner chunks sharded again) not read directly",
        ),
    ],
)
def test_other_layouts_go_through_zarr_saying_why(tmp_path, options, said):
    """Each layout the direct decoder does not read is read through zarr's codecs, equal to zarr's values, with
    the reason said; nested shards too, where missing chunks are read as fill values by the user's choice (the
    outer shard the unit)."""
    options = {"chunks": (8, 3), "dtype": "i4", **options}
    read = options.pop("read", None)
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=(16, 3), **options)
    arr[...] = np.arange(48, dtype="i4").reshape(16, 3)
    assert read_path_text(arr) == said
    assert direct_decoder(arr) is None
    ds = ZarrIterableDataset({"x": arr}, shuffle=False, read=read)
    got = np.concatenate([b["x"].numpy() for b in ZarrDataLoader(ds, batch_size=8)])
    np.testing.assert_array_equal(got, arr[...])


def test_nested_shards_are_refused_unless_missing_chunks_are_fill_values_by_choice():
    """Nested shards streamed an inner chunk left out of an inner shard as fill values under the default
    ``missing_chunks="error"`` (zarr's path cannot tell a chunk left out from one never written), where one
    level of shards raises naming the chunk. The default refuses them when the dataset is built, naming the
    array and both fixes; with ``missing_chunks="fill"`` they stream what zarr reads."""
    arr = zarr.create_array(
        zarr.storage.MemoryStore(),
        shape=(16, 3),
        chunks=(8, 3),
        dtype="i4",
        fill_value=0,
        serializer=NESTED_SHARDS,
        compressors=None,
    )
    data = np.arange(48, dtype="i4").reshape(16, 3) + 1
    data[2:4] = 0  # an innermost chunk of fill values: not stored
    arr[...] = data
    with pytest.raises(ValueError, match="'x' nests shards") as refused:
        ZarrIterableDataset({"x": arr}, shuffle=False)
    assert "shard_chunks=" in str(refused.value) and "missing_chunks='fill'" in str(refused.value)
    ds = ZarrIterableDataset({"x": arr}, shuffle=False, read=ReadOptions(missing_chunks="fill"))
    got = np.concatenate([b["x"].numpy() for b in ZarrDataLoader(ds, batch_size=8)])
    np.testing.assert_array_equal(got, data)


class CountingStore(zarr.storage.MemoryStore):
    """A store read through its ``get`` (as a remote one), noting each request's key and byte range."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests: list[tuple[str, object]] = []

    async def get(self, key, prototype, byte_range=None):
        self.requests.append((key, byte_range))
        return await super().get(key, prototype, byte_range)


def test_a_shard_is_read_by_its_index_once_and_one_range_per_run_of_inner_chunks():
    """Rows 2..11 of a shard of eight 2-row inner chunks are inner chunks 1 to 5: one request for the index,
    one for those five (stored one after the other); the index is not requested again for the shard's next
    piece. An inner chunk left out of the shard (all fill values) splits the run in two. A piece of the whole
    shard, its index not read yet, reads the whole shard in one request."""
    store = CountingStore()
    arr = zarr.create_array(
        store, shape=(32, 3), chunks=(2, 3), shards=(16, 3), dtype="f4", fill_value=0, compressors=None
    )
    data = np.arange(96, dtype="f4").reshape(32, 3) + 1
    data[22:24] = 0  # the second shard's inner chunk 3: not stored (zarr's default, write_empty_chunks=False)
    arr[...] = data
    reader = PieceReader({"x": arr}, 16)  # a new reader: a shard in memory has its index cached per reader
    store.requests.clear()
    np.testing.assert_array_equal(reader.read_piece(2, 11)["x"], data[2:11])
    assert [key for key, _ in store.requests] == ["c/0/0", "c/0/0"]
    index_request, run = (r for _, r in store.requests)
    assert getattr(index_request, "suffix", None) is not None  # the index, at the shard's end
    assert (run.start, run.end) == (1 * 24, 6 * 24)  # inner chunks 1-5, 24 bytes each (stored uncompressed)
    store.requests.clear()
    np.testing.assert_array_equal(reader.read_piece(12, 16)["x"], data[12:16])
    assert len(store.requests) == 1  # the index is cached
    reader = PieceReader({"x": arr}, 16, check_missing=False)
    store.requests.clear()
    np.testing.assert_array_equal(reader.read_piece(18, 32)["x"], data[18:32])
    assert len(store.requests) == 3  # the index, inner chunks 1-2, inner chunks 4-7
    reader = PieceReader({"x": arr}, 16, check_missing=False)  # its own index cache: c/1/0's index not read yet
    store.requests.clear()
    np.testing.assert_array_equal(reader.read_piece(16, 32)["x"], data[16:32])
    assert store.requests == [("c/1/0", None)]  # all of the shard, its index not read yet: the whole shard at once


def test_the_shard_index_cache_is_bounded():
    cache = _IndexCache(most=4 * _index_entry_bytes(8))  # room for 4 indexes of 8 inner chunks
    for k in range(10):
        cache.put(k, np.zeros((8, 2), np.uint64))
        assert cache.nbytes <= cache.most
    assert cache.get(0) is None and cache.get(9) is not None
    assert sum(cache.get(k) is not None for k in range(10)) == 4


def test_a_shards_read_buffer_holds_its_inner_chunks_read_at_once(tmp_path):
    """Each reading thread's buffer holds the largest run of inner chunks it reads (a whole shard of
    incompressible data, the worst case): ``loader_memory`` counts it, and the shard indexes cached."""
    from zarrtorch import loader_memory
    from zarrtorch._read.fastpath import shard_index_cache_bytes

    noise = np.random.default_rng(0).integers(0, 2**32, (64, 50), dtype=np.uint32)
    arr = zarr.create_array(str(tmp_path / "n.zarr"), shape=noise.shape, chunks=(4, 50), shards=(32, 50), dtype="u4")
    arr[...] = noise
    shard = (tmp_path / "n.zarr" / "c" / "0" / "0").stat().st_size
    assert read_buffer_bytes(arr) >= shard > noise[:32].nbytes
    ds = ZarrIterableDataset({"n": arr}, read=ReadOptions(decode_threads=2))
    budget = loader_memory(ZarrDataLoader(ds, batch_size=4))
    threads = ZarrDataLoader(ds, batch_size=4).job.read_plan.threads
    assert budget.read_buffers == threads * read_buffer_bytes(ds.arrays["n"]) + shard_index_cache_bytes(arr) > 0


def test_audit_and_roofline_say_each_arrays_read_path(tmp_path, capsys):
    """One line per array: ``direct (...)`` with its layout, or ``zarr's path: ...`` with the reason."""
    from zarrtorch import audit
    from zarrtorch.cli import main

    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=2)
    fast = group.create_array("fast", shape=(64, 4), chunks=(8, 4), dtype="f4", compressors=numcodecs.Blosc("lz4"))
    slow = group.create_array("slow", shape=(64,), chunks=(8,), dtype="i4", filters=[numcodecs.Delta(dtype="i4")])
    fast[...], slow[...] = 1.0, np.arange(64, dtype="i4")
    zarr.consolidate_metadata(str(tmp_path / "g.zarr"))
    text = audit(str(tmp_path / "g.zarr"), world_size=1, batch_size=8).summary()
    assert "read path            'fast': direct (v2, blosc lz4 shuffle)" in text
    assert "read path            'slow': zarr's path: filter Delta not read directly" in text
    sharded = zarr.create_array(str(tmp_path / "s.zarr"), shape=(64, 4), chunks=(4, 4), shards=(16, 4), dtype="f4")
    sharded[...] = 2.0
    store = str(tmp_path / "s.zarr")
    assert main(["roofline", store, "--batches", "2", "--chunks", "2", "--batch-size", "8"]) == 0
    said = capsys.readouterr().out
    assert "read path 'data': direct (v3 sharded, 4 inner chunks of 4 rows per shard, zstd)" in said, said


def test_a_forked_child_starts_with_a_cache_of_its_own():
    """A DataLoader worker forked while a reading thread of its parent holds the index cache's lock would wait
    on that lock forever at its first shard: the child's cache starts afresh."""
    import signal

    with SHARD_INDEXES._lock:
        pid = os.fork()
        if pid == 0:  # the child: no thread of its own holds the lock
            signal.alarm(10)
            SHARD_INDEXES.put(("store", "key", None), np.zeros((1, 2), np.uint64))
            os._exit(0 if SHARD_INDEXES.get(("store", "key", None)) is not None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the child waited on its parent's lock"


def test_the_last_shard_read_whole_is_one_request_too():
    """The array's last shard holds fewer rows than a shard (its last inner chunks are never written): a piece
    of all its rows is one request, as for every other shard, not its index and then its inner chunks (lesson
    07 counts one request per object read)."""
    store = CountingStore()
    arr = zarr.create_array(store, shape=(28, 3), chunks=(2, 3), shards=(16, 3), dtype="f4")
    data = np.arange(84, dtype="f4").reshape(28, 3) + 1
    arr[...] = data
    store.requests.clear()
    reader = PieceReader({"x": arr}, 16)
    np.testing.assert_array_equal(reader.read_piece(16, 28)["x"], data[16:28])
    np.testing.assert_array_equal(reader.read_piece(0, 16)["x"], data[0:16])
    assert sorted(key for key, _ in store.requests) == ["c/0/0", "c/1/0"], store.requests
    assert all(whole is None for _, whole in store.requests), store.requests  # each shard whole, no byte range


def test_a_shard_rewritten_on_its_server_is_read_with_its_new_index_not_called_damaged(tmp_path):
    """A store served over HTTP, written again by prepare_zarr while the process that read it runs (a notebook's
    kernel): its first inner chunks now compress to other lengths. The shard index cached from the first read
    (a remote shard's has no file time to tell) pointed zstd at the old offsets, whose RuntimeError did not drop
    it as a ValueError does: the chunk was fetched again with the same index and called damaged, in every later
    dataset of that process, until it restarted."""
    from zarrtorch import prepare_zarr
    from zarrtorch.course.servers import HttpStoreServer

    first = np.random.default_rng(1).normal(size=(40, 6)).astype(np.float32)
    second = first.copy()
    second[::10] = 0  # the first row of each shard: its first inner chunk compresses shorter
    with HttpStoreServer(tmp_path) as server:
        for data in (first, second):
            prepare_zarr({"x": data}, tmp_path / "s.zarr", chunk_rows=5, shard_chunks=2, overwrite=True, progress=False)
            ds = ZarrIterableDataset(f"{server.url}/s.zarr", variables=["x"], shuffle=False)
            rows = np.concatenate([b["x"].numpy() for b in ZarrDataLoader(ds, batch_size=10)])
            np.testing.assert_array_equal(rows, data)


ONE_SHARD_OF_FOUR_UNCOMPRESSED = {
    "shape": (8, 2),
    "chunks": (2, 2),
    "shards": (8, 2),
    "dtype": "i4",
    "fill_value": 0,
    "compressors": None,
    "config": {"write_empty_chunks": False},
}  # stored uncompressed, a shard written again with other inner chunks stored keeps its size


def test_a_shard_written_again_in_memory_is_read_with_its_new_index_not_the_one_cached_before():
    """A store in memory (a notebook's, a test's) holds no file time to tell a shard written again: its index, cached
    by the store's name and key, outlived the write. Rewritten with its first inner chunk all fill values (not
    stored), the shard's other inner chunks moved up, and the next dataset read them at the old offsets: rows 0-5
    came out as rows 2-7 and rows 6-7 as the index's bytes (-1), where zarr reads the fill value and the new values,
    without a word (stored uncompressed, every length still matched)."""
    arr = zarr.create_array(zarr.storage.MemoryStore(), **ONE_SHARD_OF_FOUR_UNCOMPRESSED)
    read = ReadOptions(missing_chunks="fill")
    for data in (np.arange(1, 17, dtype="i4").reshape(8, 2), np.r_[np.zeros(4, "i4"), np.arange(105, 117, dtype="i4")]):
        arr[...] = data.reshape(8, 2)
        ds = ZarrIterableDataset({"x": arr}, shuffle=False, read=read)
        rows = np.concatenate([b["x"].numpy() for b in ZarrDataLoader(ds, batch_size=4)])
        np.testing.assert_array_equal(rows, arr[...])


@pytest.mark.parametrize("needs", ["whole_shard", "some_rows"])
def test_a_local_shard_rewritten_with_its_size_and_time_kept_is_read_with_its_new_index(tmp_path, needs):
    """A local shard's index was cached by the file's size and modification time. Written again with as many
    inner chunks stored (uncompressed: the same size) and the same time (two writes within the file system's time
    resolution, or ``cp -p``/``rsync -t`` of a new version), the next reader read it at the old index's offsets:
    the first inner chunk (all fill values before, not stored) came out as fill values and every other one as the
    chunk before it, where zarr reads the new values, without a word. Whole (a dataset's piece: the shard read at
    once) and some rows (the index, then byte ranges)."""
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    arr = group.create_array("x", **ONE_SHARD_OF_FOUR_UNCOMPRESSED)
    shard = tmp_path / "s.zarr" / "x" / "c" / "0" / "0"
    kept = None
    first, second = np.r_[[0] * 4, np.arange(105, 117)], np.r_[np.arange(1, 13), [0] * 4]
    for data in (first.astype("i4"), second.astype("i4")):
        arr[...] = data.reshape(8, 2)
        if kept is None:
            kept = shard.stat()
        else:
            assert shard.stat().st_size == kept.st_size
            os.utime(shard, ns=(kept.st_atime_ns, kept.st_mtime_ns))
        if needs == "whole_shard":
            ds = ZarrIterableDataset(str(tmp_path / "s.zarr"), shuffle=False, read=ReadOptions(missing_chunks="fill"))
            got = np.concatenate([b["x"].numpy() for b in ZarrDataLoader(ds, batch_size=4)])
            np.testing.assert_array_equal(got, arr[...])
        else:
            decode = direct_decoder(zarr.open_array(str(tmp_path / "s.zarr" / "x")), check_missing=False)
            got = decode("c/0/0", rows=Span(2, 8, 8))
            np.testing.assert_array_equal(got[2:8], arr[2:8])
