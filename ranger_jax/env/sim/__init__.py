"""The offline "wild web" world: generator (`build`), loaders, exact rewards, scripted agents, evaluation.

    from ranger_jax.env import sim
    world = sim.load_world(DIR)          # built by `python -m ranger_jax.env.sim.build --out DIR`
    tasks = sim.load_tasks(DIR)          # list[env.Task] with ground truth for `sim.rewards.score`

Worlds come in two generator versions recorded in `world.json`: version 2 (the default) is hard the way the web
is (dead links, re-hosts, keyword-stuffed pages, ranking noise, leaks and fan mock-ups, requests by maker or with
two subjects, occlusion, lighting and JPEG noise, special editions, facts spread over pages; `build`, `plan_v2`),
and `world_version=1` rebuilds the first worlds byte for byte. `sim.split` builds train / held-out worlds that
share no family.
"""

from ranger_jax.env.sim.world import World, load_tasks, load_world

__all__ = ["World", "load_tasks", "load_world"]
