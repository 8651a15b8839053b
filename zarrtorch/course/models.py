"""A small forecast model for the course: next-step temperature from the current fields.

* :func:`channel_stats` estimates per-variable mean and spread from a few chunks spread over a store
  (reading a handful of chunks is enough for normalisation; reading the whole store is not needed).
* :class:`ForecastCNN` is a compact convolutional network on the lat/lon grid, periodic in longitude.
* :class:`ForecastModule` (a ``LightningModule``) predicts ``persistence + tendency``: the network only
  learns the change over one step, so an untrained model *is* the persistence forecast (skill 0) and
  any positive skill is learned. It logs ``train_loss``, ``val_loss`` and ``val_skill`` = 1 - MSE(model) /
  MSE(persistence) on the validation rows, and keeps a per-epoch ``history`` and a ``val_history`` (one entry
  per validation run).

Losses are mean squared errors of the tendency in units of its standard deviation, so the persistence
forecast scores about 1 and a perfect forecast 0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zarrtorch import open_arrays
from zarrtorch.layout import check_first_axis_layout


def channel_stats(
    source,
    *,
    fields: str = "fields",
    target: str | None = "target",
    persistence_channel: int = 0,
    chunks: Sequence[int] | None = None,
    n_chunks: int = 4,
    stop_row: int | None = None,
) -> dict:
    """Per-channel mean/std of ``fields`` (channel axis 1) and the std of the one-step tendency
    ``target - fields[:, persistence_channel]``, from ``n_chunks`` chunks spread evenly over the rows
    ``[0, stop_row)`` (default: the whole store), or from the chunk numbers ``chunks``. ``target=None``: a store
    without a target array (windows of ``fields``): the tendency is that of consecutive rows inside each chunk.

    Returns plain lists (JSON- and checkpoint-friendly): ``mean``, ``std``, ``tendency_std``, the chunk
    numbers read and ``persistence_channel``.
    """
    arrays = open_arrays(source, [fields] + ([target] if target else []))
    layout = check_first_axis_layout(arrays)
    stop = layout.rows if stop_row is None else int(stop_row)
    available = -(-stop // layout.chunk_rows)  # chunks holding rows before stop
    if chunks is None:
        chunks = sorted({int(round(c)) for c in np.linspace(0, available - 1, min(n_chunks, available))})
    sums = None
    count = 0
    tend_sq, tend_n = 0.0, 0
    for c in chunks:
        a, b = c * layout.chunk_rows, min(stop, (c + 1) * layout.chunk_rows)
        x = np.asarray(arrays[fields][a:b], dtype=np.float64)
        y = np.asarray(arrays[target][a:b], dtype=np.float64) if target else None
        axes = (0,) + tuple(range(2, x.ndim))
        n = x.size // x.shape[1]
        s1, s2 = x.sum(axis=axes), (x * x).sum(axis=axes)
        sums = (s1, s2) if sums is None else (sums[0] + s1, sums[1] + s2)
        count += n
        tend = y - x[:, persistence_channel] if target else np.diff(x[:, persistence_channel], axis=0)
        tend_sq += float((tend * tend).sum())
        tend_n += tend.size
    mean = sums[0] / count
    std = np.sqrt(np.maximum(sums[1] / count - mean**2, 1e-12))
    return {
        "mean": mean.tolist(),
        "std": std.tolist(),
        "tendency_std": math.sqrt(tend_sq / tend_n),
        "persistence_channel": int(persistence_channel),
        "chunks": [int(c) for c in chunks],
    }


def format_epoch(row: dict) -> str:
    """One line for an entry of :attr:`ForecastModule.history`."""
    parts = [f"epoch {row['epoch']}", f"train_loss {row['train_loss']:.4f}"]
    if "val_loss" in row:
        parts += [f"val_loss {row['val_loss']:.4f}", f"skill {row['val_skill']:.3f}"]
    parts.append(f"{row['samples_per_s']:.0f} samples/s ({row['train_samples']} rows in {row['train_seconds']:.1f} s)")
    return " | ".join(parts)


def _sum_dtype(device: torch.device) -> torch.dtype:
    """float64 for sums of squared errors, except on Apple's MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


