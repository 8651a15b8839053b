"""zarrtorch: feed PyTorch (and DDP) training from Zarr arrays chunked along the sample axis."""

__version__ = "0.1.0"
