import pytest

from sidecar_support import SidecarProcess


@pytest.fixture
def sidecar():
    sc = SidecarProcess()
    try:
        yield sc
    finally:
        sc.close()
