import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import functools  # noqa: E402

import httpx  # noqa: E402
import pytest  # noqa: E402

# Every HTTP call of the tests waits up to HTTP_TIMEOUT seconds unless it names its own
# timeout (httpx's default, 5 s, fails a call on a loaded 2-core CI machine).
HTTP_TIMEOUT = 120.0
for _verb in ("request", "get", "post", "put", "patch", "delete", "options", "head", "stream"):
    setattr(httpx, _verb, functools.partial(getattr(httpx, _verb), timeout=HTTP_TIMEOUT))


@pytest.fixture(scope="session")
def gguf_lora(tmp_path_factory):
    """A tiny llama and a LoRA on it, each also as GGUF (gguf_tools.gguf_lora_files),
    converted once for the engine's and the server's tests."""
    from gguf_tools import gguf_lora_files

    return gguf_lora_files(tmp_path_factory.mktemp("gguf-lora"))
