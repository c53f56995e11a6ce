"""Meshes, the logical-axis rules table, parameter specs with loud failures, activation constraints, placement."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from ranger_jax.parallel import mesh as mesh_lib
from ranger_jax.parallel import placement, rules


@pytest.fixture(scope="module")
def mesh():
    return mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)


def test_make_mesh_shapes_and_axis_types(mesh):
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    assert dict(mesh_lib.make_mesh().shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert dict(mesh_lib.make_mesh(tensor=2, devices=jax.devices()[:4]).shape) == {"data": 1, "fsdp": 2, "tensor": 2}
    mesh_lib.check_mesh(mesh)


def test_make_mesh_errors():
    with pytest.raises(ValueError, match=r"mesh sizes \{'data': 2, 'fsdp': 2, 'tensor': 1\} multiply to 4, but there "
                                         r"are 8 devices"):
        mesh_lib.make_mesh(data=2, fsdp=2)
    with pytest.raises(ValueError, match=r"cannot fill mesh axis 'fsdp': 8 devices are not divisible by the other "
                                         r"axes' product 3"):
        mesh_lib.make_mesh(data=3)
    with pytest.raises(ValueError, match=r"at most one -1"):
        mesh_lib.make_mesh(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match=r"must be positive"):
        mesh_lib.make_mesh(data=0)
    explicit = jax.make_mesh((2, 2, 2), mesh_lib.AXES)
    with pytest.raises(ValueError, match=r"must all be AxisType.Auto \(jax.make_mesh defaults to Explicit\)"):
        mesh_lib.check_mesh(explicit)
    other = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    with pytest.raises(ValueError, match=r"mesh axes \('x',\) != \('data', 'fsdp', 'tensor'\)"):
        mesh_lib.check_mesh(other)


def test_logical_to_spec_uses_each_mesh_axis_once(mesh):
    assert rules.logical_to_spec(("batch", "seq", "embed"), rules.TRAIN) == P(("data", "fsdp"), None, None)
    assert rules.logical_to_spec(("embed", "heads", "head_dim"), rules.TRAIN) == P("fsdp", "tensor", None)
    assert rules.logical_to_spec(("embed", "heads", "head_dim"), rules.SAMPLE) == P(None, "tensor", None)
    spec = rules.logical_to_spec(("batch", "vocab"), rules.TRAIN, shape=(2, 6), mesh=mesh, strict=False)
    assert spec == P("data", "tensor")  # batch 2 cannot take data x fsdp = 4: fsdp is dropped
    assert rules.logical_to_spec(("batch",), rules.TRAIN, shape=(3,), mesh=mesh, strict=False) == P(None)


def test_logical_to_spec_errors(mesh):
    with pytest.raises(ValueError, match=r"parameter x: logical axis name 'width' is not in the sharding rules; add it "
                                         r"to the table"):
        rules.logical_to_spec(("width",), rules.TRAIN, what="parameter x")
    with pytest.raises(ValueError, match=r"rule 'embed' -> 'model' names mesh axes \['model'\] that the mesh"):
        rules.logical_to_spec(("embed",), {"embed": "model"}, mesh=mesh)
    with pytest.raises(ValueError, match=r"dimension 0 \('heads'\) has size 3, not divisible by mesh axes \('tensor',\) "
                                         r"of total size 2; fix: map 'heads' to fewer axes"):
        rules.logical_to_spec(("heads",), rules.TRAIN, shape=(3,), mesh=mesh)
    with pytest.raises(ValueError, match=r"has 2 dimensions \(4, 4\) but 1 logical names \('embed',\)"):
        rules.logical_to_spec(("embed",), rules.TRAIN, shape=(4, 4))
    with pytest.raises(ValueError, match=r"sharding rules 'serve' are not a preset; known presets: \['sample', 'train'\]"):
        rules.get_rules("serve")


class _Toy(nnx.Module):
    def __init__(self, names, shape=(4, 6)):
        self.w = nnx.Param(jnp.zeros(shape), out_sharding=names, eager_sharding=False)


def test_param_specs_fail_loudly(mesh):
    specs = rules.param_specs(nnx.state(_Toy(("embed", "mlp"))), "train", mesh)
    assert specs["w"] == P("fsdp", "tensor")
    with pytest.raises(ValueError, match=r"parameter w \(4, 6\) has no logical axis names"):
        rules.param_specs(nnx.state(_Toy(None)), "train", mesh)
    with pytest.raises(ValueError, match=r"parameter w: logical axis name 'hidden' is not in the sharding rules"):
        rules.param_specs(nnx.state(_Toy(("embed", "hidden"))), "train", mesh)
    with pytest.raises(ValueError, match=r"parameter w: dimension 1 \('mlp'\) has size 5, not divisible by mesh axes "
                                         r"\('tensor',\) of total size 2"):
        rules.param_specs(nnx.state(_Toy(("embed", "mlp"), (4, 5))), "train", mesh)


def test_constrain_is_a_no_op_without_mesh_and_pins_with_one(mesh):
    x = jnp.ones((4, 6, 8))
    assert rules.constrain(x, "batch", "seq", "embed") is x

    def f(x):
        return rules.constrain(x * 2, "batch", "seq", "embed")

    with jax.set_mesh(mesh):
        out = jax.jit(f)(x)
        assert out.sharding.spec == P(("data", "fsdp"))
        text = jax.jit(f).lower(x).as_text()
        assert "sharding_constraint" in text or "Sharding" in text
        with rules.use_rules({**rules.TRAIN, "batch": "data", "embed": "tensor"}):
            assert jax.jit(f)(jnp.ones((4, 6, 10))).sharding.spec == P("data", None, "tensor")
    assert rules.current_rules() is rules.TRAIN


def test_materialize_places_each_parameter_in_its_sharding(mesh):
    abstract = nnx.eval_shape(lambda: _Toy(("embed", "mlp")))
    model = placement.materialize(abstract, lambda key, v: np.full(v.shape, 3.0, np.float32), mesh=mesh)
    assert model.w[...].sharding.spec == P("fsdp", "tensor") and float(model.w[...].sum()) == 72.0
    with pytest.raises(ValueError, match=r"w: host value \(2,\) float32 != parameter \(4, 6\) float32"):
        placement.materialize(abstract, lambda key, v: np.zeros(2, np.float32))
