"""The offline "wild web" world: generator (`build`), loaders, exact rewards, scripted agents, evaluation.

    from ranger_jax.env import sim
    world = sim.load_world(DIR)          # built by `python -m ranger_jax.env.sim.build --out DIR`
    tasks = sim.load_tasks(DIR)          # list[env.Task] with ground truth for `sim.rewards.score`
"""

from ranger_jax.env.sim.world import World, load_tasks, load_world

__all__ = ["World", "load_tasks", "load_world"]
