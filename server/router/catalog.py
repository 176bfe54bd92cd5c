"""The models a router serves: found in ``--models-dir`` and named by ``--models-preset``.

In the folder, one entry per model (llama-server's layout):
- a ``.gguf`` file (its stem is the name; a split model's shards
  ``name-00001-of-00003.gguf`` are one model, named ``name``, loaded from its first shard);
- a folder holding GGUF files: the model (the one that is not an ``mmproj*.gguf``) with
  its projector (``mmproj*.gguf``), named after the folder;
- a Hugging Face folder (``config.json``), named after the folder;
- a Hugging Face hub cache's repositories, as ``OWNER/NAME:TAG`` (server/router/hub_cache.py),
  when the folder is such a cache.

The preset file is llama-server's ini: ``[name]`` sections of ``flag = value`` lines
(``ctx-size = 4096``; ``true`` for a switch), given to that model's child server; a
section with ``model = PATH`` or ``hf-repo = OWNER/NAME[:TAG]`` (from the hub cache,
never downloaded) adds a model from outside the folder, ``spec-draft-hf`` its draft
model; ``dedup-cache-models = true`` hides the cache entries a section uses from
``/models`` (they are still served); ``[*]`` applies to every model."""

from __future__ import annotations

import configparser
from pathlib import Path

from server.router.entry import ModelEntry
from server.router.handoff import preset_flag_allowed
from server.router.hub_cache import SPLIT, hub_cache_dir, is_hub_cache, resolve, scan_hub

REPO_KEYS = ("hf-repo", "hf")  # -> -m (a cached repository)
DRAFT_REPO_KEYS = ("spec-draft-hf", "hf-repo-draft", "hfd")  # -> --model-draft
NOT_FLAGS = {"model", "dedup-cache-models", "load-on-startup", *REPO_KEYS, *DRAFT_REPO_KEYS}
TRUE = ("true", "on", "1", "yes", "")


def _gguf_entry(path: Path) -> tuple[str, Path] | None:
    """(name, the file to load) of a GGUF file; None for a shard other than the first."""
    m = SPLIT.fullmatch(path.stem)
    if m is None:
        return path.stem, path
    return (m.group(1), path) if int(m.group(2)) == 1 else None


def scan(folder: Path) -> dict[str, ModelEntry]:
    """The models in ``folder`` (see the module's docstring), by name."""
    found: dict[str, ModelEntry] = {}
    for item in sorted(folder.iterdir()):
        if item.is_file() and item.suffix == ".gguf" and not item.name.startswith("mmproj"):
            entry = _gguf_entry(item)
            if entry is not None:
                found[entry[0]] = ModelEntry(entry[0], entry[1])
        elif item.is_dir() and (item / "config.json").is_file():
            found[item.name] = ModelEntry(item.name, item)
        elif item.is_dir() and not item.name.startswith("models--"):
            ggufs = sorted(p for p in item.glob("*.gguf") if not p.name.startswith("mmproj"))
            models = [e[1] for e in map(_gguf_entry, ggufs) if e is not None]
            projectors = sorted(item.glob("mmproj*.gguf"))
            if len(models) == 1:
                found[item.name] = ModelEntry(item.name, models[0], projectors[0] if projectors else None)
    if is_hub_cache(folder):
        found.update(scan_hub(folder))
    return found


def _flags(section: configparser.SectionProxy) -> tuple[str, ...]:
    out: list[str] = []
    for key, value in section.items():
        if key.lstrip("-") in NOT_FLAGS:
            continue
        flag = "--" + key.lstrip("-")
        if not preset_flag_allowed(flag, section.name):
            continue
        if value.strip().lower() in ("true", "on", ""):
            out.append(flag)
        elif value.strip().lower() not in ("false", "off"):
            out += [flag, value.strip()]
    return tuple(out)


def _value(section: configparser.SectionProxy, keys: tuple[str, ...]) -> str | None:
    return next((section[k].strip() for k in keys if k in section), None)


def catalog(folder: Path | None, preset: Path | None) -> dict[str, ModelEntry]:
    """The folder's models with the preset's flags, plus the preset's own models.
    Raises ValueError for a preset file that is not ini or names a missing model."""
    models = scan(folder) if folder is not None else {}
    if preset is None:
        return models
    parser = configparser.ConfigParser(default_section="\0", interpolation=None)  # "*" is a section, not inherited
    try:
        parser.read_string(preset.read_text(encoding="utf-8"))
    except (configparser.Error, OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--models-preset {preset}: {exc}") from None
    cache = folder if folder is not None and is_hub_cache(folder) else hub_cache_dir()
    star = parser["*"] if parser.has_section("*") else None
    shared = _flags(star) if star is not None else ()
    dedup_all = star is not None and star.get("dedup-cache-models", "false").strip().lower() in TRUE
    hidden: set[Path] = set()
    for name in (n for n in parser.sections() if n != "*"):
        section, own = parser[name], _flags(parser[name])
        used: list[Path] = []
        if "model" in section:
            path = Path(section["model"]).expanduser()
            if not path.exists():
                raise ValueError(f"--models-preset {preset}: [{name}] model {path} does not exist")
            models[name] = ModelEntry(name, path)
        elif (repo := _value(section, REPO_KEYS)) is not None:
            found = resolve(repo, cache)
            if found is None:
                raise ValueError(f"--models-preset {preset}: [{name}] {repo} is not in the hub cache {cache}")
            models[name], used = ModelEntry(name, found.path, found.mmproj), [found.path]
        if (draft := _value(section, DRAFT_REPO_KEYS)) is not None:
            found = resolve(draft, cache)
            if found is None:
                raise ValueError(f"--models-preset {preset}: [{name}] draft {draft} is not in the hub cache {cache}")
            own, used = (*own, "--model-draft", str(found.path)), [*used, found.path]
        if name in models:
            models[name] = ModelEntry(name, models[name].path, models[name].mmproj, own)
        if dedup_all or section.get("dedup-cache-models", "false").strip().lower() in TRUE:
            hidden.update(used)
    return {
        n: ModelEntry(e.name, e.path, e.mmproj, shared + e.args, hidden=e.path in hidden and n not in parser)
        for n, e in models.items()
    }