class PeriodicConv2d(nn.Module):
    """A convolution on a lat/lon grid: wraps around in longitude (last axis), repeats the edge in latitude."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3):
        super().__init__()
        self.pad = kernel_size // 2
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.pad
        x = F.pad(x, (p, p, 0, 0), mode="circular")
        x = F.pad(x, (0, 0, p, p), mode="replicate")
        return self.conv(x)


class ForecastCNN(nn.Module):
    """``depth`` periodic 3x3 convolutions with GELU; the last layer starts at zero (predicts no change)."""

    def __init__(self, in_channels: int = 4, hidden: int = 32, depth: int = 3, kernel_size: int = 3):
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        layers: list[nn.Module] = []
        c = in_channels
        for _ in range(depth - 1):
            layers += [PeriodicConv2d(c, hidden, kernel_size), nn.GELU()]
            c = hidden
        last = PeriodicConv2d(c, 1, kernel_size)
        nn.init.zeros_(last.conv.weight)
        nn.init.zeros_(last.conv.bias)
        layers.append(last)
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(1)


class ForecastModule(L.LightningModule):
    """Lightning wrapper: MSE on the normalised tendency, skill against persistence on validation.

    Args:
        stats: output of :func:`channel_stats` (saved with the checkpoint).
        hidden, depth: size of :class:`ForecastCNN`.
        lr, weight_decay: AdamW settings.
        schedule: ``"cosine"`` (the learning rate decays to 2% of ``lr`` over the run) or ``"constant"``.
        fields, target: batch keys of the inputs and of the field to predict. Batches of windows
            (``zarrtorch.windows``: ``fields`` ``(batch, history, channel, lat, lon)`` and ``fields_target``) need no
            target array: the inputs are the last input step, the target its next step's ``persistence_channel``.
        print_epochs: rank 0 prints one line per epoch (:func:`format_epoch`).
    """

    def __init__(
        self,
        stats: dict,
        hidden: int = 16,
        depth: int = 3,
        lr: float = 3e-3,
        weight_decay: float = 0.0,
        schedule: str = "cosine",
        fields: str = "fields",
        target: str = "target",
        print_epochs: bool = False,
    ):
        super().__init__()
        if schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")
        self.save_hyperparameters()
        n_channels = len(stats["mean"])
        self.register_buffer("in_mean", torch.tensor(stats["mean"], dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("in_std", torch.tensor(stats["std"], dtype=torch.float32).view(1, -1, 1, 1))
        self.tendency_std = float(stats["tendency_std"])
        self.persistence_channel = int(stats["persistence_channel"])
        self.net = ForecastCNN(n_channels, hidden=hidden, depth=depth)
        self.history: list[dict] = []  # one entry per training epoch
        self.val_history: list[dict] = []  # one entry per validation run (several per epoch with val_check_interval)
        self._last_batch_rows = 0
        self._reset_val()
        self._train_sum: torch.Tensor | None = None  # loss x rows, rows (on the model's device: no sync per step)
        self._train_t0: float | None = None
        self._train_t1: float | None = None
        self._last_val: dict = {}

    # -- the forecast ------------------------------------------------------------------------------
    def persistence(self, fields: torch.Tensor) -> torch.Tensor:
        return fields[:, self.persistence_channel]

    def forward(self, fields: torch.Tensor) -> torch.Tensor:
        """The predicted target field (physical units) from the input fields ``(batch, channel, lat, lon)``."""
        x = (fields - self.in_mean) / self.in_std
        return self.persistence(fields) + self.tendency_std * self.net(x)

    def inputs_and_target(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The input fields ``(batch, channel, lat, lon)`` and the field to predict, from a batch of rows (with a
        target array) or of windows of ``fields``."""
        fields = batch[self.hparams.fields]
        if self.hparams.fields + "_target" in batch:  # windows: the last input step, the next step's channel
            return fields[:, -1], batch[self.hparams.fields + "_target"][:, 0, self.persistence_channel]
        return fields, batch[self.hparams.target]

    def _errors(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        fields, target = self.inputs_and_target(batch)
        return self(fields) - target, self.persistence(fields) - target

    # -- training ----------------------------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        err, _ = self._errors(batch)
        loss = err.pow(2).mean() / self.tendency_std**2
        n = err.shape[0]
        self._last_batch_rows = n
        self._train_sum = self._accumulate(self._train_sum, loss.detach().to(_sum_dtype(loss.device)) * n, n)
        self.log("train_loss", loss, on_step=True, on_epoch=False, batch_size=n, prog_bar=True)
        return loss

    def on_train_epoch_start(self) -> None:
        self._train_sum = None
        self._train_t0 = time.perf_counter()
        self._train_t1 = None

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        if self._train_t0 is None:  # an epoch resumed from a mid-epoch checkpoint starts without epoch-start hooks
            self._train_t0 = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        self._train_t1 = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        total = self._sum_over_ranks(self._train_sum if self._train_sum is not None else torch.zeros(2))
        seconds = (self._train_t1 or time.perf_counter()) - (self._train_t0 or time.perf_counter())
        samples = int(total[1])
        row = {
            "epoch": int(self.current_epoch),
            "train_loss": float(total[0] / max(total[1], 1)),
            "train_samples": samples,
            "train_seconds": seconds,
            "samples_per_s": samples / seconds if seconds > 0 else float("nan"),
        }
        self._train_t0 = None
        # identical on every rank (summed over ranks above): sync_dist only keeps Lightning from warning
        self.log("train_loss_epoch", row["train_loss"], sync_dist=True)
        if self._last_val.get("epoch") == self.current_epoch:
            row.update({k: v for k, v in self._last_val.items() if k != "epoch"})
        self.history.append(row)
        if self.hparams.print_epochs and self.trainer.is_global_zero:
            print(format_epoch(row), flush=True)

    # -- validation --------------------------------------------------------------------------------
    def _reset_val(self) -> None:
        self._val_sum: torch.Tensor | None = None  # sse model, sse persistence, values (on the model's device)

    def on_validation_epoch_start(self) -> None:
        self._reset_val()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        err, err_p = self._errors(batch)
        if "padding" in batch:  # rows repeated only to give every rank as many batches: counted once, elsewhere
            keep = ~batch["padding"].to(err.device)
            err, err_p = err[keep], err_p[keep]
        dtype = _sum_dtype(err.device)
        self._val_sum = self._accumulate(
            self._val_sum, err.to(dtype).pow(2).sum(), err_p.to(dtype).pow(2).sum(), err.numel()
        )

    def on_validation_epoch_end(self) -> None:
        if self._val_sum is None:
            return
        sse, sse_p, n = (float(v) for v in self._sum_over_ranks(self._val_sum))
        if n == 0:
            return
        metrics = {
            "val_loss": sse / n / self.tendency_std**2,
            "val_mse": sse / n,
            "persistence_mse": sse_p / n,
            "val_skill": 1.0 - sse / sse_p if sse_p > 0 else float("nan"),
        }
        for k, v in metrics.items():
            # identical on every rank (sums reduced above): averaging over ranks changes nothing
            self.log(k, v, prog_bar=k in ("val_loss", "val_skill"), sync_dist=True)
        if not self.trainer.sanity_checking:
            self._last_val = {"epoch": int(self.current_epoch), **metrics}
            self.val_history.append(
                {
                    "epoch": int(self.current_epoch),
                    "step": int(self.global_step),
                    "samples": int(self.global_step) * self._global_batch(),
                    **metrics,
                }
            )

    def _global_batch(self) -> int:
        """Training rows per optimizer step, all ranks together (from the last training batch)."""
        return self._last_batch_rows * (self.trainer.world_size if self._trainer is not None else 1)

    @staticmethod
    def _accumulate(acc: torch.Tensor | None, *values) -> torch.Tensor:
        """Add values to an accumulator kept on the device of the first tensor value (no GPU sync per step)."""
        device = next(v.device for v in values if isinstance(v, torch.Tensor))
        dtype = _sum_dtype(device)
        step = torch.stack(
            [
                v.to(dtype) if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=dtype, device=device)
                for v in values
            ]
        )
        return step if acc is None else acc + step

    def _sum_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a small tensor over DDP ranks (a copy on the CPU; identity in one process)."""
        trainer = getattr(self, "_trainer", None)
        if trainer is None or trainer.world_size == 1:
            return t.detach().cpu().clone()
        out = trainer.strategy.reduce(t.detach().to(self.device).clone(), reduce_op="sum")
        return out.cpu()

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        if self.hparams.schedule == "constant":
            return opt
        steps = max(1, int(self.trainer.estimated_stepping_batches))
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=self.hparams.lr * 0.02)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
