"""Config dataclasses: presets, both HF rope forms, to_hf round trips, and every validation message."""

from __future__ import annotations

import dataclasses
import json

import jax
import pytest
import transformers
from flax import nnx

from ranger_jax.models.qwen3_vl import Qwen3VL, Qwen3VLConfig, TextConfig, VisionConfig
from ranger_jax.models.qwen3_vl import config as config_lib


def _count_params(config: Qwen3VLConfig) -> int:
    abstract = nnx.eval_shape(lambda: Qwen3VL(config, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def test_presets_have_the_released_shapes():
    c8 = Qwen3VLConfig.qwen3_vl_8b()
    assert (c8.text_config.hidden_size, c8.text_config.num_hidden_layers, c8.vision_config.depth) == (4096, 36, 27)
    assert c8.vision_config.deepstack_visual_indexes == (8, 16, 24) and not c8.tie_word_embeddings
    assert c8.text_config.num_key_value_groups == 4 and c8.vision_config.head_dim == 72
    assert c8.vision_config.patch_features == 1536 and c8.vision_config.merged_size == 4608
    assert 8.7e9 < _count_params(c8) < 8.8e9  # Qwen3-VL-8B-Instruct: ~8.77 B
    c4, c2 = Qwen3VLConfig.qwen3_vl_4b(), Qwen3VLConfig.qwen3_vl_2b()
    assert c4.tie_word_embeddings and c2.tie_word_embeddings
    assert (c2.text_config.hidden_size, c2.text_config.num_attention_heads, c2.vision_config.hidden_size) == (
        2048, 16, 1024)
    assert c4.vision_config.deepstack_visual_indexes == (5, 11, 17)
    tiny = Qwen3VLConfig.tiny(dtype="bfloat16", remat="full")
    t = tiny.text_config
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == (
        32, 2, 4, 2, 8)
    assert tiny.vision_config.depth == 2 and tiny.dtype == "bfloat16" and tiny.remat == "full"


def test_from_hf_reads_transformers_5_rope_parameters_form(tmp_path):
    ours = Qwen3VLConfig.tiny()
    hf = transformers.Qwen3VLConfig(**ours.to_hf())
    hf.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in written["text_config"]
    assert Qwen3VLConfig.from_hf(tmp_path) == ours
    assert Qwen3VLConfig.from_hf(tmp_path / "config.json") == ours
    assert Qwen3VLConfig.from_hf(written, attention="einsum", sharding_rules="sample").sharding_rules == "sample"


def test_from_hf_reads_the_hub_rope_scaling_form():
    """The transformers 4.57 form of Qwen/Qwen3-VL-8B-Instruct's config.json (abridged)."""
    hub = {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "image_token_id": 151655,
        "video_token_id": 151656, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "text_config": {"model_type": "qwen3_vl_text", "vocab_size": 151936, "hidden_size": 4096,
                        "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                        "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
                        "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "attention_bias": False,
                        "rope_theta": 5000000, "bos_token_id": 151643, "eos_token_id": 151645,
                        "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20],
                                         "mrope_interleaved": True}},
        "vision_config": {"model_type": "qwen3_vl", "depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                          "num_heads": 16, "hidden_act": "gelu_pytorch_tanh", "in_channels": 3, "patch_size": 16,
                          "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 4096,
                          "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]},
    }
    assert Qwen3VLConfig.from_hf(hub) == Qwen3VLConfig.qwen3_vl_8b()
    legacy = json.loads(json.dumps(hub))
    legacy["text_config"]["rope_scaling"] = {"type": "mrope", "mrope_section": [24, 20, 20]}
    assert Qwen3VLConfig.from_hf(legacy).text_config.mrope_section == (24, 20, 20)


def test_to_hf_round_trips_through_transformers():
    for config in (Qwen3VLConfig.qwen3_vl_2b(), Qwen3VLConfig.qwen3_vl_8b(), Qwen3VLConfig.tiny()):
        assert Qwen3VLConfig.from_hf(transformers.Qwen3VLConfig(**config.to_hf()).to_dict()) == config


def _text(**changes) -> TextConfig:
    return dataclasses.replace(Qwen3VLConfig.tiny().text_config, **changes)


def _vision(**changes) -> VisionConfig:
    return dataclasses.replace(Qwen3VLConfig.tiny().vision_config, **changes)


@pytest.mark.parametrize(("build", "match"), [
    (lambda: _text(num_key_value_heads=3),
     r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
    (lambda: _text(mrope_section=(2, 2, 1)), r"mrope_section=\[2, 2, 1\] must have 3 entries summing to head_dim / 2 = 4"),
    (lambda: _text(head_dim=16, mrope_section=(2, 3, 3)),
     r"mrope_section=\[2, 3, 3\] cannot be laid out interleaved in 8 slots: \(t, h, w\) would get \[3, 3, 2\]"),
    (lambda: _text(hidden_act="swiglu"), r"text_config.hidden_act='swiglu' is not supported; known values: \["),
    (lambda: _text(rope_type="yarn"), r"text_config.rope_type='yarn' is not supported"),
    (lambda: _text(mrope_interleaved=False), r"mrope_interleaved=False \(the chunked Qwen2-VL layout\)"),
    (lambda: _text(head_dim=7), r"head_dim must be even for rotary embeddings, got 7"),
    (lambda: _text(hidden_size=0), r"text_config.hidden_size must be > 0, got 0"),
    (lambda: _vision(num_heads=3), r"hidden_size \(16\) / num_heads \(3\) must be an integer head_dim divisible by 4"),
    (lambda: _vision(num_heads=8), r"hidden_size \(16\) / num_heads \(8\) must be an integer head_dim divisible by 4"),
    (lambda: _vision(num_position_embeddings=20), r"num_position_embeddings=20 must be a perfect square"),
    (lambda: _vision(deepstack_visual_indexes=(0, 2)), r"deepstack_visual_indexes=\[0, 2\] must be distinct block ids "
                                                       r"in \[0, depth=2\)"),
    (lambda: _vision(deepstack_visual_indexes=(1, 1)), r"deepstack_visual_indexes=\[1, 1\] must be distinct"),
    (lambda: _vision(hidden_act="quick_gelu"), r"vision_config.hidden_act='quick_gelu' is not supported"),
    (lambda: Qwen3VLConfig.tiny(dtype="float16"), r"dtype='float16' is not supported; known values: \['bfloat16', "
                                                  r"'float32'\]"),
    (lambda: Qwen3VLConfig.tiny(param_dtype="int8"), r"param_dtype='int8' is not supported"),
    (lambda: Qwen3VLConfig.tiny(remat="everything"), r"remat='everything' is not supported; known values: \["
                                                     r"'dots_saveable', 'dots_with_no_batch_dims_saveable', 'full', "
                                                     r"'none'\]"),
    (lambda: Qwen3VLConfig.tiny(attention="splash"), r"attention='splash' is not supported; known values: \['blocked', 'einsum'\]"),
    (lambda: Qwen3VLConfig.tiny(sharding_rules="serve"), r"sharding_rules='serve' is not supported; known values: "
                                                         r"\['sample', 'train'\]"),
    (lambda: dataclasses.replace(Qwen3VLConfig.tiny(), vision_config=_vision(out_hidden_size=48)),
     r"vision_config.out_hidden_size \(48\) must equal text_config.hidden_size \(32\)"),
    (lambda: dataclasses.replace(Qwen3VLConfig.tiny(), image_token_id=256),
     r"image_token_id=256 is outside the vocabulary \[0, 256\)"),
    (lambda: dataclasses.replace(Qwen3VLConfig.tiny(), video_token_id=5), r"special token ids must be distinct"),
    (lambda: dataclasses.replace(Qwen3VLConfig.tiny(), vision_config=_vision(depth=3, deepstack_visual_indexes=(0, 1, 2))),
     r"3 DeepStack taps need as many decoder layers, got text_config.num_hidden_layers=2"),
])
def test_invalid_values_raise_naming_field_and_value(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_from_hf_rejects_unsupported_files():
    base = Qwen3VLConfig.tiny().to_hf()

    def variant(**text_rope):
        hf = json.loads(json.dumps(base))
        hf["text_config"]["rope_parameters"].update(text_rope)
        return hf

    with pytest.raises(ValueError, match=r"text_config rope_type='linear' is not supported; known values: "
                                         r"\['default', 'mrope'\]"):
        Qwen3VLConfig.from_hf(variant(rope_type="linear"))
    with pytest.raises(ValueError, match=r"text_config rope parameters \['factor'\] are not supported"):
        Qwen3VLConfig.from_hf(variant(factor=4.0))
    with pytest.raises(ValueError, match=r"model_type='qwen2_5_vl' is not supported; expected 'qwen3_vl'"):
        Qwen3VLConfig.from_hf({**base, "model_type": "qwen2_5_vl"})
    vision = json.loads(json.dumps(base))
    vision["vision_config"]["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000}
    with pytest.raises(ValueError, match=r"vision_config.rope_parameters.rope_type='default' is not supported"):
        Qwen3VLConfig.from_hf(vision)
    vision["vision_config"].update(rope_parameters=None, patch_size=[16, 16])
    with pytest.raises(ValueError, match=r"vision_config.patch_size=\[16, 16\] is not supported; expected one int"):
        Qwen3VLConfig.from_hf(vision)
    with pytest.raises(TypeError, match=r"use Qwen3VLConfig.from_hf\(dict\)"):
        Qwen3VLConfig(text_config={}, vision_config={}, image_token_id=1, video_token_id=2, vision_start_token_id=3,
                      vision_end_token_id=4, tie_word_embeddings=False)


def test_interleaved_axes_follow_transformers():
    """(24, 20, 20) over 64 slots: THW repeated 20 times, then TTTT, as transformers lays them out."""
    axes = config_lib.interleaved_mrope_axes((24, 20, 20), 64)
    assert axes[:6] == (0, 1, 2, 0, 1, 2) and axes[60:] == (0, 0, 0, 0)
    assert [axes.count(a) for a in range(3)] == [24, 20, 20]
