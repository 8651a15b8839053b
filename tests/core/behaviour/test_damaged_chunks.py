"""Every damaged or missing chunk is an error naming the array, the chunk and its rows: never values.

Each layout (the direct decode of Zarr v2 and v3 with zstd, Blosc, gzip, zlib or no compressor, big-endian,
sharded with the index at either end, the crc32c checksum codec after zstd or none; zarr's codecs for F
order) gets a chunk file cut short, emptied, lengthened (random or zero bytes), replaced by random bytes,
holding a valid frame of fewer or more rows than the chunk, or (where the codec has one) a wrong checksum, read
locally with 0 workers (and 2 for one layout of each reader), in rows and in windows, and over HTTP. The zstd case
"frame of fewer rows" once returned half real values and half uninitialised memory."""

from __future__ import annotations

import os
import shutil
import threading

import numcodecs
import numpy as np
import pytest
import zarr

from zarrtorch import ChunkReadError, ReadOptions, Windows, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._read.fastpath import frame_content_size, read_path_text
from zarrtorch.course.servers import HttpStoreServer

ROWS, CHUNK, DAMAGED = 60, 10, 2
X = np.arange(ROWS * 6, dtype=np.float32).reshape(ROWS, 6)
# each layout a store may have, and the path that reads it: zarrtorch._read.fastpath ("direct") or zarr's codecs
LAYOUTS = {
    "direct": (dict(), "direct (v3, zstd)"),  # written by prepare_zarr
    "zstd-checksum": (dict(compressors=[zarr.codecs.ZstdCodec(checksum=True)]), "direct (v3, zstd)"),
    "blosc": (dict(compressors=[zarr.codecs.BloscCodec(cname="zstd")]), "direct (v3, blosc zstd shuffle)"),
    "gzip": (dict(compressors=[zarr.codecs.GzipCodec()]), "direct (v3, gzip)"),
    "sharded": (dict(shards=True), "direct (v3 sharded, 2 inner chunks of 5 rows per shard, zstd)"),
    "sharded-blosc-start": (
        dict(shards="start", compressors=[zarr.codecs.BloscCodec(cname="lz4")]),
        "direct (v3 sharded, 2 inner chunks of 5 rows per shard, blosc lz4 shuffle)",
    ),
    "v2": (dict(zarr_format=2, compressors=numcodecs.Blosc("lz4", shuffle=1)), "direct (v2, blosc lz4 shuffle)"),
    "v2-bitshuffle": (
        dict(zarr_format=2, compressors=numcodecs.Blosc("zstd", shuffle=2)),
        "direct (v2, blosc zstd bitshuffle)",
    ),
    "v2-zlib": (dict(zarr_format=2, compressors=numcodecs.Zlib()), "direct (v2, zlib)"),
    "v2-gzip": (dict(zarr_format=2, compressors=numcodecs.GZip()), "direct (v2, gzip)"),
    "v2-none": (dict(zarr_format=2, compressors=None), "direct (v2, no compressor)"),
    "v2-big-endian": (
        dict(zarr_format=2, dtype=">f4", compressors=numcodecs.Zstd()),
        "direct (v2, zstd, big-endian, byte-swapped)",
    ),
    "v2-order-F": (
        dict(zarr_format=2, order="F", compressors=numcodecs.Blosc("lz4", shuffle=1)),
        "zarr's path: order F (column-major chunks) not read directly",
    ),
    "crc32c": (
        dict(compressors=[zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()]),
        "direct (v3, zstd, crc32c)",
    ),
    "none-crc32c": (dict(compressors=[zarr.codecs.Crc32cCodec()]), "direct (v3, no compressor, crc32c)"),
}
PATHS = list(LAYOUTS)
# read with 2 workers too (the others' decode paths are the same in a worker): one of each reader
WITH_WORKERS = ["direct", "sharded", "v2", "v2-order-F"]
# the codec's own checksum, and where the stored bytes hold it
CHECKSUM_AT = {"zstd-checksum": -1, "gzip": -8, "v2-gzip": -8, "v2-zlib": -1, "sharded": -1, "crc32c": -1}
CHECKSUM_AT |= {"none-crc32c": -1}  # Blosc then crc32c: the flipped-byte tests below
UNFRAMED = {"v2-none"}  # stored as decoded: bytes of the right length are a valid chunk, whatever they hold
# a shard with its index first: bytes after its last inner chunk are space the index does not point to (the
# sharding codec allows it); the values read are those written
INDEX_FIRST = {"sharded-blosc-start"}


