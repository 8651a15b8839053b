"""What exists for the course, beside the library: the synthetic data generator and its paths, layout
comparisons, the DDP demo, shuffle studies, measurement, baselines, the forecast model, Lightning
callbacks and the training entry point. It imports the core; the core never imports it.

Importing it silences two zarr warnings the course's stores would print on every open (text coordinate
labels whose Zarr v3 data type has no frozen spec yet; consolidated metadata not in the v3 spec): the
course chose those formats and the warnings teach nothing there. ``import zarrtorch`` alone changes no
warning filter.
"""

import warnings

warnings.filterwarnings("ignore", message=r"The data type \(FixedLengthUTF32.*does not have a Zarr V3 specification")
warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
