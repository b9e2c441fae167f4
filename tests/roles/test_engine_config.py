"""The model-folder gate before an engine starts: config.json and safetensors are checked
cheaply (headers only) and every problem is a ConfigError naming the file and the fix."""

import json

import pytest
import torch
from safetensors.torch import save_file

from pivot.errors import ConfigError
from pivot.roles.engine.config import (check_model_dir, check_safetensors, read_hf_config,
                                       read_hf_weights)
from pivot.roles.titan.model import Qwen3Shape


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    save_file({"a": torch.zeros(3), "b": torch.ones(2, 2, dtype=torch.bfloat16)},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    return tmp_path


def test_a_whole_folder_passes(folder):
    assert check_model_dir(folder) == folder.resolve()
    assert read_hf_config(folder) == ({"model_type": "qwen3"}, folder / "config.json")


@pytest.mark.parametrize("damage, why", [
    (lambda b: b[:-1], "data section"),
    (lambda b: b[:5], "shorter than the 8-byte"),
    (lambda b: b"\xff" * 64, "header length"),
    (lambda b: (4).to_bytes(8, "little") + b"{x}]" + b[12:], "JSON header"),
    (lambda b: b + b"\0" * 4, "end at byte"),
])
def test_damaged_safetensors_name_the_file_and_the_fix(folder, damage, why):
    w = folder / "model.safetensors"
    w.write_bytes(damage(w.read_bytes()))
    with pytest.raises(ConfigError, match=why) as e:
        check_model_dir(folder)
    assert str(w) in str(e.value) and "launchers/build_models.py" in str(e.value)


def test_a_tensor_whose_offsets_do_not_match_its_shape_is_caught(tmp_path):
    header = json.dumps({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})
    f = tmp_path / "x.safetensors"
    f.write_bytes(len(header).to_bytes(8, "little") + header.encode() + b"\0" * 8)
    with pytest.raises(ConfigError, match="needs 12 bytes"):
        check_safetensors(f)


def test_engine_check_and_trainer_shape_read_config_json_alike(folder):
    (folder / "config.json").write_text('{"model_type": "qw')
    for read in (check_model_dir, Qwen3Shape.from_hf, read_hf_config):
        with pytest.raises(ConfigError, match=r"config\.json is malformed.*build_models"):
            read(folder)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        Qwen3Shape.from_hf(folder)


def test_the_weights_of_every_safetensors_file_are_read_by_name(tmp_path):
    save_file({"a": torch.ones(2), "b": torch.zeros(3, dtype=torch.bfloat16)},
              str(tmp_path / "model-00001.safetensors"))
    save_file({"c": torch.arange(4)}, str(tmp_path / "model-00002.safetensors"))
    got = read_hf_weights(tmp_path)
    assert sorted(got) == ["a", "b", "c"] and got["b"].dtype == torch.bfloat16
    assert torch.equal(got["c"], torch.arange(4))
