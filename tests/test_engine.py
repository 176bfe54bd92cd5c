"""Engine behaviour: stop conditions, waves of prompts, validation, the demo model."""

from __future__ import annotations

import subprocess
import sys

import pytest
from checkpoints import make_checkpoint

from engine import DEMO_MODEL, Engine, SamplingParams


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("ck") / "m", "qwen3")
    return Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=2, block_size=4)


def test_stop_string_ends_generation_and_is_not_emitted(engine):
    free = engine.generate([[10, 20, 30]], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0]
    assert len(free.text) >= 6
    stop = free.text[3:5]
    out = engine.generate([[10, 20, 30]], SamplingParams(temperature=0.0, max_tokens=24, stop=(stop,)))[0]
    assert out.finish_reason == "stop"
    assert out.text == free.text[: free.text.find(stop)]
    assert out.token_ids == free.token_ids[: len(out.token_ids)]


def test_more_prompts_than_sequences_run_in_waves(engine):
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    prompts = [[i + 1, i + 2] for i in range(5)]
    batched = engine.generate(prompts, params)
    assert [g.finish_reason for g in batched] == ["length"] * 5
    assert [g.token_ids for g in batched] == [engine.generate([p], params)[0].token_ids for p in prompts]
    engine.memory.integrity_check()


def test_eos_stops_unless_ignored(engine):
    first = engine.generate([[7, 8, 9]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))[0]
    eos = first.token_ids[1]
    kept = engine.tokenizer.eos_ids  # the module fixture's: put back as it was
    engine.tokenizer.eos_ids = frozenset({eos})
    try:
        stopped = engine.generate([[7, 8, 9]], SamplingParams(temperature=0.0, max_tokens=3))[0]
    finally:
        engine.tokenizer.eos_ids = kept
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == first.token_ids[: first.token_ids.index(eos) + 1]


def test_add_sequence_rejects_bad_input_and_changes_nothing(engine):
    params = SamplingParams(temperature=0.0)
    for bad in ([], [10**6], list(range(1, 300))):
        with pytest.raises(ValueError):
            engine.add_sequence(bad, params, seq_id=0)
    assert not engine.running
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)


def test_demo_model_writes_python():
    demo = Engine.from_pretrained(str(DEMO_MODEL), n_seq_max=1)
    out = demo.generate(["import os\n\n\ndef "], SamplingParams(temperature=0.0, max_tokens=40))[0]
    assert "(" in out.text and ":" in out.text  # a def line: name(args):


def test_console_script_generates_without_importing_torchs_compiler():
    """Loading and running a model never imports torch._dynamo (1.3-1.7 s of a process's
    start: what torch's meta-device init and arithmetic would pull in), nor sympy
    (``Module.to_empty`` on the meta-built model imported it through torch's reference
    ops: 0.4 s of each server's start)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "server.cli", "generate", "-n", "8", "--seed", "1", "class Foo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("class Foo") and "finish_reason" in proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" in imported and "torch._dynamo" not in imported and "sympy" not in imported
