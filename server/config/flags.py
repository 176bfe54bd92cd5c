"""The command line: each server setting under the flags its declaration names
(server/config/setting.py), parsed into ``ServerSettings`` (server/config/settings.py).
Unset flags fall through to the environment, then the defaults."""

from __future__ import annotations

import argparse

from server.config.setting import flags_of, llama_env_of
from server.config.settings import ServerSettings


def add_flags(parser: argparse.ArgumentParser, settings: type[ServerSettings] = ServerSettings) -> None:
    """One flag per setting (a switch: its on and off flags); defaults are None so unset
    flags fall through to the environment. The help line says the default and the
    variables that set it."""
    for name, field in settings.model_fields.items():
        flags, off = flags_of(field)
        if not flags:
            raise TypeError(f"setting {name!r} names no flag: declare it with setting(..., flags=...)")
        envs = ", ".join(filter(None, (f"SLOTSERVE_{name.upper()}", llama_env_of(field))))
        default = "" if field.default is None or name == "model" else f"default {field.default}; "
        help_ = f"{field.description} ({default}env {envs})"
        if off:
            parser.add_argument(*flags, dest=name, action="store_true", default=None, help=help_)
            parser.add_argument(*off, dest=name, action="store_false", default=None, help=f"turn {flags[-1]} off")
        else:
            parser.add_argument(*flags, dest=name, default=None, metavar=name.upper(), help=help_)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    given = {k: v for k, v in vars(args).items() if k in ServerSettings.model_fields and v is not None}
    return ServerSettings(**given)
