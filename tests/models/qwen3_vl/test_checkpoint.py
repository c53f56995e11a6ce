"""HF safetensors checkpoints: load (single file, sharded index, bf16), save -> transformers identical weights,
and errors that name the key and both shapes."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import save_file
from support import tiny_hf

from ranger_jax.models.qwen3_vl import CheckpointError, checkpoint, load, save


def _params(model) -> dict[str, np.ndarray]:
    from flax import nnx

    state = nnx.state(model, nnx.Param)
    return {jax.tree_util.keystr(p, simple=True, separator="."): np.asarray(v.get_value())
            for p, v in jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]}


def _assert_same_weights(hf_a, hf_b):
    a, b = hf_a.state_dict(), hf_b.state_dict()
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_save_sharded_then_transformers_loads_identical_weights(checkpoints, tmp_path):
    case = checkpoints("scaled_8b")
    save(case.model, tmp_path, max_shard_bytes=64 * 1024)
    index = json.loads((tmp_path / checkpoint.INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((tmp_path / s).exists() for s in shards)
    assert not (tmp_path / checkpoint.SINGLE_FILE).exists()
    reloaded = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager")
    _assert_same_weights(reloaded, case.hf)
    assert reloaded.config.text_config.rope_parameters["mrope_section"] == [6, 5, 5]
    assert list(reloaded.config.vision_config.deepstack_visual_indexes) == [1, 2]


def test_save_tied_single_file_has_no_lm_head_and_round_trips(checkpoints, tmp_path):
    case = checkpoints("tied")
    assert case.model.lm_head is None
    save(case.model, tmp_path)
    keys = checkpoint.SafetensorsFile(tmp_path / checkpoint.SINGLE_FILE).entries
    assert "lm_head.weight" not in keys and "model.language_model.embed_tokens.weight" in keys
    reloaded = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager")
    _assert_same_weights(reloaded, case.hf)
    assert reloaded.config.tie_word_embeddings


def test_sharded_index_checkpoint_loads_like_single_file(checkpoints, tmp_path):
    case = checkpoints("scaled_8b")
    case.hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / checkpoint.INDEX_FILE).exists() and not (tmp_path / checkpoint.SINGLE_FILE).exists()
    ours, reference = _params(load(tmp_path)), _params(case.model)
    assert sorted(ours) == sorted(reference)
    for key in ours:
        np.testing.assert_array_equal(ours[key], reference[key], err_msg=key)


def test_bf16_checkpoint_loads_exactly(configs, tmp_path):
    hf = tiny_hf.save_checkpoint(configs["minimal"], tmp_path / "hf", seed=3, dtype=torch.bfloat16)
    assert checkpoint.SafetensorsFile(tmp_path / "hf" / checkpoint.SINGLE_FILE).entries[
        "model.visual.pos_embed.weight"]["dtype"] == "BF16"
    model = load(tmp_path / "hf", dtype=jnp.bfloat16)
    assert model.config.param_dtype == "bfloat16"
    assert model.model.visual.blocks[0].attn.qkv.weight[...].dtype == jnp.bfloat16
    save(model, tmp_path / "ours")
    reloaded = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path / "ours", dtype=torch.bfloat16)
    _assert_same_weights(reloaded, hf)  # bf16 -> ours -> bf16 is bit-exact
    upcast = load(tmp_path / "hf", dtype=jnp.float32)
    q = hf.model.language_model.layers[1].self_attn.q_proj.weight.detach().float().numpy()  # [N*H, D]
    t = configs["minimal"].text_config
    np.testing.assert_array_equal(np.asarray(upcast.model.language_model.layers[1].self_attn.q_proj.weight[...]),
                                  q.T.reshape(t.hidden_size, t.num_attention_heads, t.head_dim))


def test_our_save_and_load_round_trip_with_stale_files_removed(checkpoints, tmp_path):
    case = checkpoints("tied")
    save(case.model, tmp_path, max_shard_bytes=16 * 1024)
    assert (tmp_path / checkpoint.INDEX_FILE).exists()
    save(case.model, tmp_path)  # now one file: the index and shards of the first save must go
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["config.json", checkpoint.SINGLE_FILE]
    ours, reference = _params(load(tmp_path)), _params(case.model)
    for key in reference:
        np.testing.assert_array_equal(ours[key], reference[key], err_msg=key)


@pytest.fixture()
def tensors(checkpoints):
    """The tied checkpoint's tensors as numpy, to write broken variants."""
    case = checkpoints("tied")
    file = checkpoint.SafetensorsFile(case.path / checkpoint.SINGLE_FILE)
    return case, {key: np.array(file.get(key)) for key in file.entries}


