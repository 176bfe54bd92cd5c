import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def gguf_lora(tmp_path_factory):
    """A tiny llama and a LoRA on it, each also as GGUF (gguf_tools.gguf_lora_files),
    converted once for the engine's and the server's tests."""
    from gguf_tools import gguf_lora_files

    return gguf_lora_files(tmp_path_factory.mktemp("gguf-lora"))
