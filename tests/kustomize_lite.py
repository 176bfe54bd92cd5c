"""A small renderer for the kustomize features deploy/ uses, so the tests check what
`kubectl kustomize` would apply without a kustomize binary (CI installs from PyPI only).

Supported: resources (files and directories), namespace, labels (metadata only),
images, replicas, configMapGenerator (files), patches (strategic merge by kind + name;
lists of named items merged by ``name``). Anything else in a kustomization is an error,
so the manifests cannot drift past what is checked.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

KNOWN = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "replicas",
    "configMapGenerator",
    "patches",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def build(folder: Path) -> list[dict]:
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kust) - KNOWN
    if unknown:
        raise ValueError(f"{folder}: kustomize fields not covered by the test renderer: {sorted(unknown)}")
    docs: list[dict] = []
    for res in kust.get("resources", []):
        path = folder / res
        docs += build(path) if path.is_dir() else load_docs(path)
    for gen in kust.get("configMapGenerator", []):
        opts = gen.get("options", {})
        if not opts.get("disableNameSuffixHash"):
            raise ValueError("name suffix hashes are not modelled")
        data = {Path(f).name: (folder / f).read_text() for f in gen.get("files", [])}
        meta = {"name": gen["name"], "labels": dict(opts.get("labels", {}))}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for patch_ref in kust.get("patches", []):
        for patch in load_docs(folder / patch_ref["path"]):
            target = _find(docs, patch["kind"], patch["metadata"]["name"])
            merged = merge(target, patch)
            target.clear()
            target.update(merged)
    for rep in kust.get("replicas", []):
        _find(docs, "Deployment", rep["name"])["spec"]["replicas"] = rep["count"]
    for img in kust.get("images", []):
        for container in _containers(docs):
            name, _, _ = container["image"].partition(":")
            if name == img["name"]:
                container["image"] = f"{img.get('newName', name)}:{img['newTag']}"
    for group in kust.get("labels", []):
        if group.get("includeSelectors") or group.get("includeTemplates"):
            raise ValueError("only metadata labels are modelled")
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(group["pairs"])
    if "namespace" in kust:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = kust["namespace"]
    return docs


def merge(base, patch):
    """Strategic merge as kustomize does it for these manifests."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(x, dict) and "name" in x for x in patch):
        out = copy.deepcopy(base)
        by_name = {x.get("name"): i for i, x in enumerate(out) if isinstance(x, dict)}
        for item in patch:
            if item["name"] in by_name:
                out[by_name[item["name"]]] = merge(out[by_name[item["name"]]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def _find(docs: list[dict], kind: str, name: str) -> dict:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise KeyError(f"no {kind} {name}")


def _containers(docs: list[dict]):
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        yield from spec.get("containers", [])