def _write(path, case, tensors):
    path.mkdir()
    shutil.copy(case.path / "config.json", path / "config.json")
    save_file(tensors, str(path / checkpoint.SINGLE_FILE), metadata={"format": "pt"})
    return path


def test_missing_key_names_key_and_shape(tensors, tmp_path):
    case, t = tensors
    del t["model.language_model.layers.1.self_attn.k_norm.weight"]
    with pytest.raises(CheckpointError, match=r"1 keys missing from the checkpoint: "
                       r"model\.language_model\.layers\.1\.self_attn\.k_norm\.weight \(expected shape \(16,\)\)"):
        load(_write(tmp_path / "c", case, t))


def test_unexpected_key_names_key_and_shape(tensors, tmp_path):
    case, t = tensors
    t["model.visual.blocks.9.norm1.weight"] = np.ones(32, np.float32)
    with pytest.raises(CheckpointError, match=r"1 unexpected keys in the checkpoint: "
                       r"model\.visual\.blocks\.9\.norm1\.weight \(shape \(32,\)\)"):
        load(_write(tmp_path / "c", case, t))


def test_wrong_shape_names_key_and_both_shapes(tensors, tmp_path):
    case, t = tensors
    key = "model.language_model.layers.0.mlp.down_proj.weight"
    t[key] = np.ascontiguousarray(t[key].T)
    with pytest.raises(CheckpointError, match=r"key model\.language_model\.layers\.0\.mlp\.down_proj\.weight has shape "
                       r"\(96, 48\) in the checkpoint, the model expects \(48, 96\)"):
        load(_write(tmp_path / "c", case, t))


def test_tied_checkpoint_with_redundant_lm_head_loads(tensors, tmp_path):
    case, t = tensors
    t["lm_head.weight"] = t["model.language_model.embed_tokens.weight"].copy()
    model = load(_write(tmp_path / "c", case, t))
    assert model.lm_head is None


def test_bad_files_are_named(tensors, tmp_path):
    case, t = tensors
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(case.path / "config.json", empty / "config.json")
    with pytest.raises(CheckpointError, match=r"holds neither model\.safetensors nor model\.safetensors\.index\.json"):
        load(empty)
    (empty / checkpoint.SINGLE_FILE).write_bytes(b"\x01")
    with pytest.raises(CheckpointError, match=r"cannot read safetensors header of .*model\.safetensors"):
        load(empty)
    sharded = _write(tmp_path / "sharded", case, t)
    (sharded / checkpoint.SINGLE_FILE).rename(sharded / "model-00001-of-00001.safetensors")
    weight_map = {key: "model-00001-of-00001.safetensors" for key in t}
    weight_map["model.ghost.weight"] = "model-00001-of-00001.safetensors"
    (sharded / checkpoint.INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=r"maps key model\.ghost\.weight to model-00001-of-00001\.safetensors, "
                       r"which does not hold it"):
        load(sharded)


def test_layout_table_and_save_argument_errors(checkpoints, tmp_path):
    with pytest.raises(CheckpointError, match=r"parameter model\.visual\.extra\.scale has no entry in "
                       r"checkpoint\.LAYOUTS"):
        checkpoint.layout_of("model.visual.extra.scale")
    with pytest.raises(ValueError, match=r"max_shard_bytes must be > 0, got 0"):
        save(checkpoints("tied").model, tmp_path, max_shard_bytes=0)
    unsupported = tmp_path / "f.safetensors"
    save_file({"x": np.zeros(2, np.complex64)}, str(unsupported))
    with pytest.raises(CheckpointError, match=r"key x has unsupported dtype C64"):
        checkpoint.SafetensorsFile(unsupported).get("x")
    assert checkpoint.SafetensorsFile(tmp_path / "f.safetensors").shape("x") == (2,)
    assert ml_dtypes.bfloat16 in checkpoint._SAFETENSORS_DTYPES.values()
