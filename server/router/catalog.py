"""The models a router serves: found in ``--models-dir`` and named by ``--models-preset``.

In the folder, one entry per model (llama-server's layout):
- a ``.gguf`` file (its stem is the name; a split model's shards
  ``name-00001-of-00003.gguf`` are one model, named ``name``, loaded from its first shard);
- a folder holding GGUF files: the model (the one that is not an ``mmproj*.gguf``) with
  its projector (``mmproj*.gguf``), named after the folder;
- a Hugging Face folder (``config.json``), named after the folder.

The preset file is llama-server's ini: ``[name]`` sections of ``flag = value`` lines
(``ctx-size = 4096``; ``true`` for a switch), given to that model's child server; a
section with ``model = PATH`` adds a model from outside the folder; ``[*]`` applies to
every model."""

from __future__ import annotations

import configparser
import re
from dataclasses import dataclass, field
from pathlib import Path

SHARD = re.compile(r"(.+)-(\d{5})-of-(\d{5})$")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path  # what the child's -m takes
    mmproj: Path | None = None
    args: tuple[str, ...] = field(default=())  # the preset's flags for this model


def _gguf_entry(path: Path) -> tuple[str, Path] | None:
    """(name, the file to load) of a GGUF file; None for a shard other than the first."""
    m = SHARD.fullmatch(path.stem)
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
        elif item.is_dir():
            ggufs = sorted(p for p in item.glob("*.gguf") if not p.name.startswith("mmproj"))
            models = [e[1] for e in map(_gguf_entry, ggufs) if e is not None]
            projectors = sorted(item.glob("mmproj*.gguf"))
            if len(models) == 1:
                found[item.name] = ModelEntry(item.name, models[0], projectors[0] if projectors else None)
    return found


def _flags(section: configparser.SectionProxy) -> tuple[str, ...]:
    out: list[str] = []
    for key, value in section.items():
        if key == "model":
            continue
        flag = "--" + key.lstrip("-")
        if value.strip().lower() in ("true", "on", ""):
            out.append(flag)
        elif value.strip().lower() not in ("false", "off"):
            out += [flag, value.strip()]
    return tuple(out)


def catalog(folder: Path | None, preset: Path | None) -> dict[str, ModelEntry]:
    """The folder's models with the preset's flags, plus the preset's own models.
    Raises ValueError for a preset file that is not ini or names a missing model file."""
    models = scan(folder) if folder is not None else {}
    if preset is None:
        return models
    parser = configparser.ConfigParser(default_section="\0", interpolation=None)  # "*" is a section, not inherited
    try:
        parser.read_string(preset.read_text(encoding="utf-8"))
    except (configparser.Error, OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--models-preset {preset}: {exc}") from None
    shared = _flags(parser["*"]) if parser.has_section("*") else ()
    for name in (n for n in parser.sections() if n != "*"):
        section = parser[name]
        own = _flags(section)
        if "model" in section:
            path = Path(section["model"]).expanduser()
            if not path.exists():
                raise ValueError(f"--models-preset {preset}: [{name}] model {path} does not exist")
            models[name] = ModelEntry(name, path)
        if name in models:
            models[name] = ModelEntry(name, models[name].path, models[name].mmproj, own)
    return {n: ModelEntry(e.name, e.path, e.mmproj, shared + e.args) if shared else e for n, e in models.items()}
