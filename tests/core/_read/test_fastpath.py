"""The direct decode gives exactly what zarr gives, from a local directory or any other store's ``get``."""

import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor

import numcodecs
import numpy as np
import pytest
import zarr

from zarrtorch import prepare_zarr
from zarrtorch._read.fastpath import Span, _local_reader, direct_decoder, read_buffer_bytes
from zarrtorch._read.reader import ChunkReadError, PieceReader


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    data = {
        "x": rng.random((150, 3, 4)).astype("f4"),
        "n": np.arange(150, dtype="i8"),
        "b": rng.integers(0, 255, (150, 2), dtype="u1"),
    }
    return prepare_zarr(data, tmp_path / "s.zarr", chunk_rows=64, progress=False), data


def test_direct_decode_equals_zarr_including_partial_last_chunk(store):
    group, data = store
    reader = PieceReader(dict(group.arrays()), 64)
    assert all(reader._direct[name] is not None for name in data)
    for start, stop in [(0, 64), (64, 100), (128, 150), (130, 131)]:
        piece = reader.read_piece(start, stop)
        for name, values in data.items():
            np.testing.assert_array_equal(piece[name], values[start:stop])


@pytest.mark.parametrize("codec", ["none", "blosc-lz4"])
def test_prepare_zarrs_other_codecs_are_decoded_directly_too(tmp_path, codec):
    g = prepare_zarr({"x": np.ones((10, 2), "f4")}, tmp_path / "c.zarr", chunk_rows=4, codec=codec, progress=False)
    assert direct_decoder(g["x"]) is not None
    np.testing.assert_array_equal(PieceReader({"x": g["x"]}, 4).read_piece(8, 10)["x"], np.ones((2, 2)))


def test_arrays_in_other_stores_are_read_through_their_get_shards_by_byte_range():
    g = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    plain = g.create_array("p", shape=(8, 2), chunks=(4, 2), dtype="f4", compressors=zarr.codecs.ZstdCodec())
    plain[:] = np.arange(16, dtype="f4").reshape(8, 2)
    sharded = g.create_array("s", shape=(8, 2), chunks=(2, 2), shards=(4, 2), dtype="f4")
    sharded[:] = np.arange(16, dtype="f4").reshape(8, 2)
    decode = direct_decoder(plain)  # a store that is not a local directory: one get per chunk
    np.testing.assert_array_equal(decode("p/c/1/0"), plain[4:8])
    decode = direct_decoder(sharded)  # the shard's index, then its inner chunks by byte range
    np.testing.assert_array_equal(decode("s/c/1/0", rows=Span(0, 4, 4)), sharded[4:8])
    np.testing.assert_array_equal(decode("s/c/0/0", rows=Span(2, 4, 4))[2:4], sharded[2:4])


def test_read_buffer_holds_any_chunk_file_and_is_reused(tmp_path):
    """The per-thread buffer is sized for the largest zstd frame of a chunk (incompressible data, the worst
    case, fits) and one buffer serves chunk files of every size: no reallocation, nothing left to the C
    allocator to keep."""
    rng = np.random.default_rng(1)
    noise = rng.integers(0, 2**32, (300, 50), dtype=np.uint32)  # incompressible
    noise[200:] = 0  # and small files
    group = prepare_zarr({"x": noise}, tmp_path / "n.zarr", chunk_rows=64, progress=False)
    arr = group["x"]
    files = sorted((tmp_path / "n.zarr" / "x").rglob("*"))
    sizes = [f.stat().st_size for f in files if f.is_file() and f.name != "zarr.json"]
    assert len(sizes) == 5 and max(sizes) > 64 * 50 * 4  # a zstd frame of noise is larger than the data
    assert read_buffer_bytes(arr) >= max(sizes)
    read = _local_reader(arr.store_path.store, read_buffer_bytes(arr))
    buffers = set()
    for c in [4, 0, 3, 1]:  # small, big, small, big
        view = read(f"x/{arr.metadata.encode_chunk_key((c, 0))}")
        buffers.add(id(view.obj))
        del view
    assert len(buffers) == 1
    fortran = zarr.create_array(tmp_path / "f.zarr", shape=(8, 4), chunks=(2, 4), dtype="f4", zarr_format=2, order="F")
    assert read_buffer_bytes(fortran) == 0  # read through zarr's codecs: no such buffer


