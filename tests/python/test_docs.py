"""The configuration reference is rendered from the binaries' --help and must be current."""

from __future__ import annotations

import subprocess
import sys

from procs import REPO, binary


def test_configuration_reference_is_current():
    engine = binary("slotlight-engine", "SLOTLIGHT_ENGINE_BIN")
    sidecar = binary("slotlight-sidecar", "SLOTLIGHT_SIDECAR_BIN")
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "config_docs.py"), str(engine), str(sidecar), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
