"""Models in a Hugging Face hub cache (``huggingface-cli download``'s and llama.cpp's
``-hf`` layout: ``models--OWNER--NAME/snapshots/<commit>/``, the commit named by
``refs/main``), as llama-server's router lists them:

- each GGUF model file of a repository is ``OWNER/NAME:TAG``, the tag being the file
  name's last ``-`` or ``.`` part, upper-cased (``stories-Q8_0.gguf`` -> ``Q8_0``); a split
  model is one entry (its first shard); projector files (``mmproj*``) are not models but
  go with the repository's models; files without a tag and draft heads are left out;
- a snapshot holding a Hugging Face model (``config.json`` beside ``*.safetensors``) is
  ``OWNER/NAME`` (slotserve's addition: llama-server loads only GGUF).

The cache folder is found as llama.cpp finds it: ``LLAMA_CACHE``, ``HF_HUB_CACHE``,
``HUGGINGFACE_HUB_CACHE``, ``HF_HOME/hub``, ``XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub``. Nothing is downloaded."""

from __future__ import annotations

import os
import re
from pathlib import Path

from server.router.entry import ModelEntry

SPLIT = re.compile(r"(.+)-(\d{5})-of-(\d{5})$", re.IGNORECASE)
TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
DRAFT_PREFIXES = ("mtp-", "eagle3-", "dflash-", "dspark-")
PREFERRED_TAGS = ("Q4_K_M", "Q8_0")  # llama.cpp's choice when a repository is named without a tag


def hub_cache_dir() -> Path:
    env = os.environ
    for var, below in (("LLAMA_CACHE", ""), ("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""), ("HF_HOME", "hub")):
        if env.get(var):
            return Path(env[var]) / below
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "huggingface" / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def is_hub_cache(folder: Path) -> bool:
    return any((d / "snapshots").is_dir() for d in folder.glob("models--*"))


def _snapshot(repo_dir: Path) -> Path | None:
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = sorted(p for p in (repo_dir / "snapshots").glob("*") if p.is_dir())
    return snaps[-1] if snaps else None


def _split_tag(name: str) -> tuple[str, int]:
    """(TAG, shard index) of a GGUF file name."""
    stem, index = name[: -len(".gguf")], 1
    if m := SPLIT.fullmatch(stem):
        stem, index = m.group(1), int(m.group(2))
    return (m.group(1).upper() if (m := TAG.search(stem)) else ""), index


def repo_models(repo: str, snap: Path) -> dict[str, ModelEntry]:
    """The models of one repository's snapshot, by id."""
    files = sorted(p for p in snap.rglob("*") if p.is_file())
    projectors = [p for p in files if p.suffix == ".gguf" and "mmproj" in p.name.lower()]
    found: dict[str, ModelEntry] = {}
    for path in files:
        if path.suffix != ".gguf" or "mmproj" in path.name.lower() or path.name.startswith(DRAFT_PREFIXES):
            continue
        tag, index = _split_tag(path.name)
        if tag and index == 1:
            found.setdefault(f"{repo}:{tag}", ModelEntry(f"{repo}:{tag}", path, projectors[0] if projectors else None))
    if (snap / "config.json").is_file() and any(snap.glob("*.safetensors")):
        found[repo] = ModelEntry(repo, snap)
    return found


def scan_hub(folder: Path) -> dict[str, ModelEntry]:
    """Every model of the cache at ``folder``, by id (see the module's docstring)."""
    found: dict[str, ModelEntry] = {}
    for repo_dir in sorted(folder.glob("models--*")):
        snap = _snapshot(repo_dir)
        if snap is not None:
            found.update(repo_models(repo_dir.name[len("models--") :].replace("--", "/"), snap))
    return found


def resolve(spec: str, folder: Path | None = None) -> ModelEntry | None:
    """The cached model ``spec`` (``OWNER/NAME`` or ``OWNER/NAME:TAG``, llama-server's
    ``-hf``) names, or None when it is not in the cache."""
    repo, _, tag = spec.partition(":")
    repo_dir = (folder or hub_cache_dir()) / ("models--" + repo.replace("/", "--"))
    snap = _snapshot(repo_dir) if repo_dir.is_dir() else None
    if snap is None:
        return None
    models = repo_models(repo, snap)
    if tag:
        return models.get(f"{repo}:{tag.upper()}")
    for wanted in (repo, *(f"{repo}:{t}" for t in PREFERRED_TAGS)):
        if wanted in models:
            return models[wanted]
    return next(iter(models.values()), None)
