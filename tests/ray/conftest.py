"""One local Ray for the whole test session (starting one costs seconds)."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def ray_session():
    from vlm_decade.core.runtime import start_ray

    ray = start_ray(num_cpus=2)
    yield ray
    ray.shutdown()
