"""A small kustomize: renders a kustomization the way `kubectl kustomize` does, for the features
deploy/k8s uses (resources, nested bases, `namespace`, `labels` pairs, strategic-merge patches
with `null` deletions, lists of named items merged by name, and `$patch: delete`).

The tests validate what a cluster would receive, on machines without kubectl; where kubectl
exists, test_k8s.py checks this renders exactly what it renders.
"""

from __future__ import annotations

from pathlib import Path

import yaml

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "StorageClass", "APIService"}


def docs(p: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(p.read_text()) if d]


def merge(base, patch):
    """Strategic merge of `patch` into `base` (maps merge, `null` deletes, named lists merge)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = merge(out[k], v)
            else:
                out[k] = v
        return out
    if (isinstance(base, list) and isinstance(patch, list) and base and patch
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out = list(base)
        index = {x["name"]: i for i, x in enumerate(out)}
        new = []
        for x in patch:
            if x["name"] in index:
                out[index[x["name"]]] = merge(out[index[x["name"]]], x)
            else:
                new.append(x)
        return new + out
    return patch


def render(d: Path) -> list[dict]:
    """The objects `kubectl kustomize d` prints."""
    k = docs(d / "kustomization.yaml")[0]
    objs = []
    for r in k.get("resources", []):
        p = d / r
        objs.extend(render(p) if p.is_dir() else docs(p))
    for pt in k.get("patches", []):
        for patch in docs(d / pt["path"]):
            key = (patch["kind"], patch["metadata"]["name"])
            i = next(i for i, o in enumerate(objs) if (o["kind"], o["metadata"]["name"]) == key)
            if patch.get("$patch") == "delete":
                del objs[i]
            else:
                objs[i] = merge(objs[i], patch)
    for o in objs:
        for pairs in k.get("labels", []):
            o["metadata"].setdefault("labels", {}).update(pairs["pairs"])
        if "namespace" in k and o["kind"] not in CLUSTER_SCOPED:
            o["metadata"]["namespace"] = k["namespace"]
            for s in o.get("subjects", []) if o["kind"] in ("RoleBinding", "ClusterRoleBinding") else []:
                if s.get("kind") == "ServiceAccount":
                    s["namespace"] = k["namespace"]
    return objs