def write(path, kind: str, data: np.ndarray = X, chunk: int = CHUNK) -> None:
    if kind == "direct":  # bytes + zstd: decoded by zarrtorch._read.fastpath
        prepare_zarr({"x": data}, path, chunk_rows=chunk, progress=False)
        return
    options = dict(LAYOUTS[kind][0])
    fmt, dtype = options.pop("zarr_format", 3), options.pop("dtype", data.dtype)
    shards = options.pop("shards", None)
    width = data.shape[1]
    if shards:  # shards of `chunk` rows, two inner chunks each
        options["chunks"] = (chunk // 2, width)
        options["shards"] = {"shape": (chunk, width), "index_location": "start" if shards == "start" else "end"}
    else:
        options["chunks"] = (chunk, width)
    group = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    array = group.create_array("x", shape=data.shape, dtype=dtype, **options)
    array[:] = data


def chunk_file(path, kind: str, chunk: int = DAMAGED):
    return path / "x" / (f"{chunk}.0" if kind.startswith("v2") else f"c/{chunk}/0")


def a_frame_of(kind: str, rows: int, tmp_path) -> bytes:
    """The stored bytes of a valid chunk (or shard) of the same layout holding ``rows`` rows instead of CHUNK."""
    rows -= rows % 2  # a shard's two inner chunks
    other = tmp_path / f"other-{kind}-{rows}.zarr"
    write(other, kind, np.resize(X, (ROWS, 6)), chunk=rows)
    return chunk_file(other, kind, 0).read_bytes()


def damaged(raw: bytes, how: str, kind: str, tmp_path) -> bytes:
    noise = np.random.default_rng(7).integers(0, 256, max(64, len(raw)), dtype=np.uint8).tobytes()

    def wrong_checksum() -> bytes:
        at = len(raw) + CHECKSUM_AT[kind]
        return raw[:at] + bytes([raw[at] ^ 0x5A]) + raw[at + 1 :]

    return {
        "cut short": lambda: raw[: len(raw) // 2],
        "emptied": lambda: b"",
        "lengthened": lambda: raw + noise[:64],
        "zero bytes appended": lambda: raw + bytes(64),
        "random bytes": lambda: noise[: len(raw)],
        "frame of fewer rows": lambda: a_frame_of(kind, CHUNK // 2, tmp_path),
        "frame of more rows": lambda: a_frame_of(kind, CHUNK * 2, tmp_path),
        "wrong checksum": wrong_checksum,
    }[how]()


DAMAGES = [
    "cut short",
    "emptied",
    "lengthened",
    "zero bytes appended",
    "random bytes",
    "frame of fewer rows",
    "frame of more rows",
    "wrong checksum",
]


def cases(kinds=PATHS) -> list:
    """(kind, damage) pairs that can be told: a checksum only where the codec has one, random bytes of the right
    length not in a chunk stored as decoded (no reader can tell them from data), bytes appended not after a
    shard whose index comes first (unused space)."""
    return [
        (kind, how)
        for kind in kinds
        for how in DAMAGES
        if not (how == "wrong checksum" and kind not in CHECKSUM_AT)
        and not (how == "random bytes" and kind in UNFRAMED)
        and not (how in ("lengthened", "zero bytes appended") and kind in INDEX_FIRST)
    ]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    for kind in PATHS:
        write(root / f"{kind}.zarr", kind)
    return root


def read_all(path, num_workers: int, windows: Windows | None = None, **read_kw) -> np.ndarray:
    read = ReadOptions(**read_kw)
    names = ["x"] if str(path).startswith("http") else None  # zarr's own stores are not consolidated
    ds = ZarrIterableDataset(path, variables=names, shuffle=False, windows=windows, read=read)
    extra = {"multiprocessing_context": "fork", "timeout": 60} if num_workers else {}
    loader = ZarrDataLoader(ds, batch_size=CHUNK, num_workers=num_workers, **extra)
    return np.concatenate([b["x"].numpy() for b in loader])


def test_the_paths_are_the_ones_named(pristine):
    """Each layout is read by the path named (direct for every common one), to the stored values."""
    for kind, (_, path) in LAYOUTS.items():
        array = zarr.open_group(str(pristine / f"{kind}.zarr"), mode="r")["x"]
        assert read_path_text(array) == path, kind
        np.testing.assert_array_equal(read_all(pristine / f"{kind}.zarr", 0), X)


def damage(pristine, tmp_path, kind: str, how: str):
    path = tmp_path / f"{kind}.zarr"
    shutil.copytree(pristine / f"{kind}.zarr", path)
    target = chunk_file(path, kind)
    target.write_bytes(damaged(target.read_bytes(), how, kind, tmp_path))
    return path


def read_workers(kind: str) -> list:
    return [0, 2] if kind in WITH_WORKERS else [0]


@pytest.mark.parametrize(("kind", "how", "num_workers"), [(k, h, w) for k, h in cases() for w in read_workers(k)])
def test_a_damaged_chunk_is_an_error_naming_it(pristine, tmp_path, kind, how, num_workers):
    path = damage(pristine, tmp_path, kind, how)
    with pytest.raises(ChunkReadError) as err:
        read_all(path, num_workers)
    message = str(err.value)
    rows = f"rows {DAMAGED * CHUNK}:{(DAMAGED + 1) * CHUNK}"
    assert f"chunk {DAMAGED} ({rows}) of array 'x'" in message, message
    assert repr(str(chunk_file(path, kind).relative_to(path)).replace(os.sep, "/")) in message, message


@pytest.mark.parametrize(("kind", "how", "num_workers"), [(k, h, w) for k, h in cases() for w in read_workers(k)])
def test_a_damaged_chunk_inside_windows_is_an_error_naming_it(pristine, tmp_path, kind, how, num_workers):
    """Windows decode each chunk into a slot of a shared array (``zarrtorch.held_chunks``), a path of its own:
    a frame of fewer rows there would leave the slot's previous chunk in place of the missing rows."""
    path = damage(pristine, tmp_path, kind, how)
    with pytest.raises(ChunkReadError) as err:
        read_all(path, num_workers, windows=Windows(history=2, lead=1))
    assert f"chunk {DAMAGED} (rows {DAMAGED * CHUNK}:{(DAMAGED + 1) * CHUNK}) of array 'x'" in str(err.value)


@pytest.fixture(scope="module")
def damaged_over_http(pristine, tmp_path_factory):
    """Every damage of every path, served over HTTP (the requests wait on zarr's event loop, a shard's by byte
    range: other paths)."""
    root = tmp_path_factory.mktemp("served")
    for kind, how in cases():
        path = root / f"{kind}-{DAMAGES.index(how)}.zarr"
        shutil.copytree(pristine / f"{kind}.zarr", path)
        target = chunk_file(path, kind)
        target.write_bytes(damaged(target.read_bytes(), how, kind, root))
    with HttpStoreServer(root) as server:
        yield server.url


@pytest.mark.parametrize("windows", [None, Windows(history=2, lead=1)], ids=["rows", "windows"])
@pytest.mark.parametrize(("kind", "how"), cases())
def test_a_damaged_chunk_over_http_is_an_error_naming_it(damaged_over_http, kind, how, windows):
    with pytest.raises(ChunkReadError) as err:
        read_all(f"{damaged_over_http}/{kind}-{DAMAGES.index(how)}.zarr", 0, windows=windows)
    assert f"chunk {DAMAGED} (rows {DAMAGED * CHUNK}:{(DAMAGED + 1) * CHUNK}) of array 'x'" in str(err.value)


@pytest.mark.parametrize(("kind", "num_workers"), [(k, w) for k in PATHS for w in read_workers(k)])
def test_a_missing_chunk_is_an_error_not_fill_values(pristine, tmp_path, kind, num_workers):
    path = tmp_path / f"{kind}.zarr"
    shutil.copytree(pristine / f"{kind}.zarr", path)
    chunk_file(path, kind).unlink()
    with pytest.raises(ChunkReadError, match=rf"missing chunk {DAMAGED} .*of array 'x'.*fill value"):
        read_all(path, num_workers)
    # missing_chunks="fill": the store was written without empty chunks on purpose, they read as fill values
    rows = read_all(path, 0, missing_chunks="fill")
    expected = X.copy()
    expected[DAMAGED * CHUNK : (DAMAGED + 1) * CHUNK] = 0
    np.testing.assert_array_equal(rows, expected)


@pytest.mark.parametrize("over_http", [False, True], ids=["local", "http"])
@pytest.mark.parametrize("kind", ["sharded", "sharded-blosc-start"])
def test_a_shard_missing_an_inner_chunk_is_an_error(tmp_path, kind, over_http):
    """A shard whose index marks an inner chunk as absent (zarr reads it as fill values): an error naming it,
    or the fill value with missing_chunks='fill'."""
    path = tmp_path / "s.zarr"
    write(path, kind)
    shard = slice(DAMAGED * CHUNK, (DAMAGED + 1) * CHUNK)
    data = X.copy()
    data[DAMAGED * CHUNK + CHUNK // 2 : (DAMAGED + 1) * CHUNK] = 0  # the shard's second inner chunk
    # rewritten all fill values, zarr leaves that inner chunk out of the shard (write_empty_chunks=False)
    zarr.open_group(str(path), mode="r+")["x"][shard] = data[shard]
    with HttpStoreServer(tmp_path) as server:
        source = f"{server.url}/s.zarr" if over_http else path
        with pytest.raises(
            ChunkReadError, match=r"inner chunk\(s\) \[\(1(, 0)*\)\] .*fill value 0\.0.*missing_chunks='fill'"
        ):
            read_all(source, 0)
        np.testing.assert_array_equal(read_all(source, 0, missing_chunks="fill"), data)


def without_content_size(frame: bytes) -> bytes:
    """The same zstd frame with a header that does not state the decoded size (as streaming writers do)."""
    descriptor = frame[4]
    assert descriptor >> 5 & 1, "expected a single-segment frame"
    width = (1, 2, 4, 8)[descriptor >> 6]
    blocks = frame[5 + width :]
    window = bytes([(17 - 10) << 3])  # a 128 KiB window: enough for the chunk
    return frame[:4] + bytes([descriptor & 0b00000111]) + window + blocks


def test_a_zstd_frame_without_its_size_is_checked_too(tmp_path):
    path = tmp_path / "direct.zarr"
    write(path, "direct")
    target = chunk_file(path, "direct")
    frame = without_content_size(target.read_bytes())
    assert frame_content_size(frame) is None
    decoded = np.frombuffer(numcodecs.Zstd().decode(frame), np.float32)
    np.testing.assert_array_equal(decoded, X[DAMAGED * CHUNK : (DAMAGED + 1) * CHUNK].ravel())
    target.write_bytes(frame)
    np.testing.assert_array_equal(read_all(path, 0), X)
    short = without_content_size(numcodecs.Zstd().encode(np.ascontiguousarray(X[:5])))
    target.write_bytes(short)
    with pytest.raises(ChunkReadError, match=r"decodes to 120 bytes where the chunk holds 240"):
        read_all(path, 0)


# -- static arrays (Windows(static=...)): read whole once per process, each chunk checked as the time arrays' are ----
STATIC = np.arange(48, dtype=np.float32).reshape(6, 8) + 1000  # 2 x 2 chunks of (3, 4)
STATIC_PATHS = ["direct", "blosc", "gzip", "v2"]  # zstd, Blosc, gzip, Zarr v2's Blosc lz4 (a sharded one is refused)
STATIC_DAMAGES = [*DAMAGES[:5], "frame of fewer values", "frame of more values"]
STATIC_WINDOWS = Windows(history=1, lead=1, inputs=("x",), static=("s",))


def write_with_static(path, kind: str) -> None:
    """Array ``x`` (rows) and a static array ``s`` of four chunks, both written with ``kind``'s codec."""
    fmt = 2 if kind == "v2" else 3
    group = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    codec = {"direct": [zarr.codecs.ZstdCodec()], "blosc": [zarr.codecs.BloscCodec(cname="zstd")]}
    codec["gzip"] = [zarr.codecs.GzipCodec()]
    options = {"compressors": codec[kind]} if kind in codec else {}  # v2: zarr's default, Blosc lz4
    group.create_array("x", shape=X.shape, dtype=X.dtype, chunks=(CHUNK, 6), **options)[:] = X
    group.create_array("s", shape=STATIC.shape, dtype=STATIC.dtype, chunks=(3, 4), **options)[:] = STATIC


def a_static_frame_of(kind: str, values: int) -> bytes:
    """A valid frame of ``kind``'s codec holding ``values`` values, where a chunk of ``s`` holds 12."""
    part = np.ascontiguousarray(np.resize(STATIC, values))
    codec = {
        "direct": numcodecs.Zstd(),
        "blosc": numcodecs.Blosc(cname="zstd"),
        "gzip": numcodecs.GZip(),
        "v2": numcodecs.Blosc(cname="lz4"),  # zarr's v2 default
    }[kind]
    return codec.encode(part)


def static_chunk_file(path, kind: str):
    return path / "s" / ("1.1" if kind == "v2" else "c/1/1")


@pytest.fixture(scope="module")
def pristine_static(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine_static")
    for kind in STATIC_PATHS:
        write_with_static(root / f"{kind}.zarr", kind)
    return root


def static_of(path, num_workers: int = 0, **read_kw) -> list[np.ndarray]:
    """The static array ``s`` of every window the loader yields."""
    ds = ZarrIterableDataset(path, variables=["x"], windows=STATIC_WINDOWS, read=ReadOptions(**read_kw))
    extra = {"multiprocessing_context": "fork", "timeout": 60} if num_workers else {}
    loader = ZarrDataLoader(ds, batch_size=CHUNK, num_workers=num_workers, **extra)
    return [s for batch in loader for s in batch["s"].numpy()]


@pytest.mark.parametrize("how", STATIC_DAMAGES)
@pytest.mark.parametrize("kind", STATIC_PATHS)
def test_a_damaged_chunk_of_a_static_array_is_an_error_naming_it(pristine_static, tmp_path, kind, how):
    """Bytes cut, emptied, lengthened, random, or a valid frame of another size in one chunk of an orography:
    an error at construction naming the static array and its chunk, never values. (Random bytes of the right size
    in an uncompressed chunk are values like any others: nothing tells them apart.)"""
    path = tmp_path / f"{kind}.zarr"
    shutil.copytree(pristine_static / f"{kind}.zarr", path)
    target = static_chunk_file(path, kind)
    raw = target.read_bytes()
    if how.startswith("frame of"):  # 6 or 24 values where the chunk holds 12
        target.write_bytes(a_static_frame_of(kind, 6 if "fewer" in how else 24))
    else:
        target.write_bytes(damaged(raw, how, kind, tmp_path))
    with pytest.raises(ChunkReadError, match=r"chunk \(1, 1\) of static array 's', key 's/"):
        ZarrIterableDataset(path, variables=["x"], windows=STATIC_WINDOWS)


@pytest.mark.parametrize("kind", STATIC_PATHS)
def test_a_missing_chunk_of_a_static_array_is_an_error_or_the_fill_value_as_asked(pristine_static, tmp_path, kind):
    path = tmp_path / f"{kind}.zarr"
    shutil.copytree(pristine_static / f"{kind}.zarr", path)
    static_chunk_file(path, kind).unlink()
    with pytest.raises(ChunkReadError, match=r"missing chunk \(1, 1\) of static array 's'.*missing_chunks='fill'"):
        ZarrIterableDataset(path, variables=["x"], windows=STATIC_WINDOWS)
    shown = zarr.open_group(str(path), mode="r")["s"][...]  # zarr's own reading: the fill value in that chunk
    assert not np.array_equal(shown, STATIC)
    for num_workers in (0, 2):
        got = static_of(path, num_workers, missing_chunks="fill")
        assert len(got) == ROWS - 1
        for s in got:
            np.testing.assert_array_equal(s, shown)


def test_a_missing_chunk_of_a_static_array_over_http_is_an_error(pristine_static, tmp_path):
    """No listing over HTTP: the static array's read itself finds the chunk missing (a 404), at construction."""
    shutil.copytree(pristine_static / "blosc.zarr", tmp_path / "blosc.zarr")
    static_chunk_file(tmp_path / "blosc.zarr", "blosc").unlink()
    with HttpStoreServer(tmp_path) as server:
        url = f"{server.url}/blosc.zarr"
        with pytest.raises(ChunkReadError, match=r"missing chunk \(1, 1\) of static array 's'"):
            ZarrIterableDataset(url, variables=["x"], windows=STATIC_WINDOWS)
        shown = zarr.open_group(str(tmp_path / "blosc.zarr"), mode="r")["s"][...]
        for s in static_of(url, missing_chunks="fill"):
            np.testing.assert_array_equal(s, shown)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_missing_chunk_of_a_packed_static_array_reads_as_xarray_shows_it(tmp_path, zarr_format):
    """An int16-packed orography written by xarray with zarr's defaults: a chunk all missing values has no object
    in Zarr v2 (xarray makes the _FillValue the array's fill value), and one is deleted in v3. 'error' names the
    static array; 'fill' reads the fill value decoded as xarray decodes it (NaN for a v2 packed fill)."""
    import xarray as xr

    orog = (3000 * np.random.default_rng(2).random((6, 8))).astype(np.float32)
    orog[3:, 4:] = np.nan  # chunk (1, 1) of (3, 4) chunks: all missing
    x = np.arange(ROWS * 2, dtype=np.float32).reshape(ROWS, 2)
    ds = xr.Dataset({"x": (("time", "c"), x), "orog": (("lat", "lon"), orog)})
    ds["x"].encoding = {"chunks": (CHUNK, 2)}
    ds["orog"].encoding = {"dtype": "int16", "scale_factor": 0.1, "add_offset": 1500.0, "_FillValue": -32767}
    ds["orog"].encoding["chunks"] = (3, 4)
    ds.to_zarr(str(tmp_path / "p.zarr"), zarr_format=zarr_format, mode="w", consolidated=False)
    chunk = tmp_path / "p.zarr" / "orog" / ("1.1" if zarr_format == 2 else "c/1/1")
    if zarr_format == 3:
        chunk.unlink()
    assert not chunk.exists()
    shown = xr.open_zarr(str(tmp_path / "p.zarr"), consolidated=False)["orog"].values
    if zarr_format == 2:
        assert np.isnan(shown[3:, 4:]).all()
    windows = Windows(history=1, lead=0, static=("orog",))
    with pytest.raises(ChunkReadError, match=r"missing chunk \(1, 1\) of static array 'orog'"):
        ZarrIterableDataset(str(tmp_path / "p.zarr"), windows=windows)
    for cf_dtype in ("float32", "float64"):
        read = ReadOptions(missing_chunks="fill", cf_dtype=cf_dtype)
        got = ZarrIterableDataset(str(tmp_path / "p.zarr"), windows=windows, read=read)
        loader = ZarrDataLoader(got, batch_size=CHUNK)
        for s in (s for batch in loader for s in batch["orog"].numpy()):
            assert s.dtype == np.dtype(cf_dtype)
            np.testing.assert_array_equal(s, shown.astype(cf_dtype))


# -- a flipped byte inside compressed data: it still decodes, to other values, unless a checksum covers it ----------
BARE_CODECS = {  # prepare_zarr's codecs as they were written before they carried checksums
    "zstd": (zarr.codecs.ZstdCodec(level=3), numcodecs.Zstd()),
    "blosc-zstd": (zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"), numcodecs.Blosc()),
    "blosc-lz4": (zarr.codecs.BloscCodec(cname="lz4", clevel=3, shuffle="shuffle"), numcodecs.Blosc()),
}
RANDOM = np.random.default_rng(11).normal(size=(ROWS, 6)).astype(np.float32)  # compressed, not stored as is


def a_silent_flip(raw: bytes, decode) -> int:
    """The offset nearest the middle of ``raw`` (a chunk's compressed bytes without a checksum) where flipping a bit
    still decodes, to other values: what no decoder can notice without a checksum."""
    for at in sorted(range(len(raw)), key=lambda i: (abs(i - len(raw) // 2), i)):
        flipped = raw[:at] + bytes([raw[at] ^ 0x01]) + raw[at + 1 :]
        try:
            decoded = bytes(decode(flipped))
        except (ValueError, RuntimeError):
            continue
        if len(decoded) == len(raw_values := RANDOM[DAMAGED * CHUNK : (DAMAGED + 1) * CHUNK].tobytes()):
            if decoded != raw_values:
                return at
    raise AssertionError("no flip of one bit decodes silently")


@pytest.mark.parametrize(
    ("codec", "num_workers"), [("zstd", 0), ("zstd", 2), ("blosc-zstd", 0), ("blosc-lz4", 0), ("none", 0)]
)
def test_a_flipped_byte_inside_a_prepared_stores_compressed_chunk_is_an_error_not_other_values(
    tmp_path, codec, num_workers
):
    """A bit flipped inside a chunk's compressed data (a disk, a copy, a transfer), at a place where the frame
    still decodes: zstd without its content checksum and Blosc (no checksum of its own) decoded it to other
    values, silently, in zarr and zarrtorch alike. prepare_zarr's stores carry a checksum for every codec: an
    error naming the array and the chunk, in the main process and in workers."""
    bare = tmp_path / "bare.zarr"
    prepare_zarr({"x": RANDOM}, bare, chunk_rows=CHUNK, codec=BARE_CODECS.get(codec, ("none",))[0], progress=False)
    raw = chunk_file(bare, "direct").read_bytes()
    at = a_silent_flip(raw, BARE_CODECS[codec][1].decode) if codec in BARE_CODECS else len(raw) // 2
    path = tmp_path / "prepared.zarr"
    prepare_zarr({"x": RANDOM}, path, chunk_rows=CHUNK, codec=codec, progress=False)
    target = chunk_file(path, "direct")
    stored = target.read_bytes()
    assert stored[: at + 1] == raw[: at + 1] or codec == "zstd"  # the same data, a checksum added
    target.write_bytes(stored[:at] + bytes([stored[at] ^ 0x01]) + stored[at + 1 :])
    with pytest.raises(ChunkReadError) as err:
        read_all(path, num_workers)
    message = str(err.value)
    assert f"chunk {DAMAGED} (rows {DAMAGED * CHUNK}:{(DAMAGED + 1) * CHUNK}) of array 'x'" in message, message
    assert "'x/c/2/0'" in message, message
    assert "checksum" in message, message
    with pytest.raises((ValueError, RuntimeError), match="checksum"):  # zarr itself refuses it too
        zarr.open_group(str(path), mode="r")["x"][...]


@pytest.mark.parametrize("codec", ["blosc-lz4", "zstd"])
def test_a_flipped_byte_inside_a_prepared_shards_inner_chunk_is_an_error(tmp_path, codec):
    """Shards written by prepare_zarr carry each inner chunk's checksum (zstd's own, or crc32c after Blosc): a bit
    flipped in the middle of a shard's inner chunks is an error naming the shard, read directly by byte range."""
    path = tmp_path / "sharded.zarr"
    prepare_zarr({"x": RANDOM}, path, chunk_rows=CHUNK // 2, shard_chunks=2, codec=codec, progress=False)
    assert read_path_text(zarr.open_group(str(path), mode="r")["x"]).startswith("direct (v3 sharded")
    target = chunk_file(path, "direct")
    stored = target.read_bytes()
    index = np.frombuffer(stored[-36:-4], "<u8")  # at the shard's end: (offset, length) per inner chunk, a crc32c
    at = int(index[0] + index[1] // 2)  # the middle of the first inner chunk
    target.write_bytes(stored[:at] + bytes([stored[at] ^ 0x01]) + stored[at + 1 :])
    with pytest.raises(ChunkReadError, match=r"of array 'x', key 'x/c/2/0'.*checksum mismatch"):
        read_all(path, 0)


@pytest.mark.parametrize("flipped", ["an entry", "its crc32c"])
def test_a_flipped_byte_inside_a_prepared_shards_index_is_an_error_saying_what_to_do(tmp_path, flipped):
    """A shard's index carries a crc32c (zarr's default index codecs): a flipped byte in it was zarr's bare
    "Stored and computed checksum do not match. Stored: b'...'", naming neither the index nor what to do."""
    path = tmp_path / "sharded.zarr"
    prepare_zarr({"x": RANDOM}, path, chunk_rows=CHUNK // 2, shard_chunks=2, progress=False)
    target = chunk_file(path, "direct")
    stored = target.read_bytes()
    at = len(stored) - (36 if flipped == "an entry" else 2)  # the index at the shard's end: 2 x (offset, length), crc
    target.write_bytes(stored[:at] + bytes([stored[at] ^ 0x01]) + stored[at + 1 :])
    with pytest.raises(ChunkReadError) as err:
        read_all(path, 0)
    message = str(err.value)
    assert f"chunk {DAMAGED} (rows {DAMAGED * CHUNK}:{(DAMAGED + 1) * CHUNK}) of array 'x'" in message, message
    assert "'x/c/2/0'" in message, message
    assert "its shard index's checksum does not hold" in message and "re-copy the store" in message, message


@pytest.mark.parametrize("kind", ["direct", "v2", "v2-none", "sharded", "none-crc32c", "v2-order-F"])
def test_a_chunk_file_replaced_by_a_fifo_is_an_error_naming_it_not_a_wait_forever(pristine, tmp_path, kind):
    """breaks6: a chunk file replaced by a named pipe (FIFO) no process writes to: the direct reader's open()
    waited for a writer forever (no deadline with 0 workers; the worker timeout's minutes with workers), and so did
    zarr's own path (``v2-order-F``), in zarr's open(). Direct chunk files are opened without blocking: such a pipe
    reads as empty, a damaged chunk named as any other; on zarr's path a chunk's file that is no regular file is
    refused before zarr opens it, named as a pipe."""
    path = tmp_path / f"{kind}.zarr"
    shutil.copytree(pristine / f"{kind}.zarr", path)
    target = chunk_file(path, kind)
    target.unlink()
    os.mkfifo(target)
    outcome: list = []

    def read() -> None:
        try:
            read_all(path, 0)
            outcome.append(None)
        except ChunkReadError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():  # let the stuck open() return, so that the thread ends
        os.close(os.open(target, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a chunk that is a FIFO is still waiting after 20 s")
    assert outcome and outcome[0] is not None, "a FIFO read as a chunk"
    assert f"chunk {DAMAGED} (rows {DAMAGED * CHUNK}:{(DAMAGED + 1) * CHUNK}) of array 'x'" in str(outcome[0])
    if LAYOUTS[kind][1].startswith("zarr's path"):
        assert "is a named pipe (FIFO), not a chunk file" in str(outcome[0]), outcome[0]
