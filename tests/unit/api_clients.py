"""What the tests of the API clients share: a seeded PNG to send, and one event loop per test (a
client's connection pool belongs to the loop that opened it), which `run` drives."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image


def png(seed: int, size: tuple[int, int] = (48, 64)) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(autouse=True)
def loop():
    """One event loop per test of a module that imports this fixture."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    loop.close()


def run(coro):
    return asyncio.get_event_loop().run_until_complete(coro)
