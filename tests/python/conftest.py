"""Fixtures for the end-to-end tests: one sidecar and one engine exporting to it."""

from __future__ import annotations

import pytest

from procs import EngineProcess, SidecarProcess, require_model as _require_model


@pytest.fixture(scope="module")
def sidecar():
    s = SidecarProcess()
    yield s
    s.close()


@pytest.fixture(scope="module")
def engine(sidecar):
    _require_model()
    e = EngineProcess("--batch", "8", "--progress-interval-ms", "100", otlp=f"http://{sidecar.grpc}")
    yield e
    e.close()


@pytest.fixture(scope="module")
def lone_engine():
    _require_model()
    e = EngineProcess("--batch", "4")
    yield e
    e.close()
