"""Kubernetes manifests, as a cluster would receive them, without a cluster.

- Every kustomization under deploy/k8s renders (kustomize.py; where kubectl is installed, it
  renders exactly what `kubectl kustomize` renders), and every core object of every rendering
  validates strictly against the Kubernetes API schema (kubernetes-validate: unknown fields
  are errors).
- The custom resources of deploy/k8s/inference-gateway (InferencePool, Gateway, HTTPRoute)
  and the endpoint picker's configuration are checked for the fields their APIs document and
  against the objects they refer to: the pool selects the engine pods on a port they serve,
  its picker reference is a Service port of the picker, the route sends /v1 to the pool, the
  picker reads metric series the engine serves under `--metrics-compat vllm` and schedules
  with the plugins it defines; its precise prefix-cache scorer subscribes where the engines
  publish KV-cache events (port, topic, block size, model) and tokenizes with the tokenizer
  an init container exports from the engine's model.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from deploy_support import (
    K8S,
    REPO,
    TABLES,
    containers,
    pod_spec,
    binary,
    flag_value,
    flags,
    help_flags,
    missing,
)
from kustomize import render

KUBERNETES_VERSION = "1.33.0"
GATEWAY = K8S / "inference-gateway"
VLLM_METRIC = TABLES["vLLM-compatible metrics"]
# The objects whose schema the Kubernetes API does not ship (custom resources), by kind; any
# other kind without a schema fails the strict validation (SchemaNotFoundError).
CUSTOM_KINDS = {"InferencePool", "Gateway", "HTTPRoute", "ScaledObject", "PodMonitor"}


def kustomizations():
    return sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


def key(o: dict) -> tuple[str, str]:
    return o["kind"], o["metadata"]["name"]


@pytest.fixture(scope="module")
def gateway() -> dict[tuple[str, str], dict]:
    return {key(o): o for o in render(GATEWAY)}


@pytest.mark.parametrize("kdir", kustomizations(), ids=lambda p: str(p.relative_to(REPO)))
def test_rendering_matches_kubectl_kustomize(kdir):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("kubectl is not installed: kustomize.py's rendering is not compared")
    out = subprocess.run([kubectl, "kustomize", str(kdir)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    theirs = {key(o): o for o in yaml.safe_load_all(out.stdout) if o}
    ours = {key(o): o for o in render(kdir)}
    assert ours.keys() == theirs.keys()
    for k, o in theirs.items():
        assert ours[k] == o, k


@pytest.mark.parametrize("kdir", kustomizations(), ids=lambda p: str(p.relative_to(REPO)))
def test_core_objects_validate_strictly(kdir):
    kv = _kubernetes_validate()
    objs = render(kdir)
    assert objs
    checked = 0
    for o in objs:
        if o["kind"] in CUSTOM_KINDS:
            continue
        try:
            kv.validate(o, KUBERNETES_VERSION, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{kdir.relative_to(REPO)}: {key(o)}: {e.message} at {list(e.path)}")
        checked += 1
    assert checked or kdir.name == "monitoring", "no core object"


def _kubernetes_validate():
    try:
        import kubernetes_validate
    except ImportError:
        missing("kubernetes-validate is not installed (tests/python/requirements.txt)")
    return kubernetes_validate


def _engine(gateway) -> dict:
    return gateway[("Deployment", "slotlight-engine")]


def _engine_container(gateway) -> dict:
    return next(c for c in containers(_engine(gateway)) if c["name"] == "engine")


def test_the_pool_selects_the_engine_pods_on_their_api_port(gateway):
    pool = gateway[("InferencePool", "slotlight")]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    assert set(spec) <= {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    assert {"selector", "targetPorts", "endpointPickerRef"} <= set(spec), "required fields"
    sel = spec["selector"]["matchLabels"]
    pods = [o for o in gateway.values() if pod_spec(o)
            and sel.items() <= o["spec"]["template"]["metadata"]["labels"].items()]
    assert [key(p) for p in pods] == [("Deployment", "slotlight-engine")]
    assert _engine(gateway)["spec"]["replicas"] >= 2, "several replicas behind one pool"
    ports = [p["number"] for p in spec["targetPorts"]]
    assert 1 <= len(ports) <= 8 and len(set(ports)) == len(ports)
    eng = _engine_container(gateway)
    served = {p["containerPort"] for p in eng["ports"]}
    assert set(ports) <= served
    assert int(flag_value(eng["args"], "--port")) in ports
    ref = spec["endpointPickerRef"]
    assert set(ref) <= {"group", "kind", "name", "port", "failureMode"}
    assert ref.get("kind", "Service") == "Service" and ref.get("group", "") == ""
    assert ref.get("failureMode", "FailClose") in {"FailOpen", "FailClose"}
    svc = gateway[("Service", ref["name"])]
    assert ref["port"]["number"] in {p["port"] for p in svc["spec"]["ports"]}


def test_the_route_sends_the_api_to_the_pool_through_a_gateway(gateway):
    gw = gateway[("Gateway", "slotlight-gateway")]
    assert gw["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert gw["spec"]["gatewayClassName"]
    for listener in gw["spec"]["listeners"]:
        assert {"name", "protocol", "port"} <= set(listener)
        assert listener["protocol"] in {"HTTP", "HTTPS"}
    route = gateway[("HTTPRoute", "slotlight")]
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    parents = route["spec"]["parentRefs"]
    assert all(gateway.get((p.get("kind", "Gateway"), p["name"])) for p in parents), parents
    pool = gateway[("InferencePool", "slotlight")]
    pool_ports = {p["number"] for p in pool["spec"]["targetPorts"]}
    rules = route["spec"]["rules"]
    backends = [b for r in rules for b in r["backendRefs"]]
    assert backends and all(b["group"] == "inference.networking.k8s.io" and b["kind"] == "InferencePool"
                            and b["name"] == "slotlight" and b["port"] in pool_ports for b in backends)
    paths = [m["path"] for r in rules for m in r.get("matches", [])]
    assert any(p["type"] == "PathPrefix" and "/v1".startswith(p["value"].rstrip("/") or "/") for p in paths), paths
    for r in rules:
        assert set(r.get("timeouts", {})) <= {"request", "backendRequest"}


def _picker(gateway) -> tuple[dict, list[str], dict]:
    dep = gateway[("Deployment", "slotlight-epp")]
    epp = next(c for c in containers(dep) if c["name"] == "epp")
    args = [str(a) for a in epp["args"]]
    cm = gateway[("ConfigMap", "slotlight-epp")]
    path = flag_value(args, "--config-file")
    mount = next(m for m in epp["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    vol = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    cfg = yaml.safe_load(cm["data"][path.rsplit("/", 1)[1]])
    return epp, args, cfg


def test_the_picker_reads_metric_series_the_engine_serves(gateway):
    epp, args, _ = _picker(gateway)
    assert flag_value(args, "--pool-name") == "slotlight"
    assert flag_value(_engine_container(gateway)["args"], "--metrics-compat") == "vllm"
    expected = {
        "--total-queued-requests-metric": "NUM_REQUESTS_WAITING",
        "--total-running-requests-metric": "NUM_REQUESTS_RUNNING",
        "--kv-cache-usage-percentage-metric": "KV_CACHE_USAGE_PERC",
        "--lora-info-metric": "LORA_REQUESTS_INFO",
        "--cache-info-metric": "CACHE_CONFIG_INFO",
    }
    for flag, const in expected.items():
        assert flag_value(args, flag) == VLLM_METRIC[const], flag


def test_the_picker_config_schedules_with_plugins_it_defines(gateway):
    _, _, cfg = _picker(gateway)
    assert cfg["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1" and cfg["kind"] == "EndpointPickerConfig"
    plugins = {p.get("name", p["type"]): p for p in cfg["plugins"]}
    assert cfg["schedulingProfiles"]
    for profile in cfg["schedulingProfiles"]:
        refs = [r["pluginRef"] for r in profile["plugins"]]
        assert set(refs) <= set(plugins), refs
        assert any("picker" in r for r in refs), "a profile ends in a picker"
    # Prefix affinity (prefix cache and warm resume), KV usage and the queue all weigh in.
    for scorer in ("precise-prefix-cache-scorer", "kv-cache-utilization-scorer", "queue-scorer"):
        assert scorer in plugins, scorer
        assert any(r["pluginRef"] == scorer and r.get("weight", 1) > 0
                   for p in cfg["schedulingProfiles"] for r in p["plugins"]), scorer


# The precise scorer's parameters as llm-d documents them (llm-d-kv-cache's configuration
# reference and the scheduler's plugin README): any other key is a typo it would ignore.
PRECISE_KEYS = {"tokenProcessorConfig", "indexerConfig", "kvEventsConfig", "speculativeIndexing", "speculativeTTL"}
TOKEN_PROCESSOR_KEYS = {"blockSize", "blockSizeTokens", "hashSeed"}
INDEXER_KEYS = {"kvBlockIndexConfig", "tokenizersPoolConfig", "tokenProcessorConfig", "kvCacheBackendConfigs"}
TOKENIZERS_POOL_KEYS = {"modelName", "workersCount", "local", "uds", "hf"}
LOCAL_TOKENIZER_KEYS = {"autoDiscoveryDir", "autoDiscoveryTokenizerFileName", "modelTokenizerMap"}
KV_EVENTS_KEYS = {"zmqEndpoint", "topicFilter", "concurrency", "engineType", "discoverPods", "podDiscoveryConfig"}
POD_DISCOVERY_KEYS = {"podLabelSelector", "podNamespace", "socketPort"}
# Positions per KV block: every BlockStored's block_size (docs/api.md).
ENGINE_BLOCK_SIZE = 16


def _precise(gateway) -> dict:
    _, _, cfg = _picker(gateway)
    scorer = next(p for p in cfg["plugins"] if p["type"] == "precise-prefix-cache-scorer")
    params = scorer["parameters"]
    assert set(params) <= PRECISE_KEYS, set(params) - PRECISE_KEYS
    return params


def test_the_engines_publish_kv_events_where_the_precise_scorer_subscribes(gateway):
    params = _precise(gateway)
    events = params["kvEventsConfig"]
    assert set(events) <= KV_EVENTS_KEYS and set(events["podDiscoveryConfig"]) <= POD_DISCOVERY_KEYS
    # Per-pod subscribers: the scorer connects to each endpoint's address on socketPort.
    assert events["discoverPods"] is True and "zmqEndpoint" not in events
    port = events["podDiscoveryConfig"]["socketPort"]
    eng = _engine_container(gateway)
    args = [str(a) for a in eng["args"]]
    endpoint = flag_value(args, "--kv-events-endpoint")
    assert endpoint == f"tcp://*:{port}", "the engine binds the port the scorer connects to"
    assert port in {p["containerPort"] for p in eng["ports"]}
    # The topic names the pod as the scorer scores it (address:port of the pool's target
    # port) and the model it scores for, and passes the subscription's filter.
    topic = flag_value(args, "--kv-events-topic")
    m = re.fullmatch(r"kv@\$\(POD_IP\):(\d+)@(.+)", topic or "")
    assert m, topic
    assert topic.startswith(events.get("topicFilter", ""))
    pool = gateway[("InferencePool", "slotlight")]
    assert int(m.group(1)) == int(flag_value(args, "--port"))
    assert int(m.group(1)) in {p["number"] for p in pool["spec"]["targetPorts"]}
    env = {e["name"]: e for e in eng["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    model = m.group(2)
    assert model == flag_value(args, "--served-model-name")
    assert params["indexerConfig"]["tokenizersPoolConfig"]["modelName"] == model
    # Its block keys are computed over the engine's blocks.
    tp = params["tokenProcessorConfig"]
    assert set(tp) <= TOKEN_PROCESSOR_KEYS
    assert tp.get("blockSizeTokens", tp.get("blockSize")) == ENGINE_BLOCK_SIZE
    assert f"`block_size` is {ENGINE_BLOCK_SIZE}" in (REPO / "docs" / "api.md").read_text()


def test_the_precise_scorer_tokenizes_with_the_engines_exported_tokenizer(gateway):
    params = _precise(gateway)
    indexer = params["indexerConfig"]
    assert set(indexer) <= INDEXER_KEYS
    pool = indexer["tokenizersPoolConfig"]
    assert set(pool) <= TOKENIZERS_POOL_KEYS and set(pool["local"]) <= LOCAL_TOKENIZER_KEYS
    path = pool["local"]["modelTokenizerMap"][pool["modelName"]]
    assert path.endswith("/tokenizer.json")
    dep = gateway[("Deployment", "slotlight-epp")]
    spec = pod_spec(dep)
    epp = next(c for c in spec["containers"] if c["name"] == "epp")
    mount = next(m for m in epp["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert "emptyDir" in vol
    # An init container of the same pod writes that file into that volume.
    writers = [c for c in spec.get("initContainers", [])
               if c.get("args", [None])[0] == "export-tokenizer"
               and flag_value([str(a) for a in c["args"]], "--out") == path]
    assert len(writers) == 1, "an init container runs export-tokenizer --out " + path
    init = writers[0]
    assert "slotlight-engine" in init["image"]
    assert any(m["name"] == mount["name"] and m["mountPath"] == mount["mountPath"] for m in init["volumeMounts"])
    # Without --model it fetches the default model: into a volume at SLOTLIGHT_MODEL_DIR.
    env = {e["name"]: e.get("value") for e in init.get("env", [])}
    if flag_value(init["args"], "--model") is None and "SLOTLIGHT_MODEL" not in env:
        model_dir = env["SLOTLIGHT_MODEL_DIR"]
        assert any(m["mountPath"] == model_dir for m in init["volumeMounts"])


def test_every_replica_fetches_its_own_model(gateway):
    assert ("PersistentVolumeClaim", "slotlight-models") not in gateway
    vols = {v["name"]: v for v in pod_spec(_engine(gateway))["volumes"]}
    assert "emptyDir" in vols["models"] and "persistentVolumeClaim" not in vols["models"]


def test_export_tokenizer_takes_the_flags_the_readme_gives():
    b = binary("slotlight-engine", "SLOTLIGHT_ENGINE_BIN")
    if b is None:
        missing("slotlight-engine is not built: run `cargo build --workspace` or set SLOTLIGHT_ENGINE_BIN")
    real = help_flags(str(b), "export-tokenizer", "--help")
    readme = (GATEWAY / "README.md").read_text()
    used = re.findall(r"slotlight-engine export-tokenizer ([^\n`]*)", readme)
    assert used, "README.md shows export-tokenizer"
    for line in used:
        assert flags(line.split()) <= real, line
