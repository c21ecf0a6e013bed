import numpy as np
import pytest

import asyncgrad as ag


@pytest.fixture(autouse=True)
def _float64_and_seed():
    """Every test runs in float64 with a fixed seed, and leaves the defaults as it found them."""
    prev = ag.get_default_dtype()
    ag.set_default_dtype(np.float64)
    ag.manual_seed(0)
    yield
    ag.set_default_dtype(prev)
