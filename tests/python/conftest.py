"""Fixtures for the end-to-end tests: one sidecar and one engine exporting to it."""

from __future__ import annotations

import os

import pytest

from procs import EngineProcess, SidecarProcess, default_model


def _require_model():
    if not default_model().exists():
        if os.environ.get("SLOTLIGHT_REQUIRE_MODEL") == "1":
            pytest.fail(f"the default model is required but missing at {default_model()}")
        pytest.skip(f"the default model is not at {default_model()} (run `slotlight-engine fetch-model`)")


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
