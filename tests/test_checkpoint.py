"""Loading checkpoints: transformers 4 and 5 config spellings, sharding, clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from checkpoints import make_checkpoint
from safetensors.torch import load_file, save_file

from engine import CheckpointError, Engine, SamplingParams, UnsupportedArchitecture

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ck") / "llama", "llama", tie_word_embeddings=False)


def copy(base, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(base, dst)
    return dst


def edit_config(folder, fn):
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_transformers4_config_spelling_loads_the_same(base, tmp_path):
    v4 = copy(base, tmp_path)

    def to_v4(cfg):
        cfg["torch_dtype"] = cfg.pop("dtype", "float32")
        cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]
        cfg["rope_scaling"] = None

    edit_config(v4, to_v4)
    want = Engine.from_pretrained(str(base)).generate([[1, 2, 3]], GREEDY)[0].token_ids
    assert Engine.from_pretrained(str(v4)).generate([[1, 2, 3]], GREEDY)[0].token_ids == want


def test_sharded_checkpoint(base, tmp_path):
    """A folder as save_pretrained shards it (model-0000K-of-0000N.safetensors and the
    index) answers as the same weights in one file."""
    sharded = make_checkpoint(tmp_path / "sharded", "llama", tie_word_embeddings=False, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file() and len(list(sharded.glob("*.safetensors"))) >= 3
    want = Engine.from_pretrained(str(base)).generate([[4, 5]], GREEDY)[0].token_ids
    assert Engine.from_pretrained(str(sharded)).generate([[4, 5]], GREEDY)[0].token_ids == want


def test_bfloat16_runs(base):
    engine = Engine.from_pretrained(str(base), dtype="bfloat16")
    assert engine.model.lm_head.weight.dtype == torch.bfloat16
    assert len(engine.generate([[1, 2, 3]], GREEDY)[0].token_ids) == 8


def test_errors_name_file_and_field(base, tmp_path):
    folder = copy(base, tmp_path)
    edit_config(folder, lambda c: c.update(architectures=["GPT2LMHeadModel"]))
    with pytest.raises(UnsupportedArchitecture, match="GPT2LMHeadModel.*supported: .*LlamaForCausalLM"):
        Engine.from_pretrained(str(folder))
    edit_config(folder, lambda c: c.update(architectures=["LlamaForCausalLM"], layer_types=["full_attention", "conv"]))
    with pytest.raises(CheckpointError, match="config.json: field 'layer_types' names conv"):
        Engine.from_pretrained(str(folder))
    edit_config(folder, lambda c: c.update(layer_types=None, sliding_window=-4))
    with pytest.raises(CheckpointError, match="config.json: field 'sliding_window' is -4"):
        Engine.from_pretrained(str(folder))
    edit_config(folder, lambda c: c.update(sliding_window=None, hidden_size=None))
    with pytest.raises(CheckpointError, match="config.json.*'hidden_size'"):
        Engine.from_pretrained(str(folder))
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: malformed JSON"):
        Engine.from_pretrained(str(folder))
    with pytest.raises(CheckpointError, match="config.json: file not found"):
        Engine.from_pretrained(str(tmp_path / "nowhere"))


def test_missing_tensor_and_missing_tokenizer(base, tmp_path):
    folder = copy(base, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.layers.1.self_attn.k_proj.weight"):
        Engine.from_pretrained(str(folder))
    (folder / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json: file not found"):
        Engine.from_pretrained(str(folder))
    (folder / "model.safetensors").write_bytes(b"garbage")
    shutil.copy(base / "tokenizer.json", folder / "tokenizer.json")
    with pytest.raises(CheckpointError, match="model.safetensors: cannot read"):
        Engine.from_pretrained(str(folder))


def test_gemma3_transformers4_spelling_loads_the_same(tmp_path):
    """Hub configs of Gemma 3 say rope_theta + rope_local_base_freq + rope_scaling and
    sliding_window_pattern where transformers 5 writes per-type rope_parameters and
    layer_types; both give the same tokens (with a window the prompt outgrows)."""
    rope = {
        "full_attention": {"rope_type": "linear", "rope_theta": 100000.0, "factor": 4.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    overrides = dict(num_hidden_layers=6, sliding_window=8, query_pre_attn_scalar=16, rope_parameters=rope)
    v5 = make_checkpoint(tmp_path / "v5", "gemma3", **overrides)
    v4 = tmp_path / "v4"
    shutil.copytree(v5, v4)

    def to_v4(cfg):
        cfg["torch_dtype"] = cfg.pop("dtype", "float32")
        params = cfg.pop("rope_parameters")
        cfg["rope_theta"] = params["full_attention"]["rope_theta"]
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": params["full_attention"]["factor"]}
        cfg["rope_local_base_freq"] = params["sliding_attention"]["rope_theta"]
        assert cfg.pop("layer_types") == ["sliding_attention"] * 5 + ["full_attention"]
        cfg["sliding_window_pattern"] = 6

    edit_config(v4, to_v4)
    prompt = list(range(3, 40))
    want = Engine.from_pretrained(str(v5)).generate([prompt], GREEDY)[0].token_ids
    got = Engine.from_pretrained(str(v4))
    assert got.model_config.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    assert got.generate([prompt], GREEDY)[0].token_ids == want


def test_materialize_gives_meta_weights_storage_and_keeps_what_modules_share():
    """Every parameter and buffer of a meta-built model gets storage of its shape,
    strides and dtype on the device (as ``to_empty``); one shared by two modules stays
    one tensor (``to_empty`` made two)."""
    import torch

    from engine.loading.materialize import materialize

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10), torch.nn.BatchNorm1d(10))
        model[1].weight = model[0].weight  # tied, as an LM head on its embeddings
        model[2].weight.requires_grad_(False)
        model[0].weight.data = torch.empty(4, 10, dtype=torch.float16).t()  # [10, 4], transposed strides
    materialize(model, "cpu")
    tensors = [*model.parameters(), *model.buffers()]
    assert all(t.device.type == "cpu" for t in tensors)
    assert model[1].weight is model[0].weight and model[0].weight.stride() == (1, 10)
    assert model[0].weight.dtype == torch.float16 and model[2].num_batches_tracked.dtype == torch.long
    assert not model[2].weight.requires_grad and model[1].bias.requires_grad
    assert model[2].running_mean.shape == (10,) and isinstance(model[1].bias, torch.nn.Parameter)
