import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# The suite runs in pytest-xdist workers (pyproject's addopts: -n auto). Each worker's
# torch, its in-process servers and the server processes it starts share the cores with
# the other workers: one OpenMP thread each (set before anything imports torch) keeps
# the workers from stalling one another; the kernel tests ask for more (kernel_threads),
# with threads that sleep between parallel regions instead of spinning on a core the other
# worker wants (measured: the kernel, parity and recurrent tests 39 s -> 29 s in 2 workers).
if (workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT")) is not None:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(workers)))
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import functools  # noqa: E402

import httpx  # noqa: E402
import pytest  # noqa: E402

# Every HTTP call of the tests waits up to HTTP_TIMEOUT seconds unless it names its own
# timeout (httpx's default, 5 s, fails a call on a loaded 2-core CI machine). And every
# one shares one TLS context: httpx.get builds a client, whose default context loads
# certifi's bundle (~80-125 ms of CPU on the 2-core machine, even for http:// URLs) —
# for each call, and the tests poll (wait_ready, wait_for) while the server under test
# needs the CPU.
HTTP_TIMEOUT = 120.0
TLS = httpx.create_ssl_context()
for _verb in ("request", "get", "post", "put", "patch", "delete", "options", "head", "stream"):
    setattr(httpx, _verb, functools.partial(getattr(httpx, _verb), timeout=HTTP_TIMEOUT, verify=TLS))


def once_per_run(tmp_path_factory, name: str, build):
    """``build(folder)``, run by the first of the run's workers that asks, in a folder the
    workers share (a session fixture alone runs once per worker); the others wait for it
    and get what it returned. ``build`` returns something pickle can carry (paths)."""
    import fcntl
    import pickle

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    done = root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            folder = root / name
            folder.mkdir(exist_ok=True)
            done.write_bytes(pickle.dumps(build(folder)))
        return pickle.loads(done.read_bytes())


@pytest.fixture(scope="session")
def demo_f32_gguf(tmp_path_factory):
    """The demo model as a float32 GGUF written by llama.cpp's converter, made once in a
    run for the GGUF and the quantized-model tests (read only: copy before changing)."""
    from gguf_tools import convert, converter_tree
    from unavailable import unavailable

    from engine import DEMO_MODEL

    def build(folder):
        try:
            converter_tree()
        except RuntimeError as exc:  # no registry to download llama.cpp's converter from
            unavailable(f"llama.cpp's converter, the GGUF tests' oracle, cannot be had: {exc}", "SLOTSERVE_SKIP_GGUF")
        return convert(DEMO_MODEL, folder / "demo-f32.gguf", "f32")

    return once_per_run(tmp_path_factory, "demo-f32-gguf", build)


@pytest.fixture(scope="session")
def embedding_gemma_files(tmp_path_factory):
    """A tiny EmbeddingGemma folder (encoders.make_embedding_gemma) and its GGUF files,
    made once in a run: ``full`` (converted with ``--sentence-transformers-dense-modules``),
    ``bare`` (without: no Dense modules), ``q8`` (``full`` with its matrices in Q8_0).
    Returns a dict of paths (read only)."""
    import gguf
    from encoders import make_embedding_gemma
    from gguf_tools import convert_many, requantize

    def build(root):
        folder = make_embedding_gemma(root / "eg")
        dense = ("--sentence-transformers-dense-modules",)
        full, bare = convert_many([(folder, root / "eg.gguf", "f32", dense), (folder, root / "eg-bare.gguf", "f32")])
        q8 = requantize(full, root / "eg-q8_0.gguf", gguf.GGMLQuantizationType.Q8_0)
        return {"folder": folder, "full": full, "bare": bare, "q8": q8}

    return once_per_run(tmp_path_factory, "embedding-gemma", build)


@pytest.fixture(scope="session")
def gguf_lora(tmp_path_factory):
    """A tiny llama and a LoRA on it, each also as GGUF (gguf_tools.gguf_lora_files),
    converted once in a run for the engine's and the server's tests."""
    from gguf_tools import gguf_lora_files

    return once_per_run(tmp_path_factory, "gguf-lora", gguf_lora_files)


@pytest.fixture(scope="module")
def kernel_threads():
    """At least two torch threads while a module runs, so the compiled kernels' split of
    rows over threads (at::parallel_for) is exercised whatever the worker's setting."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(2, before))
    yield
    torch.set_num_threads(before)


# The longest modules first, so the workers finish together (longest processing time
# first): seconds each took in one worker of a 2-core run (--durations=0), 2026-12-07. A module missing here
# keeps its place after them; a stale figure only costs balance.
LONGEST = {
    "test_openapi.py": 136,
    "test_router.py": 93,
    "test_family_files.py": 73,
    "test_recurrent.py": 54,
    "test_template_corpus.py": 53,
    "test_quantized_models.py": 36,
    "test_router_defects.py": 34,
    "test_parity.py": 34,
    "test_image_family_files.py": 28,
    "test_server_lifecycle.py": 23,
    "test_gguf.py": 22,
    "test_server_batches.py": 16,
    "test_server_retrieval.py": 16,
    "test_server_clients.py": 14,
    "test_samplers.py": 14,
    "test_encoders.py": 13,
    "test_webui.py": 13,
    "test_server_vision.py": 12,
    "test_server_isolation.py": 12,
    "test_pre_tokenizers.py": 12,
    "test_server_prompt_cache.py": 11,
}


def pytest_collection_modifyitems(config, items):
    """Order modules longest first (a stable sort: the tests of a module keep their order);
    pyproject's --no-loadscope-reorder makes xdist hand them out in this order."""
    items.sort(key=lambda item: -LONGEST.get(item.path.name, 0))


@pytest.fixture(scope="session")
def family_files(tmp_path_factory):
    """family -> (folder, GGUF) of tests/family_files.py, built once in a run; the GGUF is
    converted from the folder as the hub spells its config where transformers 5's
    spelling is one the pinned converter cannot read (family_files.hub_spelling)."""
    from family_files import FAMILIES, build, hub_spelling
    from gguf_tools import convert_many, converter_tree
    from unavailable import unavailable

    def make(root):
        try:
            converter_tree()
        except RuntimeError as exc:
            unavailable(f"llama.cpp's converter, the GGUF oracle, cannot be had: {exc}", "SLOTSERVE_SKIP_GGUF")
        made, jobs = {}, []
        for name, fam in sorted(FAMILIES.items()):
            folder = build(root / name, name)
            made[name] = (folder, root / f"{name}.gguf")
            jobs.append((hub_spelling(folder, root / f"{name}-hub", name), made[name][1], "f32", fam.flags, fam.pre))
        convert_many(jobs)
        return made

    return once_per_run(tmp_path_factory, "family-files", make)
