"""The peers' store as the NetCDF file ``anemoi-datasets create`` reads: one date per row, 16 variables on a
32 x 32 latitude-longitude grid. Runs in the project's environment (the anemoi environment's zarr 2.18 cannot
open the Zarr v3 store); called by ``anemoi_peer.py``'s conversion, which times it with the rest.

Each row becomes one 6-hourly date from 2000-01-01 00:00; channel ``c`` of the sample becomes variable
``v{c:02d}``. Nothing is resampled: the values are the store's, as float32. Three rows go beside it
(``.check.npz``) for the conversion to compare with what anemoi built.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import xarray as xr
import zarr

FIRST_DATE, STEP = "2000-01-01T00:00:00", "6h"


def export(store: str, out: str) -> None:
    group = zarr.open_group(store, mode="r")
    x = group["x"][:]  # (rows, 16, 32, 32): 128 MiB at the benchmark's default size
    rows, channels, n_lat, n_lon = x.shape
    lat = np.linspace(-90 + 90 / n_lat, 90 - 90 / n_lat, n_lat)
    lon = np.arange(n_lon) * (360 / n_lon)
    coords = {
        "time": pd.date_range(FIRST_DATE, periods=rows, freq=STEP),
        "latitude": ("latitude", lat, {"units": "degrees_north", "standard_name": "latitude"}),
        "longitude": ("longitude", lon, {"units": "degrees_east", "standard_name": "longitude"}),
    }
    variables = {f"v{c:02d}": (("time", "latitude", "longitude"), x[:, c], {"units": "1"}) for c in range(channels)}
    xr.Dataset(variables, coords=coords).to_netcdf(out, engine="h5netcdf")
    some = np.array([0, rows // 2, rows - 1])  # for the conversion's check, in the anemoi environment
    np.savez(out + ".check.npz", idx=some, x=x[some].reshape(len(some), channels, n_lat * n_lon))


if __name__ == "__main__":
    export(sys.argv[1], sys.argv[2])
