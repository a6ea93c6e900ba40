"""What the deployment tests share: the repository's paths, the telemetry contract's names
(otel/CONTRACT.md), YAML and Kubernetes object helpers, command-line flags and the built
binaries. test_deploy.py, test_k8s.py and test_observability_recipes.py import from here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sidecar" / "tests" / "python"))

from sidecar_support import contract  # noqa: E402 (one reader of the contract)

DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
COLLECTOR = DEPLOY / "otel-collector.yaml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yml"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
PROVISIONING = DEPLOY / "grafana" / "provisioning"
K8S = DEPLOY / "k8s"

REQUIRE_TOOLS = os.environ.get("SLOTLIGHT_REQUIRE_TOOLS") == "1"


def missing(what: str):
    """A tool or build product is missing: fail under SLOTLIGHT_REQUIRE_TOOLS=1, else skip."""
    if REQUIRE_TOOLS:
        pytest.fail(f"{what} (SLOTLIGHT_REQUIRE_TOOLS=1)")
    pytest.skip(what)


# --- the contract --------------------------------------------------------------------------


TABLES, VALUES, METRIC_LABELS = contract()
SPAN = TABLES["Spans"]
ATTR = TABLES["Attributes"]
METRIC = TABLES["Metrics"]
ENGINE_METRIC = TABLES["Engine metrics"]


def contract_value(meaning: str) -> str:
    return next(v for k, v in VALUES.items() if meaning in k)


ENGINE_SERVICE = contract_value("`service.name`")
PROVIDER = contract_value("`gen_ai.provider.name`")
OP_CHAT = contract_value("`gen_ai.operation.name` of chat completions")
OP_TEXT = contract_value("`gen_ai.operation.name` of text completions")
PATH_SOLO = contract_value("solo path")
PATH_SLOT = contract_value("a batch slot")


def is_contract_span_name(name: str) -> bool:
    """A contract span name, or a request span `{operation} {model}`."""
    return name in SPAN.values() or any(name.startswith(f"{op} ") for op in (OP_CHAT, OP_TEXT))


# --- files ---------------------------------------------------------------------------------


def yaml_docs(path: Path) -> list:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def yaml_one(path: Path):
    docs = yaml_docs(path)
    assert len(docs) == 1, f"{path}: expected one document, got {len(docs)}"
    return docs[0]


def deploy_files(*suffixes: str) -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name.endswith(suffixes))


def k8s_objects() -> list[tuple[Path, dict]]:
    """Every Kubernetes object under deploy/k8s (kustomizations and patches included)."""
    out = []
    for p in sorted(K8S.rglob("*.yaml")):
        out.extend((p, d) for d in yaml_docs(p))
    return out


def k8s_resources() -> list[tuple[Path, dict]]:
    """Objects listed by the kustomizations' `resources` (not patches, not kustomizations)."""
    out, seen = [], set()

    def walk(d: Path):
        kust = yaml_one(d / "kustomization.yaml")
        for r in kust.get("resources", []):
            p = (d / r).resolve()
            if p.is_dir():
                walk(p)
            elif p not in seen:
                seen.add(p)
                out.extend((p, o) for o in yaml_docs(p))

    walk(K8S)
    return out


def compose() -> dict:
    return yaml_one(COMPOSE)


def compose_args(svc: dict) -> list[str]:
    cmd = svc.get("command", [])
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


def flag_value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


# --- binaries ------------------------------------------------------------------------------


def binary(name: str, env: str) -> Path | None:
    """$env, else the cargo target directory's debug build, else target/debug."""
    if os.environ.get(env):
        return Path(os.environ[env])
    candidates = []
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "debug" / name)
    candidates.append(REPO / "target" / "debug" / name)
    return next((c for c in candidates if c.exists()), None)


def sidecar_bin() -> Path:
    b = binary("slotlight-sidecar", "SLOTLIGHT_SIDECAR_BIN")
    if b is None:
        missing("slotlight-sidecar is not built: run `cargo build -p slotlight-sidecar` or set SLOTLIGHT_SIDECAR_BIN")
    return b


def help_flags(*cmd: str) -> set[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    found = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", out))
    assert found, f"`{' '.join(cmd)}` printed no flags (a stale build? rebuild the workspace)"
    return found


# --- Kubernetes pods ------------------------------------------------------------------------


def pod_spec(obj: dict) -> dict | None:
    if obj.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return (obj.get("spec", {}).get("template") or {}).get("spec")
    return None


def containers(obj: dict) -> list[dict]:
    spec = pod_spec(obj) or {}
    return [*spec.get("initContainers", []), *spec.get("containers", [])]