def _blosc_rows(tmp_path, rows: int = 6):
    """A Zarr v2 array of one-row Blosc lz4 + shuffle chunks, as a WeatherBench2-style variable is stored."""
    values = np.random.default_rng(2).random((rows, 8, 8)).astype("f4")
    arr = zarr.create_array(
        tmp_path / "wb2.zarr",
        shape=values.shape,
        chunks=(1, 8, 8),
        dtype="f4",
        zarr_format=2,
        compressors=numcodecs.Blosc(cname="lz4", clevel=1, shuffle=numcodecs.Blosc.SHUFFLE),
    )
    arr[:] = values
    return arr, values


def test_a_blosc_chunk_is_decoded_without_asking_which_process_runs_it(tmp_path, monkeypatch):
    """numcodecs' ``blosc.decompress`` asked ``multiprocessing.current_process()`` (and took Blosc's global lock)
    for every chunk: with 4 KiB one-row chunks, more Python than the decode itself."""
    arr, values = _blosc_rows(tmp_path)
    asked = []
    real = multiprocessing.current_process
    monkeypatch.setattr(multiprocessing, "current_process", lambda: asked.append(1) or real())
    decode = direct_decoder(arr)
    for row in range(len(values)):
        np.testing.assert_array_equal(decode(f"{row}.0.0"), values[row : row + 1])
    assert asked == []


def test_blosc_chunks_read_by_several_threads_at_once_are_each_decoded_from_their_own_bytes(tmp_path):
    """A local Blosc chunk is read into its thread's buffer and decoded from that buffer's address, known once per
    thread (no export of the buffer per chunk): threads reading at once never decode another's bytes."""
    arr, values = _blosc_rows(tmp_path, rows=32)
    decode = direct_decoder(arr)

    def read_at_random(seed: int) -> None:
        for row in np.random.default_rng(seed).integers(0, len(values), 400):
            np.testing.assert_array_equal(decode(f"{row}.0.0"), values[row : row + 1])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(read_at_random, range(4)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("kind", ["buffer", "frame"])
def test_a_threads_read_buffer_stays_its_process_own_after_a_fork(kind):
    """The reading threads' buffers are mapped memory, mapped shared by mmap's default: a forked child inherits the
    forking thread's buffer (a loader iterated in the main thread, then workers forked from it), and its reads wrote
    the very pages its parent decodes chunks from."""
    from zarrtorch._read import fastpath

    if kind == "buffer":
        buffer = fastpath._thread_buffer(4096)
        view = buffer(4)
    else:
        frame = fastpath._thread_frame(4096)
        view = frame()[0][:4]
    view[:] = b"mine"
    pid = os.fork()
    if pid == 0:  # the child reads into the same thread's buffer
        theirs = buffer(4) if kind == "buffer" else frame()[0][:4]
        theirs[:] = b"kid!"
        os._exit(0 if bytes(theirs) == b"kid!" else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert bytes(view) == b"mine"


def test_a_chunk_file_is_read_without_an_fstat(tmp_path, monkeypatch):
    """Each chunk file was opened, ``fstat``-ed for its size, read and closed: the ``fstat``, a system call per
    chunk, is not needed where the thread's buffer holds the largest chunk a file can store."""
    arr, values = _blosc_rows(tmp_path)
    decode = direct_decoder(arr)
    stats = []
    real = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: stats.append(fd) or real(fd))
    for row in range(len(values)):
        np.testing.assert_array_equal(decode(f"{row}.0.0"), values[row : row + 1])
    assert stats == []


def test_a_chunk_file_larger_than_the_read_buffer_is_read_whole_and_refused(tmp_path):
    """A file that fills the thread's buffer is read again at its size: its frame followed by more bytes than
    the buffer holds is refused as damaged, not cut at the buffer's end."""
    arr, values = _blosc_rows(tmp_path)
    path = tmp_path / "wb2.zarr" / "2.0.0"
    path.write_bytes(path.read_bytes() + bytes(read_buffer_bytes(arr) + 10))
    reader = PieceReader({"x": arr}, 1)
    with pytest.raises(ChunkReadError, match=r"chunk 2 .*Blosc frame says \d+ bytes, the stored chunk has \d+"):
        reader.read_piece(2, 3)
    np.testing.assert_array_equal(reader.read_piece(3, 4)["x"], values[3:4])
