"""The SFT learner: two steps against transformers + torch AdamW, the same steps on a (2, 2, 2) mesh and with
gradient accumulation, memorising one trajectory, image batches (loss against transformers, accumulation with the
vision tower trained, the tower frozen), weights handed out, and the errors a batch or mesh that does not fit
raises before compiling."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file
from support import tiny_hf
from support.learner_batches import CONFIG, text_batch

from ranger_jax.models.qwen3_vl import init, load, save
from ranger_jax.parallel import mesh as mesh_lib
from ranger_jax.parallel import placement
from ranger_jax.rl import diagnostics
from ranger_jax.rl import train_step as train_step_lib
from ranger_jax.rl.learner import Learner, LearnerConfig

# Adam's first step moves a weight by lr · g / (|g| + ε): where |g| ~ ε it turns float noise δg in the gradient into
# lr · δg / 4ε. Comparisons of two exact routes (mesh, microbatches) see δg ~ 1e-8 on near-zero gradients (logits of
# absent tokens), so ε = 1e-5 keeps that below 1e-6 at lr 3e-3.
SFT = LearnerConfig(learning_rate=3e-3, weight_decay=0.1, max_grad_norm=1.0, adam_eps=1e-5)
BATCHES = [text_batch(1), text_batch(2)]
BATCHES[0]["row_valid"][7] = 0.0  # a padding row: its loss_mask tokens must not count


def spec(variable) -> tuple:
    """A parameter's PartitionSpec as a tuple without trailing Nones (jit outputs drop them)."""
    parts = list(variable.get_value().sharding.spec)
    while parts and parts[-1] is None:
        parts.pop()
    return tuple(parts)


def params_by_path(learner: Learner) -> dict[str, np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(learner.state.params, is_leaf=placement.is_variable)[0]
    return {placement.path_key(path): np.asarray(variable.get_value()) for path, variable in flat}


@pytest.fixture(scope="module")
def mesh():
    return mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    """Two SFT steps on one device: (metrics per step, parameters by path)."""
    learner = Learner(load(tiny_checkpoint), SFT)
    metrics = [learner.step(batch) for batch in BATCHES]
    return metrics, params_by_path(learner)


def _torch_steps(path, batches, config: LearnerConfig):
    """The same two steps in torch: transformers' labels loss, clip_grad_norm_, AdamW (no decay on biases/norms)."""
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(path, attn_implementation="eager").train()
    named = list(model.named_parameters())
    plain = [p for n, p in named if n.endswith("bias") or "norm" in n.split(".")[-2]]
    decayed = [p for n, p in named if not (n.endswith("bias") or "norm" in n.split(".")[-2])]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": config.weight_decay},
                                   {"params": plain, "weight_decay": 0.0}], lr=config.learning_rate,
                                  betas=(config.adam_b1, config.adam_b2), eps=config.adam_eps)
    losses, norms = [], []
    for batch in batches:
        trained = batch["loss_mask"].astype(bool) & batch["row_valid"].astype(bool)[:, None]
        labels = np.where(trained, batch["input_ids"], -100).astype(np.int64)
        optimizer.zero_grad()
        out = model(input_ids=torch.from_numpy(batch["input_ids"].astype(np.int64)),
                    attention_mask=torch.from_numpy(batch["attention_mask"].astype(np.int64)),
                    labels=torch.from_numpy(labels))
        out.loss.backward()
        for p in model.parameters():  # the vision tower sees no image: a zero gradient, as in the jitted step
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)))
        losses.append(out.loss.item())
        optimizer.step()
    return losses, norms, {k: v.detach().numpy() for k, v in model.state_dict().items()}


