"""zarrtorch.course.models: the untrained forecast is persistence, the loss unit, the cosine schedule."""

import numpy as np
import pytest
import torch

from zarrtorch.course.models import ForecastModule

STATS = {"mean": [1.0, 0.0], "std": [2.0, 1.0], "tendency_std": 0.5, "persistence_channel": 0, "chunks": [0]}


def batch(n=3):
    g = torch.Generator().manual_seed(0)
    return {"fields": torch.randn(n, 2, 4, 8, generator=g), "target": torch.randn(n, 4, 8, generator=g)}


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")
def test_untrained_model_is_persistence_and_loss_is_in_units_of_the_change():
    model = ForecastModule(STATS, hidden=4, depth=2)
    b = batch()
    with torch.no_grad():
        assert torch.equal(model(b["fields"]), b["fields"][:, 0])
        loss = model.training_step(b, 0)
    expected = (b["fields"][:, 0] - b["target"]).pow(2).mean() / 0.5**2
    assert torch.allclose(loss, expected)


def test_cosine_schedule_reaches_two_percent():
    class FakeTrainer:
        estimated_stepping_batches = 10

    model = ForecastModule(STATS, hidden=4, depth=2, lr=1e-2)
    model._trainer = FakeTrainer()
    config = model.configure_optimizers()
    opt, sched = config["optimizer"], config["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    formula = [2e-4 + (1e-2 - 2e-4) * (1 + np.cos(np.pi * t / 10)) / 2 for t in range(10)]
    assert np.allclose(lrs, formula)
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-4)
