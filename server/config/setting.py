"""One declaration per server setting: ``setting(...)`` is pydantic's ``Field`` plus
the command-line flags that set it (a switch: ``flags`` turn it on, ``off`` turns it
off) and the variable llama-server reads for it. The flags, the ``--help`` line, the
``SLOTSERVE_<NAME>`` variable and llama-server's variable all derive from it
(server/config/flags.py, server/config/settings.py). ``router=True`` marks a setting
the router keeps for itself in router mode (``--models-dir``): its flags are not passed
to the child servers, its variables are taken out of their environment, and a preset
key naming it is dropped (server/router/)."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic.fields import FieldInfo


def setting(
    default: Any,
    *,
    flags: tuple[str, ...],
    off: tuple[str, ...] = (),
    llama_env: str | None = None,
    router: bool = False,
    **field: Any,
) -> Any:
    extra = {"flags": list(flags), "off": list(off), "llama_env": llama_env, "router": router}
    return Field(default, json_schema_extra=extra, **field)


def flags_of(field: FieldInfo) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The flags that set the field, and (a switch) those that turn it off."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return tuple(extra.get("flags", ())), tuple(extra.get("off", ()))


def llama_env_of(field: FieldInfo) -> str | None:
    """The variable llama-server reads for the same flag (llama.cpp common/arg.cpp)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return extra.get("llama_env")


def router_owned(field: FieldInfo) -> bool:
    """The router keeps this setting (router mode): its children never see it."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return bool(extra.get("router"))