def test_two_sft_steps_match_transformers_and_torch_adamw(tiny_checkpoint, reference, tmp_path):
    metrics, _ = reference
    losses, norms, torch_params = _torch_steps(tiny_checkpoint, BATCHES, SFT)
    assert [m["loss"] for m in metrics] == pytest.approx(losses, rel=2e-6)
    assert [m["grad_norm"] for m in metrics] == pytest.approx(norms, rel=1e-5)
    trained = BATCHES[0]["loss_mask"][:7, 1:].sum()  # the padding row 7 is left out
    assert metrics[0]["tokens"] == trained and metrics[0]["learning_rate"] == pytest.approx(SFT.learning_rate)
    # the learner's weights as an HF checkpoint (our save's layout table), compared key by key
    learner = Learner(load(tiny_checkpoint), SFT)
    for batch in BATCHES:
        learner.step(batch)
    save(learner.params_model(), tmp_path)
    ours = load_file(tmp_path / "model.safetensors")
    assert set(ours) == set(torch_params)
    for key, value in ours.items():  # two implementations: within 1% of one step's learning rate
        np.testing.assert_allclose(value, torch_params[key], atol=0.01 * SFT.learning_rate, err_msg=key)


def test_gradient_is_the_steps_gradient_and_updates_nothing(tiny_checkpoint, reference):
    metrics, params = reference
    learner = Learner(load(tiny_checkpoint), SFT)
    gradient = learner.gradient(BATCHES[0])
    trained = sum(int(np.prod(v.shape)) for v in params.values())
    assert gradient.dtype == np.float32 and gradient.shape == (trained,)
    assert float(np.linalg.norm(gradient)) == pytest.approx(metrics[0]["grad_norm"], rel=1e-5)  # torch-checked
    assert learner.step_count == 0
    assert [learner.step(batch)["loss"] for batch in BATCHES] == pytest.approx([m["loss"] for m in metrics], abs=1e-6)
    empty = {**BATCHES[1], "loss_mask": np.zeros_like(BATCHES[1]["loss_mask"])}
    assert not np.any(learner.gradient(empty))
    agreement = diagnostics.measure(learner, [text_batch(i) for i in range(4)])
    assert agreement.num_batches == 4 and agreement.batch_rows == BATCHES[0]["input_ids"].shape[0]
    assert agreement.mean_gradient_norm > 0 and learner.step_count == 2


def test_sharded_steps_equal_single_device_steps(tiny_checkpoint, reference, mesh):
    metrics, params = reference
    learner = Learner(load(tiny_checkpoint, mesh=mesh), SFT, mesh=mesh)
    sharded = [learner.step(batch) for batch in BATCHES]
    for ours, theirs in zip(sharded, metrics, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-5)
    for key, value in params_by_path(learner).items():
        np.testing.assert_allclose(value, params[key], atol=1e-5, err_msg=key)
    lm = learner.state.params["model"]["language_model"]
    assert spec(lm["layers"][0]["self_attn"]["q_proj"]["weight"]) == ("fsdp", "tensor")
    assert spec(lm["embed_tokens"]["weight"]) == ("tensor", "fsdp")
    adam = learner.state.opt_state[1][0]  # (clip, adamw); adamw = (scale_by_adam, ...)
    assert spec(adam.mu["model"]["language_model"]["layers"][1]["mlp"]["down_proj"]["weight"]) == ("tensor", "fsdp")


def test_gradient_accumulation_equals_one_full_batch(tiny_checkpoint, reference):
    metrics, params = reference
    learner = Learner(load(tiny_checkpoint), dataclasses.replace(SFT, grad_accum_steps=2))
    accumulated = [learner.step(batch) for batch in BATCHES]
    for ours, theirs in zip(accumulated, metrics, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-5)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], abs=1e-5)
        assert ours["tokens"] == theirs["tokens"]
    for key, value in params_by_path(learner).items():
        np.testing.assert_allclose(value, params[key], atol=1e-5, err_msg=key)


def test_sft_memorises_one_trajectory(tiny_checkpoint):
    batch = text_batch(3)
    batch = {k: np.repeat(v[:1], 8, axis=0) for k, v in batch.items()}  # one trajectory, 8 rows
    learner = Learner(load(tiny_checkpoint), SFT)
    losses = [learner.step(batch)["loss"] for _ in range(100)]
    assert losses[0] > 4.0 and losses[-1] < 0.05
    assert learner.step_count == 100


