import pytest
from server_proc import InProcessServer


@pytest.fixture(scope="session")
def demo_server():
    """One server on the demo model with default settings and 4 slots, shared by every
    test of this folder that needs no flag of its own (a server start costs seconds)."""
    with InProcessServer(metrics=True, parallel=4) as server:
        yield server
