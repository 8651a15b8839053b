"""What the checksums prepare_zarr writes with every chunk cost the decode: each codec written with its checksum
(zstd's content checksum; crc32c after Blosc) and without, every chunk decoded from memory as the loader decodes
it (``stored_decoder``), the settings taken in turn ``--repeats`` times; the best and the median pass given.

    .venv/bin/python benchmarks/checksums.py                 # 64 MiB of the benchmark's rows, 4 MiB chunks
    .venv/bin/python benchmarks/checksums.py --rows 2048 --noise

``--noise``: Gaussian noise in full precision (next to incompressible) instead of the benchmark's rows (a smooth
field with noise, rounded to 0.01): the checksum's share is largest where the codec has least to do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402

from zarrtorch import prepare_zarr  # noqa: E402
from zarrtorch._read.checksum import without_crc32c  # noqa: E402
from zarrtorch._read.fastpath import read_path_text, stored_decoder  # noqa: E402

WITHOUT = {  # prepare_zarr's codecs as they were written before they carried a checksum
    "zstd": lambda: zarr.codecs.ZstdCodec(level=3),
    "blosc-lz4": lambda: zarr.codecs.BloscCodec(cname="lz4", clevel=3, shuffle="shuffle"),
    "blosc-zstd": lambda: zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"),
}


def chunk_bytes(path: Path) -> list[bytes]:
    files = [f for f in (path / "x" / "c").rglob("*") if f.is_file()]
    return [f.read_bytes() for f in sorted(files, key=lambda f: int(f.relative_to(path / "x" / "c").parts[0]))]


def pass_seconds(decode, raws: list[bytes]) -> float:
    start = time.perf_counter()
    for raw in raws:
        decode(raw)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1024, help="rows of 64 KiB (default 1024: 64 MiB)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--noise", action="store_true", help="incompressible values instead of the benchmark's rows")
    a = p.parse_args()
    if a.noise:
        values = np.random.default_rng(0).standard_normal((a.rows, *harness.SAMPLE_SHAPE), dtype=np.float32)
    else:
        values = harness.generate_rows(0, a.rows, chunk_rows=64, seed=0)
    print(f"load average {os.getloadavg()[0]:.2f} at the start, {values.nbytes / 2**20:.0f} MiB")
    with tempfile.TemporaryDirectory() as where:
        stores = {}
        for codec, bare in WITHOUT.items():
            for checked in (False, True):
                path = Path(where) / f"{codec}-{checked}.zarr"
                prepare_zarr({"x": values}, path, chunk_mb=4, codec=codec if checked else bare(), progress=False)
                arr = zarr.open_group(str(path), mode="r")["x"]
                stores[codec, checked] = (stored_decoder(arr), chunk_bytes(path), read_path_text(arr))
        seconds = {key: [] for key in stores}
        crc_only = {codec: [] for codec in WITHOUT if codec != "zstd"}
        for _ in range(a.repeats):
            for key, (decode, raws, _) in stores.items():
                seconds[key].append(pass_seconds(decode, raws))
            for codec in crc_only:
                crc_only[codec].append(pass_seconds(without_crc32c, stores[codec, True][1]))
    for codec in WITHOUT:
        bare, checked = seconds[codec, False], seconds[codec, True]
        stored = sum(len(r) for r in stores[codec, True][1]) / 2**20
        mid_bare, mid_checked = statistics.median(bare), statistics.median(checked)
        line = (
            f"{codec:10s} {stored:5.1f} MiB stored  rows/s best {a.rows / min(bare):8.0f} -> "
            f"{a.rows / min(checked):8.0f} (x{min(bare) / min(checked):.2f}), median {a.rows / mid_bare:8.0f} -> "
            f"{a.rows / mid_checked:8.0f} (x{mid_bare / mid_checked:.2f})"
        )
        if codec in crc_only:
            line += f"; the crc32c check alone {min(crc_only[codec]) * 1e3:.1f} ms of {min(checked) * 1e3:.1f} ms"
        print(line, f"[{stores[codec, True][2]}]")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