def image_batch() -> tuple[dict[str, np.ndarray], dict]:
    """Four rows, images in rows 0, 1 and 3 (so both strided microbatches of two rows hold images); loss on each
    row's last six tokens. Returns (learner batch, transformers inputs)."""
    batch = tiny_hf.make_batch(CONFIG, [[3, (4, 4), 6], [2, (2, 4), 8], [12], [1, (2, 2), 9]], padding_side="right",
                               seed=4)
    loss_mask = np.zeros(batch["input_ids"].shape, np.float32)
    for row, length in enumerate(batch["attention_mask"].sum(axis=1)):
        loss_mask[row, length - 6:length] = 1.0
    learner_batch = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                     "loss_mask": loss_mask, "pixel_values": batch["pixel_values"],
                     "image_grid_thw": batch["image_grid_thw"]}
    return learner_batch, batch


@pytest.fixture(scope="module")
def image_step(tiny_checkpoint):
    """One SFT step on the image batch on one device, the vision tower trained: (metrics, parameters)."""
    batch, _ = image_batch()
    learner = Learner(load(tiny_checkpoint), SFT)
    return learner.step(batch), params_by_path(learner)


def test_image_batch_loss_matches_transformers(tiny_checkpoint, image_step):
    batch, hf_batch = image_batch()
    labels = np.where(batch["loss_mask"].astype(bool), batch["input_ids"], -100).astype(np.int64)
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tiny_checkpoint, attn_implementation="eager")
    with torch.no_grad():
        expected = model(**tiny_hf.torch_inputs(hf_batch), labels=torch.from_numpy(labels)).loss.item()
    assert image_step[0]["loss"] == pytest.approx(expected, rel=2e-6)


def test_image_batch_accumulates_with_the_vision_tower_trained(tiny_checkpoint, image_step):
    metrics, params = image_step
    batch, _ = image_batch()
    learner = Learner(load(tiny_checkpoint), dataclasses.replace(SFT, grad_accum_steps=2))
    accumulated = learner.step(batch)
    assert accumulated["loss"] == pytest.approx(metrics["loss"], abs=1e-5)
    assert accumulated["grad_norm"] == pytest.approx(metrics["grad_norm"], abs=1e-5)
    after = params_by_path(learner)
    for key, value in after.items():
        np.testing.assert_allclose(value, params[key], atol=1e-5, err_msg=key)
    initial = params_by_path(Learner(load(tiny_checkpoint), SFT))
    moved = [k for k in after if k.startswith("model.visual.") and not np.array_equal(after[k], initial[k])]
    assert "model.visual.patch_embed.proj.weight" in moved and "model.visual.merger.linear_fc2.weight" in moved


def test_frozen_vision_tower_gets_no_update_and_no_optimizer_state(tiny_checkpoint):
    batch, _ = image_batch()
    learner = Learner(load(tiny_checkpoint), dataclasses.replace(SFT, freeze_vision=True))
    before = params_by_path(learner)
    metrics = learner.step(batch)
    after = params_by_path(learner)
    assert np.isfinite(metrics["loss"])
    vision = [k for k in before if k.startswith("model.visual.")]
    assert len(vision) == len(jax.tree.leaves(nnx.state(init(CONFIG).model.visual, nnx.Param)))
    for key in vision:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    assert not np.array_equal(after["lm_head.weight"], before["lm_head.weight"])
    opt_paths = [placement.path_key(p) for p, _ in jax.tree_util.tree_flatten_with_path(learner.state.opt_state)[0]]
    assert not [p for p in opt_paths if "visual" in p]
    assert [p for p in opt_paths if "language_model" in p]


