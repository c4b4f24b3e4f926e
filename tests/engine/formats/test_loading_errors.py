"""Bad model inputs give a clear EagleLabError naming the file and field, never a traceback-only crash."""

from __future__ import annotations

import json

import pytest

from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.errors import CheckpointError, ConfigError
from eaglelab.engine.formats.loader import load_target
from tests.conftest import random_model, save_hf_dir, tiny_config


@pytest.fixture
def model_dir(tmp_path):
    cfg = tiny_config()
    return save_hf_dir(random_model(cfg), cfg, tmp_path / "m")


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


def test_missing_config_field(model_dir):
    _edit_config(model_dir, hidden_size=None)
    with pytest.raises(ConfigError) as e:
        load_target(model_dir, with_tokenizer=False)
    assert e.value.field == "hidden_size" and "config.json" in str(e.value)


def test_bad_config_value(model_dir):
    _edit_config(model_dir, num_attention_heads="four")
    with pytest.raises(ConfigError) as e:
        load_target(model_dir, with_tokenizer=False)
    assert e.value.field == "num_attention_heads" and "four" in str(e.value)


def test_unknown_rope_scaling(model_dir):
    _edit_config(model_dir, rope_scaling={"rope_type": "yarn-ish", "factor": 4})
    with pytest.raises(ConfigError) as e:
        load_target(model_dir, with_tokenizer=False)
    assert e.value.field == "rope_scaling.rope_type"


@pytest.mark.parametrize("scaling, field", [
    ({"rope_type": "yarn", "factor": 4}, "rope_scaling.original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 512, "beta_fast": "fast"},
     "rope_scaling.beta_fast"),
])
def test_incomplete_yarn_scaling(model_dir, scaling, field):
    """YaRN fields the rotary tables read are checked when the config is read (a KeyError in the
    rotary code before)."""
    _edit_config(model_dir, rope_scaling=scaling)
    with pytest.raises(ConfigError) as e:
        load_target(model_dir, with_tokenizer=False)
    assert e.value.field == field and "config.json" in str(e.value)


def test_unsupported_architecture(model_dir):
    _edit_config(model_dir, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ConfigError) as e:
        load_target(model_dir, with_tokenizer=False)
    assert e.value.field == "architectures" and "GPT2LMHeadModel" in str(e.value)


def test_wrong_tensor_shape(model_dir):
    _edit_config(model_dir, intermediate_size=96)
    with pytest.raises(CheckpointError) as e:
        load_target(model_dir, with_tokenizer=False)
    assert "mlp" in e.value.field and e.value.found == [128, 64] and e.value.expected == [96, 64]


def test_truncated_safetensors(model_dir):
    f = model_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CheckpointError) as e:
        load_target(model_dir, with_tokenizer=False)
    assert "model.safetensors" in str(e.value) and "truncated" in str(e.value)


def test_missing_weights_and_missing_dir(model_dir, tmp_path):
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="safetensors"):
        load_target(model_dir, with_tokenizer=False)
    with pytest.raises(ConfigError, match="no such model directory"):
        load_target(tmp_path / "nowhere", with_tokenizer=False)


def test_missing_tensor_names_it(model_dir):
    from safetensors.torch import load_file, save_file

    f = model_dir / "model.safetensors"
    t = load_file(str(f))
    del t["model.layers.1.self_attn.v_proj.weight"]
    save_file(t, str(f))
    with pytest.raises(CheckpointError) as e:
        load_target(model_dir, with_tokenizer=False)
    assert e.value.field == "layers.1.self_attn.v_proj.weight"


def test_config_not_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_json(tmp_path)


def test_cli_reports_a_bad_model_without_traceback(model_dir, capsys):
    from eaglelab.cli import main

    _edit_config(model_dir, architectures=["GPT2LMHeadModel"])
    rc = main(["run", "hi", "--model", str(model_dir), "--draft", "none", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "unsupported architecture" in err and "Traceback" not in err
