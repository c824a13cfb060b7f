"""Shared fixtures: TensorFlow imported quietly, free loopback ports, cluster processes."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from lowlevel._tf import import_tensorflow  # noqa: E402

import_tensorflow()


@pytest.fixture
def ports():
    """A function returning n distinct free loopback ports."""
    import portpicker

    def pick(n):
        return [portpicker.pick_unused_port() for _ in range(n)]

    return pick