def test_frozen_names_freeze_every_parameter_whose_path_holds_one(tiny_checkpoint):
    batch, _ = image_batch()
    config = dataclasses.replace(SFT, freeze_vision=True, frozen=("embed_tokens", "mlp"))
    learner = Learner(load(tiny_checkpoint), config)
    before = params_by_path(learner)
    assert np.isfinite(learner.step(batch)["loss"])
    after = params_by_path(learner)
    frozen = [k for k in before if "visual" in k or "embed_tokens" in k or ".mlp." in k]
    trained = [k for k in before if k not in frozen]
    assert any(".mlp." in k for k in frozen) and any("embed_tokens" in k for k in frozen)
    for key in frozen:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    moved = [k for k in trained if not np.array_equal(after[k], before[k])]
    assert any("self_attn.q_proj" in k for k in moved) and any("self_attn.o_proj" in k for k in moved)
    opt_paths = [placement.path_key(p) for p, _ in jax.tree_util.tree_flatten_with_path(learner.state.opt_state)[0]]
    assert not [p for p in opt_paths if "mlp" in p or "embed_tokens" in p or "visual" in p]
    assert [p for p in opt_paths if "self_attn" in p]
    with pytest.raises(ValueError, match=r"LearnerConfig.frozen names \['mpl'\] are in no parameter's path"):
        Learner(load(tiny_checkpoint), dataclasses.replace(SFT, frozen=("mlp", "mpl")))
    with pytest.raises(ValueError, match=r"leaves no parameter to train"):
        Learner(load(tiny_checkpoint), dataclasses.replace(SFT, freeze_vision=True, frozen=("language_model",
                                                                                             "lm_head")))


def test_bf16_parameters_with_remat_keep_their_dtype_and_compile_once(tiny_checkpoint):
    config = dataclasses.replace(SFT, dtype="bfloat16", param_dtype="bfloat16", remat="full")
    learner = Learner(load(tiny_checkpoint), config)
    assert (learner.model_config.dtype, learner.model_config.param_dtype, learner.model_config.remat) == (
        "bfloat16", "bfloat16", "full")
    compiled = train_step_lib.jit_train_step._cache_size()
    losses = [learner.step(batch)["loss"] for batch in BATCHES + BATCHES]
    assert train_step_lib.jit_train_step._cache_size() == compiled + 1
    assert losses[2] < losses[0] and losses[3] < losses[1]
    dtypes = {leaf.dtype for leaf in jax.tree.leaves(learner.state.params)}
    assert dtypes == {np.dtype("bfloat16")}


def test_params_model_is_a_copy_for_another_runtime(tiny_checkpoint, mesh):
    learner = Learner(load(tiny_checkpoint), SFT)
    sample_config = dataclasses.replace(learner.model_config, sharding_rules="sample", dtype="bfloat16")
    model = learner.params_model(sample_config, mesh=mesh)
    before = np.asarray(model.lm_head.weight.get_value())
    learner.step(BATCHES[0])  # donates the learner's buffers; the copy must survive
    assert model.config.dtype == "bfloat16"
    assert spec(model.lm_head.weight) == (None, "tensor")
    np.testing.assert_array_equal(np.asarray(model.lm_head.weight.get_value()), before)
    with pytest.raises(ValueError, match="same architecture"):
        learner.params_model(dataclasses.replace(CONFIG, text_config=dataclasses.replace(CONFIG.text_config,
                                                                                         vocab_size=512)))


