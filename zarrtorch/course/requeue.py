"""Requeue a Slurm job before its time limit, under DDP, without a hang.

``#SBATCH --signal=SIGUSR1@120`` makes Slurm send SIGUSR1 to every task some time before the limit. Lightning's
own handler saves a checkpoint inside the signal handler, and that save ends in a collective: ranks that take
the signal at different steps pair that barrier with another rank's gradient all-reduce, and the job hangs
until Slurm kills it (Lightning issue #21406), never requeued.

:class:`AgreedRequeue` does it in steps that every rank takes at the same point:

1. the signal handler only sets a flag (nothing else is safe there);
2. at the end of every training batch the ranks agree on the flag: one all-reduce (MAX) of one number, so
   every rank learns at the same step that one of them was signalled (each rank then prints whether and
   after which step it was signalled itself, and the agreed step);
3. every rank then saves the checkpoint at that same step (Lightning's save is collective): written to a
   temporary file and renamed, so a kill while writing never leaves a truncated newest checkpoint;
4. rank 0 runs ``scontrol requeue $SLURM_JOB_ID``, and every rank stops there, by raising :class:`Requeued` at
   that same step: the job ends as if Slurm had killed it, with no epoch-end hook and no later checkpoint (a
   ``last.ckpt`` written after it would mark the interrupted epoch as done).

The requeued job runs the same command; ``python -m zarrtorch train --resume auto`` continues from that
checkpoint (or from ``last.ckpt`` after a requeue without one, such as a node failure). Lightning's own
handler must be off: :func:`slurm_environment` gives the cluster environment that says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import torch

from zarrtorch.course.say import say


class Requeued(Exception):
    """Raised at the step of the requeue checkpoint, on every rank: the run ends there (``trainer.fit`` raises
    it; the course's training command catches it, writes its metrics and exits with 0)."""


class AgreedRequeue(L.Callback):
    """On ``signum``, save a checkpoint to ``path`` at a step every rank agrees on, requeue, and stop."""

    def __init__(self, path: str | os.PathLike, signum: int = signal.SIGUSR1, requeue: tuple[str, ...] | None = None):
        self.path = Path(path)
        self.signum = signum
        self.requeue = requeue  # default: scontrol requeue $SLURM_JOB_ID (when in a Slurm job)
        self.asked = False
        self.asked_after: int | None = None  # the steps this rank had done when its signal came
        self.saved_at: int | None = None  # the global step of the checkpoint, once saved
        self._steps = 0  # steps done by this rank, as of its last batch end
        self._previous = None

    def _on_signal(self, signum, frame) -> None:
        if not self.asked:  # flags only: the agreement and the save happen at the next batch end
            self.asked_after = self._steps
        self.asked = True

    def listen(self) -> None:
        """Take the signal from now on (before the Trainer exists, the default action would end the process)."""
        if self._previous is None:
            self._previous = signal.signal(self.signum, self._on_signal)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            self.listen()

    def on_train_start(self, trainer, pl_module) -> None:
        self._steps = trainer.global_step  # a resumed run starts at its checkpoint's step

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._previous is not None:
            signal.signal(self.signum, self._previous)
            self._previous = None

    def agreed(self, trainer, device: torch.device) -> bool:
        """Whether any rank was signalled (one all-reduce of one number; the same answer on every rank)."""
        flag = torch.tensor([1.0 if self.asked else 0.0], device=device)
        if trainer.world_size > 1:
            flag = trainer.strategy.reduce(flag, reduce_op="max")
        return bool(flag.item() > 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.saved_at is not None:
            return
        self._steps = trainer.global_step
        if not self.agreed(trainer, pl_module.device):
            return
        own = f"signal {self.signum} received after step {self.asked_after}" if self.asked else "no signal of its own"
        say(f"zarrtorch: rank {trainer.global_rank}: {own}; stops at the agreed step {trainer.global_step}", sys.stderr)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        trainer.save_checkpoint(partial)  # every rank calls it (it ends in a barrier); rank 0 writes
        self.saved_at = trainer.global_step
        if trainer.is_global_zero:
            os.replace(partial, self.path)  # the newest checkpoint is always whole
            command = self._requeue_command()
            done = subprocess.run(command, capture_output=True, text=True) if command else None
            what = (
                "not in a Slurm job: nothing requeued"
                if done is None
                else (f"`{' '.join(command)}` exit code {done.returncode} {done.stderr.strip()}")
            )
            say(
                f"zarrtorch: signal {self.signum} received; checkpoint at step {trainer.global_step} saved to "
                f"{self.path}; {what}",
                sys.stderr,
            )
        raise Requeued(f"requeued at step {trainer.global_step}; the checkpoint is {self.path}")

    def _requeue_command(self) -> list[str] | None:
        if self.requeue is not None:
            return list(self.requeue)
        job = os.environ.get("SLURM_JOB_ID")
        return ["scontrol", "requeue", job] if job else None


def slurm_environment():
    """Lightning's Slurm cluster environment, chosen explicitly and with its own requeue off.

    Explicitly: Lightning ignores Slurm when the job is named ``bash`` or ``interactive`` (``salloc``, ``srun
    --pty bash``), and every task would then start ``devices`` processes of its own. Requeue off: it is
    :class:`AgreedRequeue`'s."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    return SLURMEnvironment(auto_requeue=False)


def resume_path(out: Path) -> Path | None:
    """What ``--resume auto`` continues from: the checkpoint the requeue saved, else ``last.ckpt`` (a job
    requeued without one, such as after a node failure), the newer of the two if both exist; else nothing."""
    found = [p for p in (out / "checkpoints" / "requeue.ckpt", out / "checkpoints" / "last.ckpt") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None
