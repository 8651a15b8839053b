"""Stand-in modules for ``torchvision`` where the registry has no build of it that loads with CPU torch.

Why: ``import streaming`` (MosaicML Streaming 0.13) imports ``streaming.vision``, whose base class comes from
``torchvision.datasets``. The torchvision wheel that matches torch 2.13 on PyPI (0.28.0) is a CUDA build: its
``_C.so`` needs ``libc10_cuda.so``, so with the CPU torch the import fails (``operator torchvision::nms does not
exist``). The benchmark uses only ``streaming.base`` (``MDSWriter``, ``StreamingDataset``), which never calls
torchvision; the stand-ins let the package import and raise if anything ever calls them. A real torchvision
that imports is always used instead.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types


def install() -> bool:
    """Put the stand-ins in ``sys.modules`` unless torchvision imports; True when they were put there."""
    try:
        import torchvision  # noqa: F401

        return False
    except Exception:  # the CUDA build fails with RuntimeError or OSError, a missing one with ImportError
        pass
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]

    def unavailable(*_args, **_kwargs):
        raise RuntimeError("torchvision is a stand-in here (benchmarks/peers/torchvision_stub.py): no CPU build loads")

    class VisionDataset:
        def __init__(self, *_args, **_kwargs):
            unavailable()

    modules = {}
    for name in ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional"):
        modules[name] = types.ModuleType(name)
        modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec() callers (transformers)
    modules["torchvision.datasets"].VisionDataset = VisionDataset
    modules["torchvision.transforms.functional"].to_tensor = unavailable
    modules["torchvision"].datasets = modules["torchvision.datasets"]
    modules["torchvision"].transforms = modules["torchvision.transforms"]
    modules["torchvision.transforms"].functional = modules["torchvision.transforms.functional"]
    sys.modules.update(modules)
    return True
