"""A remote request's deadline and retries (zarrtorch._read.fetch)."""

from __future__ import annotations

import pytest

from zarrtorch import RetryPolicy


def test_a_retry_policy_takes_its_fields_by_name():
    """``RetryPolicy(5, 2)`` read as timeout 5 s and 2 retries only for whoever remembered the fields' order."""
    with pytest.raises(TypeError, match="positional"):
        RetryPolicy(5, 2)
    assert RetryPolicy(timeout_s=5, retries=2) == RetryPolicy(timeout_s=5.0, retries=2, backoff_s=0.5)
