"""A remote request's deadline and retries (zarrtorch._read.fetch)."""

from __future__ import annotations

import pytest

from zarrtorch import RetryPolicy
from zarrtorch._read.fetch import is_permanent


def test_a_retry_policy_takes_its_fields_by_name():
    """``RetryPolicy(5, 2)`` read as timeout 5 s and 2 retries only for whoever remembered the fields' order."""
    with pytest.raises(TypeError, match="positional"):
        RetryPolicy(5, 2)
    assert RetryPolicy(timeout_s=5, retries=2) == RetryPolicy(timeout_s=5.0, retries=2, backoff_s=0.5)


def test_the_waits_between_attempts_are_the_policys_backoffs(monkeypatch):
    """What a policy says of itself (``backoff_after``, ``seconds_until_given_up``: lesson 07's exercise and the
    object-storage page compute with them) is what ``with_retries`` sleeps: back-offs doubled per attempt."""
    from zarrtorch._read import fetch

    slept: list[float] = []
    monkeypatch.setattr(fetch.time, "sleep", slept.append)
    policy = RetryPolicy(timeout_s=0.5, retries=3, backoff_s=0.1)

    def fails():
        raise TimeoutError("no answer")

    with pytest.raises(fetch.RetriesExhausted):
        fetch.with_retries(fails, policy)
    assert slept == [policy.backoff_after(k) for k in range(policy.retries)] == pytest.approx([0.1, 0.2, 0.4])
    assert policy.seconds_until_given_up() == pytest.approx(4 * 0.5 + sum(slept))


@pytest.mark.parametrize(
    ("name", "permanent"),
    [
        ("PermissionDeniedError", True),
        ("UnauthenticatedError", True),
        ("NotFoundError", True),
        ("InvalidPathError", True),
        ("GenericError", False),  # obstore's catch-all for transfer faults: worth another try
    ],
)
def test_obstores_refusals_are_permanent_and_its_transfer_faults_are_not(name, permanent):
    """A store served by obstore whose credentials are refused spent every retry of every chunk before failing."""
    errors = pytest.importorskip("obstore.exceptions", reason="obstore is not installed")
    assert is_permanent(getattr(errors, name)("refused")) is permanent
