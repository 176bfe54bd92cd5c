"""Each server setting is declared once (server/config/setting.py): its flags, its help
line and both environment names come from that one declaration, and no flag is claimed
by two settings."""

from __future__ import annotations

import argparse

import pytest

from server.config.flags import add_flags, settings_from_args
from server.config.setting import flags_of, llama_env_of, setting
from server.config.settings import ServerSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser


def test_every_setting_names_its_flags_and_no_flag_is_taken_twice():
    seen: dict[str, str] = {}
    for name, field in ServerSettings.model_fields.items():
        on, off = flags_of(field)
        assert on, f"{name} names no flag"
        for flag in (*on, *off):
            assert flag not in seen, f"{flag} is claimed by {seen[flag]} and {name}"
            seen[flag] = name


def test_flags_help_and_environment_come_from_the_declaration(monkeypatch):
    parser = _parser()
    text = parser.format_help()
    for name, field in ServerSettings.model_fields.items():
        on, off = flags_of(field)
        assert on[-1] in text and f"SLOTSERVE_{name.upper()}" in text
        if llama_env_of(field):
            assert llama_env_of(field) in text
    assert settings_from_args(parser.parse_args(["-c", "1024", "--no-webui"])).ctx_size == 1024
    monkeypatch.setenv("LLAMA_ARG_N_PARALLEL", "3")  # llama-server's variable, from the declaration
    assert ServerSettings().parallel == 3
    monkeypatch.setenv("SLOTSERVE_PARALLEL", "5")  # ours wins over llama-server's
    assert ServerSettings().parallel == 5


def test_a_setting_declared_without_flags_is_refused():
    class Broken(ServerSettings):
        orphan: int = setting(1, flags=())

    with pytest.raises(TypeError, match="orphan"):
        add_flags(argparse.ArgumentParser(), Broken)


@pytest.mark.parametrize("prefix", ["--hos", "--por", "--api-key-f", "--models-d"])
def test_a_flags_prefix_is_no_flag(prefix, capsys):
    """argparse would expand a unique prefix (``--hos`` to ``--host``); the router passes
    the flags it does not know to its children, whose parser would have expanded them
    past its filter. Abbreviations are refused, with the flag named."""
    from server.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", prefix, "x"])
    assert exited.value.code == 2 and prefix in capsys.readouterr().err
