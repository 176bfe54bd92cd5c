"""What the router hands its child servers, derived from the settings' declarations
(``setting(..., router=True)``, server/config/setting.py): the router's own settings
(where it listens, its keys, its CORS, its models' folder, ...) stay with it; every
other flag and variable reaches each child.

- ``child_args``: the router's command line less its own flags;
- ``child_env``: the router's environment less the variables of its own settings
  (``SLOTSERVE_MODELS_DIR`` or ``LLAMA_ARG_MODELS_DIR`` in a child would make it a
  router in turn, starting routers without end);
- ``preset_flag_allowed``: a preset key naming a router setting (``host``, ``port``,
  ``alias``, ``api-key``, ``models-*``, ...) is dropped, with one log line, as
  llama-server drops them: the router decides where a child listens and what it is
  called."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from server.config.setting import flags_of, llama_env_of, router_owned
from server.config.settings import ServerSettings

log = logging.getLogger("slotserve")


def _router_flags() -> dict[str, bool]:
    """Each flag of a router setting -> whether it takes a value."""
    out: dict[str, bool] = {}
    for field in ServerSettings.model_fields.values():
        if router_owned(field):
            on, off = flags_of(field)
            for flag in on:
                out[flag] = not off  # a switch takes no value
            for flag in off:
                out[flag] = False
    return out


def _router_variables() -> frozenset[str]:
    names: set[str] = set()
    for name, field in ServerSettings.model_fields.items():
        if router_owned(field):
            names.add(f"SLOTSERVE_{name.upper()}")
            if llama_env_of(field):
                names.add(llama_env_of(field))
    return frozenset(names)


ROUTER_FLAGS = _router_flags()
ROUTER_VARIABLES = _router_variables()


def child_args(argv: list[str]) -> list[str]:
    """``argv`` (the router's flags, after ``serve``) less the router's own."""
    out, i = [], 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag in ROUTER_FLAGS:
            i += 1 if "=" in argv[i] or not ROUTER_FLAGS[flag] else 2
            continue
        out.append(argv[i])
        i += 1
    return out


def child_env(environ: Mapping[str, str], secret: str) -> dict[str, str]:
    """The environment of a child: the router's less its own settings' variables (read
    case-insensitively, as pydantic-settings reads them), with the child's API key."""
    env = {k: v for k, v in environ.items() if k.upper() not in ROUTER_VARIABLES}
    env["SLOTSERVE_API_KEY"] = secret
    return env


def preset_flag_allowed(flag: str, model: str) -> bool:
    """False (and one log line) for a preset key that names a router setting."""
    if flag in ROUTER_FLAGS:
        log.warning("preset [%s]: %s is the router's to set; dropped", model, flag.lstrip("-"))
        return False
    return True
