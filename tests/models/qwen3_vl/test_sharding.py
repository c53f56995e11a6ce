"""The model on a (data, fsdp, tensor) = (2, 2, 2) mesh: parameter partition specs and the same logits as on one
device, for the train and sample rule presets."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from support import tiny_hf

from ranger_jax.models.qwen3_vl import Qwen3VLConfig, init, load
from ranger_jax.parallel import mesh as mesh_lib


@pytest.fixture(scope="module")
def mesh():
    return mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)


def _spec(variable) -> P:
    return variable.get_value().sharding.spec


@pytest.mark.parametrize("preset", ["train", "sample"])
def test_mesh_logits_equal_single_device_logits(checkpoints, mesh, preset):
    case = checkpoints("scaled_8b")
    config = case.config
    batch = tiny_hf.make_batch(config, [[4, (4, 6), 3], [2, (2, 4), 3, (6, 4), 2], [(4, 4), 5], [9]],
                               padding_side=["right", "right", "left", "left"], seed=21)
    reference = np.asarray(case.model(batch["input_ids"], **tiny_hf.jax_inputs(batch)))
    model = load(case.path, mesh=mesh, sharding_rules=preset)
    visual, lm = model.model.visual, model.model.language_model
    embed = "fsdp" if preset == "train" else None
    assert _spec(lm.layers[0].self_attn.q_proj.weight) == P(embed, "tensor", None)
    assert _spec(lm.layers[3].self_attn.k_proj.weight) == P(embed, "tensor", None)
    assert _spec(lm.layers[1].self_attn.o_proj.weight) == P("tensor", None, embed)
    assert _spec(lm.layers[2].mlp.down_proj.weight) == P("tensor", embed)
    assert _spec(lm.embed_tokens.weight) == P("tensor", embed)
    assert _spec(model.lm_head.weight) == P(embed, "tensor")
    assert _spec(lm.norm.weight) == P(embed)
    assert _spec(lm.layers[0].self_attn.q_norm.weight) == P(None)
    assert _spec(visual.blocks[0].attn.qkv.weight) == P(embed, None, "tensor", None)
    assert _spec(visual.deepstack_merger_list[0].linear_fc1.weight) == P(embed, "tensor")
    assert _spec(visual.patch_embed.proj.weight) == P(None, embed)
    with jax.set_mesh(mesh):
        logits = model(batch["input_ids"], **tiny_hf.jax_inputs(batch))
    assert logits.sharding.spec == P(("data", "fsdp"), None, "tensor")
    mask = batch["attention_mask"].astype(bool)
    assert np.abs(np.asarray(logits) - reference)[mask].max() <= 2e-5


def test_indivisible_parameter_fails_with_path_and_fix():
    mesh = mesh_lib.make_mesh(data=1, fsdp=2, tensor=4)
    with pytest.raises(ValueError, match=r"parameter model\.language_model\.layers\.0\.self_attn\.k_proj\.weight: "
                                         r"dimension 1 \('kv_heads'\) has size 2, not divisible by mesh axes "
                                         r"\('tensor',\) of total size 4; fix: map 'kv_heads' to fewer axes"):
        init(Qwen3VLConfig.tiny(), mesh=mesh)


def test_init_on_mesh_matches_init_on_one_device(mesh):
    config = Qwen3VLConfig.tiny()
    single, sharded = init(config, seed=3), init(config, seed=3, mesh=mesh)
    a = single.model.visual.blocks[1].mlp.linear_fc1.weight
    b = sharded.model.visual.blocks[1].mlp.linear_fc1.weight
    assert _spec(b) == P("fsdp", "tensor")
    np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]))
    assert float(np.std(np.asarray(a[...]))) == pytest.approx(0.02, rel=0.2)
    np.testing.assert_array_equal(np.asarray(sharded.model.visual.blocks[0].norm1.weight[...]), 1.0)