def test_batch_and_mesh_errors_name_the_numbers(tiny_checkpoint, mesh):
    learner = Learner(load(tiny_checkpoint), SFT, mesh=mesh)
    batch = text_batch(5, rows=6)
    with pytest.raises(ValueError, match=r"\(6 rows / grad_accum_steps 1 = 6\) are not divisible by the mesh's "
                                         r"data × fsdp = 2 × 2 = 4"):
        learner.step(batch)
    accumulating = Learner(load(tiny_checkpoint), dataclasses.replace(SFT, grad_accum_steps=4))
    with pytest.raises(ValueError, match="grad_accum_steps=4 does not divide the batch's 6 rows"):
        accumulating.step(batch)
    with pytest.raises(ValueError, match=r"the batch lacks \['loss_mask'\]"):
        learner.step({k: v for k, v in text_batch(5).items() if k != "loss_mask"})
    with pytest.raises(ValueError, match=r"unknown keys \['labels'\]"):
        learner.step({**text_batch(5), "labels": text_batch(5)["input_ids"]})
    with pytest.raises(ValueError, match=r"loss_mask has shape \(8, 15\), input_ids has \(8, 16\)"):
        learner.step({**text_batch(5), "loss_mask": np.ones((8, 15), np.float32)})
    with pytest.raises(ValueError, match=r"token_advantages has shape \(8, 15\), input_ids has \(8, 16\)"):
        learner.step({**text_batch(5), "token_advantages": np.ones((8, 15), np.float32)})
    with pytest.raises(ValueError, match=r"batch token_advantages is a GRPO key; objective is 'sft'"):
        learner.step({**text_batch(5), "token_advantages": np.ones((8, 16), np.float32)})
    assert learner.step_count == 0
    narrow = mesh_lib.make_mesh(data=1, fsdp=2, tensor=4)  # 2 kv heads cannot split over tensor = 4
    with pytest.raises(ValueError, match=r"k_proj\.weight: dimension 1 \('kv_heads'\) has size 2, not divisible by "
                                         r"mesh axes \('tensor',\) of total size 4"):
        Learner(load(tiny_checkpoint), SFT, mesh=narrow)


def test_learner_config_errors():
    with pytest.raises(ValueError, match="schedule='cosine' needs total_steps"):
        LearnerConfig(schedule="cosine")
    with pytest.raises(ValueError, match=r"agg='token-sum' is not supported; known values"):
        LearnerConfig(agg="token-sum")
    with pytest.raises(ValueError, match="grad_accum_steps must be an int >= 1, got 0"):
        LearnerConfig(grad_accum_steps=0)
    with pytest.raises(ValueError, match="tis_cap .* needs old_logp='learner'"):
        LearnerConfig(objective="grpo", tis_cap=2.0)
    for bad in (["mlp"], ("model.mlp",), ("",)):
        with pytest.raises(ValueError, match=r"LearnerConfig.frozen must be a tuple of parameter path names"):
            LearnerConfig(frozen=bad)


@pytest.mark.parametrize("sharded", [False, True])
def test_precompile_leaves_a_program_that_another_learners_step_loads(tiny_checkpoint, mesh, tmp_path, sharded):
    from ranger_jax import compilation_cache

    on = mesh if sharded else None
    batch = text_batch(9, rows=8, length=40)  # a shape no other test compiles, so nothing is in memory yet
    with pytest.raises(ValueError, match="persistent compilation cache"):
        Learner(load(tiny_checkpoint), SFT, mesh=on).precompile(batch)
    cache = tmp_path / "cache"
    with compilation_cache.enabled(cache):
        ahead = Learner(load(tiny_checkpoint), SFT, mesh=on)
        assert ahead.precompile(batch) and not ahead.precompile(batch)  # the second time: seen already
        assert ahead.step_count == 0
        programs = sorted(p.name for p in cache.iterdir() if p.name.startswith("jit_train_step"))
        assert len(programs) == 1
        learner = Learner(load(tiny_checkpoint), SFT, mesh=on)
        loaded = learner.step(batch)
        # the step found the program: a program of other shapes, shardings or settings would be a second file
        assert sorted(p.name for p in cache.iterdir() if p.name.startswith("jit_train_step")) == programs
    plain = Learner(load(tiny_checkpoint), SFT, mesh=on).step(batch)
    assert loaded["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    assert loaded["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
    with pytest.raises(ValueError, match="input_ids"):
        with compilation_cache.enabled(cache):
            learner.precompile({k: v for k, v in batch.items() if k != "input_ids"})
