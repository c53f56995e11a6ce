"""The `sim-tiny` main job: the whole method on a CPU, from nothing to a policy that searches better than it did.

Stages (each with a progress bar), all under one output folder:

1. **Worlds.** Offline worlds from seeds derived from `seed`: several for SFT data, one for GRPO, and one held out
   for evaluation (a seed no training world uses: worlds draw their entity families first, so a smaller world of
   a training seed would share targets with it). Stages 1-2 are pure Python and run on `workers` processes, one
   job per world, with the same outputs as one process; the GRPO world, the largest, builds on one of them while
   the others go on with the rest, including the scripted agents' held-out scores of stage 5.
2. **Teacher data.** A scripted teacher that perceives only through tools (`env.sim.finder_agent.SnippetAgent`)
   plays the SFT worlds; its texts train the policy's compact tokenizer, then its episodes are recorded
   token-exactly as trajectory shards.
3. **SFT.** A small Qwen3-VL-shaped policy (`rl.tiny_policy`, tied embeddings, a date-only system prompt) is
   trained from scratch: a copy warm-up on repeated random tokens (`rl.copy_warmup`), then the first turns of the
   teacher's episodes (`data.first_turns`; stopped once their loss shows the policy copies), then whole
   episodes. Every content word — names, colours, scenes;
   not the system prompt, the templates of the teacher's turns or the words it only reads — is permuted
   consistently through each row (`data.augment.content_words`): without it the policy memorises the training
   requests instead of copying from what it reads, and scores 0 on unseen tasks (`docs/sim_tiny.md`).
4. **GRPO.** A decoupled actor process samples groups on the GRPO world with the latest published weights; the
   learner streams its shards and publishes new weights every step (`rl.grpo_loop`). A group's members play the
   first turns greedily (the same context for all) and sample the decision turn (`find_object`'s description),
   drawing only where the policy is unsure (at most two tokens a turn, the argmax elsewhere); the steps are large
   (960 episodes, each task of the GRPO world once) and train attention alone. The actor plays each group's shared
   turns once, and on the offline world each repeated continuation once (`RolloutConfig.share_continuations`).
   The learner runs the shared context once (`data.shared_prefix`) and,
   with `grpo_augment` (off by default), sees each group's content words permuted as SFT did, so its update has
   to improve copying rather than recall the GRPO tasks' looks.
5. **Evaluation.** Naive, teacher, oracle expert, SFT and GRPO policies on the held-out world with the env's one
   reward (`ToolEnv.score`); policies run greedy through the JAX sampler.

Outputs: `summary.json`, `policy/` (the final policy: HF checkpoint, tokenizer and its env settings),
`curves.png`, `viewer.html` (held-out GRPO trajectories), `metrics/` (JSONL + TensorBoard), and the intermediate
data. With `blind=True` every observation the policy sees is blank (the control run): the teacher still plays
the real episodes, but the trajectories' tokens hide what the tools returned.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import jax

from ranger_jax import compilation_cache, cpu_affinity, process_pool
from ranger_jax import env as env_lib
from ranger_jax.env import perception
from ranger_jax.data import augment, batching, filters, first_turns, pipeline, shards
from ranger_jax.data.trajectory import Trajectory
from ranger_jax.env.sim import agents, build, world
from ranger_jax.env.sim.finder_agent import SnippetAgent
from ranger_jax.processing import chat
from ranger_jax.processing import tokenizer as tokenizer_lib
from ranger_jax.rl import copy_warmup, grpo_loop, sft, tiny_policy
from ranger_jax.rl import learner as learner_lib
from ranger_jax.rl import learner_config
from ranger_jax.rl import metrics as metrics_lib
from ranger_jax.rollout import episode, evaluate, policy as policy_lib, runner, scoring

TOOLS = ("text_search", "image_search", "find_object")
# the copy rehearsal during SFT: rows of 32 random tokens repeated 32, 256 and 640 tokens later (episodes copy the
# request into the answer ~700 tokens on)
REHEARSAL_WINDOW, REHEARSAL_BATCH, REHEARSAL_GAPS = 32, 8, (32, 256, 640)
SCAFFOLD_FRACTION = 0.15  # assistant tokens in at least this share of teacher episodes are templates, never permuted
FIRST_TURN_BATCH = 16  # rows of the first-turn stage (~100 tokens each)
FIRST_TURN_EXTENSION = 100  # steps the last pre-SFT attempt's first-turn stage goes on by while above the target
PRE_SFT_RESEED = 1000  # pre-SFT attempt k initialises and draws its batches with seed + k·PRE_SFT_RESEED
ENV_FILE = "env.toml"
# runs with fewer world tasks than this build and play them in this process: starting a worker process costs ~2 s
# (it imports the library), as much as ~50 tasks' work
MIN_TASKS_FOR_WORKERS = 100


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimTinyConfig:
    """Everything the sim-tiny run decides (defaults, measured on 2 CPU cores: 19-23 minutes when SFT takes its
    usual steps, by the day's speed; a first-turn restart adds ~2.5, each SFT extension 5-8)."""

    seed: int = 0
    # worlds
    # ~300 kept teacher episodes; measured (seed 0, docs/sim_tiny.md): 6 worlds (~150 episodes) -> held-out SFT score
    # 0.17, 12 worlds -> 0.47 with the same SFT steps. The policy is short of examples, not of steps.
    sft_worlds: int = 12
    tasks_per_world: int = 40
    # the GRPO world; each step's tasks are drawn from an endless shuffled stream of them (by default each task once)
    grpo_tasks: int = 960
    eval_tasks: int = 100
    # The world generation the run builds. 1: the first offline world (one fact sheet per release, clean searches),
    # where the three-call teacher reaches ~0.7. World 2 (dead links, leaks, spread facts, two subjects) needs the
    # page-reading pixel-only expert with eight calls as teacher; its three-call teacher scores ~0.05 there.
    world_version: int = 1
    # environment (what the policy sees)
    # Only today's date as system prompt: the policy learns the tools and formats from its data, and a fixed
    # 200-token prompt is context it must learn to look past (copying was learned far more slowly with it).
    prompt_style: str = "date"
    max_turns: int = 5
    max_tool_calls: int = 4
    text_top_k: int = 5
    teacher_query: str = "request"  # what the teacher searches: the request verbatim, or its proper nouns
    teacher_min_reward: float = 0.5  # rejection: SFT keeps teacher episodes at least this good (a search pass)
    # policy
    size: tiny_policy.TinyPolicySize = tiny_policy.TinyPolicySize(vocab_size=2048)
    max_new_tokens: int = 160
    # SFT
    sft_steps: int = 300
    sft_batch: int = 8
    sft_learning_rate: float = 3e-3
    # Before SFT: copying from the context, taught on repeated random tokens (rl.copy_warmup; 0 skips it), then the
    # first turns of the teacher's episodes (data.first_turns: request -> first search, ~100 tokens a row), every
    # content word permuted. Measured (docs/sim_tiny.md): without the warm-up the first-turn loss stays at ~1.3, with
    # it the policy learns to copy (held-out first-turn loss ~0.03).
    copy_warmup_steps: int = 150
    first_turn_steps: int = 700
    # Using the copy is a sudden transition whose step varies from run to run (docs/sim_tiny.md, "When the copy is
    # learned"): the first-turn loss falls from ~1.2 to 0.006-0.05 somewhere in steps ~250-550, and in one run (seed
    # 2 on the AVX-512 machine) not by step 700 (loss 0.40; its SFT policy scored 0.00). So: when the mean loss of
    # the stage's last 50 steps is above `first_turn_target_loss`, both stages start again from another
    # initialisation (attempt k: seed + 1000·k), up to `pre_sft_attempts` in all; the last attempt instead goes on,
    # FIRST_TURN_EXTENSION steps at a time, up to `first_turn_max_steps`. A run whose copy is learned by step 700
    # is unchanged by the check.
    first_turn_target_loss: float = 0.1
    # ... and once the copy is used, the stage stops as soon as that mean is at or below `first_turn_stop_loss`
    # (None: it takes its steps): the loss after the jump falls on slowly, 0.02 -> 0.006-0.013 over the stage's
    # last ~200 steps (~40 s on 2 cores), and SFT trains the first turns again as part of whole episodes
    first_turn_stop_loss: float | None = 0.02
    # ... and an attempt that is not the last but ends at or below `first_turn_jump_loss` has made the jump (the
    # loss before it sits at ~1.0-1.6, and stages that did not make it ended at 0.34-0.63) and is only short of the
    # target: it goes on as the last attempt does instead of starting again (None: it starts again). Seed 37 ended
    # its 700 steps at 0.102 and started again from an initialisation whose first turns then took 1,700 steps;
    # seed 18 ended at 0.141
    first_turn_jump_loss: float | None = 0.2
    pre_sft_attempts: int = 2
    first_turn_max_steps: int = 1800
    # The whole-episode SFT can stall as the first turns can: seed 2 on the AVX-512 machine, its copy learned on the
    # second attempt, ended its 300 steps at mean loss 0.31 (0.02-0.03 in the other runs) and its SFT policy scored
    # 0.01; 300 more steps took it to 0.10 and 0.30 (docs/sim_tiny.md). So while the mean loss of the last 50 steps
    # is above `sft_target_loss`, SFT goes on `sft_extension_steps` at a time (the cosine schedule stretched to the
    # new end, resumed from the stage's checkpoint), at most `sft_max_extra_steps` beyond `sft_steps`. Extensions of
    # 100 steps resume at 5-15% of the peak learning rate: seed 3 then hovered at 0.050-0.055 from step 400 to 800
    # where 300 steps took it to 0.036 (docs/sim_tiny.md). The target is 0.08 (0.05 before): it catches a stalled
    # SFT (0.31 and 0.10 above, policies of 0.01 and 0.26) but not seeds 3 and 5, which end 300 steps at 0.063 and
    # 0.072. Their extension cost ~6 minutes, and without it GRPO still beats SFT on the two fresh worlds by more
    # than 2 SE (+0.074 and +0.045 against +0.026 and +0.085), while seed 5's policies are weaker (GRPO 0.29 against
    # 0.42 on its own world), as are seed 2's, whose SFT now stops at 900 steps (GRPO 0.47 against 0.53, gaining
    # nothing either way); docs/sim_tiny.md, "The target: 0.08".
    sft_target_loss: float = 0.08
    sft_extension_steps: int = 300
    sft_max_extra_steps: int = 900
    # Rehearsing the random-token copy after every SFT step (off: measured not to help, ~35% more SFT time).
    copy_rehearsal: bool = False
    sft_augment: bool = True  # permute every content word through each SFT episode (data.augment.content_words)
    # GRPO: 8 steps of 960 decision-sampled episodes (120 groups of 8) over a 960-task world, each task once,
    # attention trained alone. Measured from the SFT policies (SFT target 0.05 then) of seeds 0, 1, 3, 4 and 5
    # (docs/sim_tiny.md, "Eight steps of 960 episodes"): on two fresh 300-task worlds no setting was chosen on,
    # GRPO - SFT held-out greedy reward +0.034 (paired SE 0.013), +0.014 (0.010), +0.026 (0.013), +0.076 (0.018),
    # +0.085 (0.017), +0.047 (pooled SE 0.006) over the five. The default before (`GRPO_SCHEDULES["short"]`: 4
    # steps of 240, a quarter of the gradient's noise scale each) gave +0.008, +0.006, -0.006, -0.009, +0.029 there:
    # at this scale the greedy policy moves with ~10^4 episodes, not ~10^3. Steps of 32 episodes (6 of 4 groups of
    # 8, every token of the sampled turn drawn, every parameter, lr 1e-4: `GRPO_SCHEDULES["small-steps"]`) gave
    # -0.017 to -0.000 on the runs' own worlds. With the SFT target 0.08 and every group sampling the find_object
    # turn (`GRPO_SCHEDULES["find-object-turn"]`), nineteen seeds each run once from an empty folder: +0.034 on the
    # two fresh worlds (pooled SE 0.0034), by more than 2 SE on ten of them, losing on four (README, "What it
    # reaches"); for the answer turn trained as well see `branch_turns`
    grpo_steps: int = 8
    grpo_tasks_per_step: int = 120
    group_size: int = 8
    # episodes the GRPO actor keeps in flight (its sampler's rows; the evaluations use as many): a step's
    # grpo_tasks_per_step x group_size episodes run in batches of at most this many. Measured on 2 CPU cores
    # (docs/sim_tiny.md): 2.3 episodes/s with 32 rows, 0.88 with 240 (decode time grows with the rows)
    actor_concurrency: int = 32
    # GRPO actor processes, splitting each round's groups between them (`actor --part I/N`: the same episodes as one
    # actor) and `actor_concurrency` rows evenly. One actor process keeps ~1.5 of 2 CPU cores busy (its episodes'
    # Python and its sampler calls take turns on one thread); two of 16 rows each played a sampled evaluation of
    # 256 episodes in 43 s against 61 s for one of 32 (docs/sim_tiny.md)
    actor_processes: int = 2
    # GRPO episodes per learner batch (whole groups, at least one): a larger step runs in several batches that make
    # its one update (gradients accumulated, `Learner.accumulated_step`), so the learner's memory follows this and
    # not the step's size. One batch of 960 episodes (120 groups of 8) took the learner to ~18 GB on 2 CPU cores.
    # Every named schedule's steps fit one batch, so their updates are those measured
    grpo_learner_rows: int = 240
    # with small steps (32 episodes, every parameter) from one SFT policy (held-out reward 0.275): 1e-4 -> 0.257,
    # 3e-4 -> 0.221, 1e-3 -> 0 (docs/sim_tiny.md); the large decision-sampled steps of attention alone take 3e-4
    grpo_learning_rate: float = 3e-4
    temperature: float = 1.0
    # nucleus mass and top-k of the GRPO samples (1.0 / -1: the whole distribution)
    top_p: float = 1.0
    top_k: int = -1
    # decision sampling of the GRPO rollouts (`policy.SamplingParams.draw_below` / `max_draws`): draw a token only
    # where the policy's most likely one has probability below `draw_below`, at most `max_draws` a turn, the
    # argmax elsewhere; only drawn tokens are trained (1.0 / 0: every token of the sampled turn drawn and trained).
    # Measured (docs/sim_tiny.md): a four times lower gradient noise scale than every token drawn (~1.1e3 episodes
    # against ~4.2e3); with no cap on the draws (max_draws 0, every parameter trained) the seed-2 policy lost -0.41
    draw_below: float = 0.9
    max_draws: int = 2
    # turns each GRPO group may branch at (runner.RolloutConfig.branch_turns, one drawn per group; (0,): whole
    # episodes sampled) and how many turns from there are sampled (None: all; the later ones are greedy, untrained
    # context). Turn 2 is the find_object description, where the SFT policy's held-out failures are (which snippet's
    # look it copies); turn 3 is the answer. Measured at the 12-world seed-0 SFT policy (docs/sim_tiny.md): sampling
    # turn 2 alone lowers the gradient noise scale from 5.1e3 to 7e2 episodes. But with turn 2 alone the answer turn
    # is never trained, and GRPO's updates of the shared attention can break its JSON (seed 18: unparseable answers
    # on the fresh worlds 81 -> 179 of 600); half the groups branching at the answer hold it. Measured from the SFT
    # checkpoints of seeds 12, 13, 17 and 18 (docs/sim_tiny.md, "Where the weak seeds lose"); the schedule
    # "find-object-turn" is the setting before
    branch_turns: tuple[int, ...] = (2, 3)
    sample_turns: int | None = 1
    # each group's first member plays the sampled turn greedily, still trained (`RolloutConfig.greedy_member`; with
    # decision sampling, where a sample would draw): the held-out evaluation is greedy, and this member's advantage
    # says whether the mode beats the group's samples.
    # Measured from the seed-0 SFT policy (docs/sim_tiny.md): -0.027 at 192 episodes, +0.037 at 640, -0.064 at 960
    greedy_member: bool = False
    # a group member whose sampled turn (and the observation after it) equals an earlier member's takes over that
    # member's greedy continuation instead of replaying it (`RolloutConfig.share_continuations`; exact: the offline
    # world answers a history the same way every time). ~30% of the members repeat one (5.2-5.7 distinct episodes
    # in a group of 8). No effect with sample_turns None (no greedy turns after the sampled ones)
    share_continuations: bool = True
    max_staleness: int = 2
    # GRPO advantages: "group" (one per episode) or "prefix-tree" (per token, from the group's shared prefixes)
    advantages: str = "group"
    # parameters GRPO leaves as SFT made them (`LearnerConfig.frozen`: names in parameter paths); by default the
    # embeddings (tied to the head), the MLPs and the vision tower, so attention alone is trained (198k of the
    # language model's 1.05M parameters). Adam moves every trained parameter by about the learning rate whatever its
    # gradient; with all of them trained the decision-sampled steps broke the seed-2 policy's greedy turns (-0.210,
    # docs/sim_tiny.md), with attention alone +0.019
    grpo_frozen: tuple[str, ...] = ("embed_tokens", "mlp", "visual")
    # the learner runs each group's shared context (the greedy turns before the sampled one) once and the members'
    # sampled turns as short rows continuing it (`data.shared_prefix`; exact): ~5x fewer learner tokens per step
    shared_prefix: bool = True
    # the learner sees each GRPO group's content words permuted (one draw per group, the SFT permutation:
    # `grpo_augmentation`), so an update cannot make the policy recall a GRPO task's look, only copy better; the
    # tokens are then not the sampled ones, so no sampler correction (TIS) is applied. Off: measured from the seed-0
    # SFT policy (docs/sim_tiny.md), held-out reward -0.010 (0.028) after 6 steps and -0.019 (0.029) after 18, no
    # better than without (18 steps without: -0.010 (0.046), while +0.056 (0.041) on the GRPO tasks themselves)
    grpo_augment: bool = False
    # control
    blind: bool = False
    progress: bool = True
    # processes for the pure-Python stages (building the worlds, the teacher's episodes), one job per world; 0: one
    # per usable core (at most 8), 1: this process alone. The outputs are the same whatever the count: each job's
    # results are consumed in the worlds' order. Measured on 2 cores (docs/sim_tiny.md): ~55 s -> ~33 s. A run of
    # fewer than MIN_TASKS_FOR_WORKERS world tasks uses this process alone (`stage_workers`)
    workers: int = 0
    # JAX's persistent compilation cache (`ranger_jax.compilation_cache`): the actor and the evaluations load the
    # sampler programs compiled before them instead of compiling them again, and a later run on the machine loads
    # what an earlier one compiled (programs do not depend on the seed, except the first turns' length). In
    # `compilation_cache_dir`, by default (None) the user's shared folder (`compilation_cache.default_dir()`:
    # $RANGER_JAX_CACHE_DIR, else ~/.cache/ranger_jax/jax); a run that is to be timed from nothing names an empty one
    compilation_cache: bool = True
    compilation_cache_dir: str | None = None
    # with two or more actor processes, each runs on its own share of the cores (`actor --cpus`,
    # `cpu_affinity.split_cpus`), as do the evaluations' worker processes: XLA sizes each process's thread pool to the
    # cores it may use, and pools as wide as the machine preempt one another. Measured on 2 cores (docs/sim_tiny.md):
    # a sampled evaluation in two processes 26-30 s pinned against 31-36 s, the same rewards
    pin_actors: bool = True

    def __post_init__(self):
        for name in ("sft_worlds", "tasks_per_world", "grpo_tasks", "eval_tasks", "sft_steps", "sft_batch",
                     "grpo_tasks_per_step", "group_size", "actor_concurrency", "actor_processes",
                     "grpo_learner_rows", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SimTinyConfig.{name} must be a positive int; got {value!r}")
        for name in ("copy_warmup_steps", "first_turn_steps", "first_turn_max_steps", "pre_sft_attempts",
                     "sft_extension_steps", "sft_max_extra_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SimTinyConfig.{name} must be an int >= 0; got {value!r}")
        process_pool.auto_workers(self.workers)  # raises on a bad count
        if self.pre_sft_attempts < 1:
            raise ValueError(f"SimTinyConfig.pre_sft_attempts must be at least 1; got {self.pre_sft_attempts}")
        if self.first_turn_max_steps < self.first_turn_steps:
            raise ValueError(f"SimTinyConfig.first_turn_max_steps ({self.first_turn_max_steps}) must be at least "
                             f"first_turn_steps ({self.first_turn_steps})")
        for name in ("first_turn_target_loss", "sft_target_loss"):
            target = getattr(self, name)
            if isinstance(target, bool) or not isinstance(target, (int, float)) or not target > 0:
                raise ValueError(f"SimTinyConfig.{name} must be a number > 0; got {target!r}")
        stop = self.first_turn_stop_loss
        if stop is not None and (isinstance(stop, bool) or not isinstance(stop, (int, float)) or not 0 < stop
                                 <= self.first_turn_target_loss):
            raise ValueError(f"SimTinyConfig.first_turn_stop_loss must be None or a number in (0, "
                             f"first_turn_target_loss={self.first_turn_target_loss}]; got {stop!r}")
        jump = self.first_turn_jump_loss
        if jump is not None and (isinstance(jump, bool) or not isinstance(jump, (int, float))
                                 or not jump > self.first_turn_target_loss):
            raise ValueError(f"SimTinyConfig.first_turn_jump_loss must be None or a number above "
                             f"first_turn_target_loss={self.first_turn_target_loss}; got {jump!r}")
        if self.compilation_cache_dir is not None and (not isinstance(self.compilation_cache_dir, str)
                                                       or not self.compilation_cache_dir.strip()):
            raise ValueError(f"SimTinyConfig.compilation_cache_dir must be None (the shared default) or a folder; got "
                             f"{self.compilation_cache_dir!r}")
        object.__setattr__(self, "branch_turns", runner.checked_branch_turns(self.branch_turns, "SimTinyConfig"))
        runner.check_sample_turns(self.sample_turns, "SimTinyConfig")
        if self.shared_prefix and self.sample_turns != 1:
            raise ValueError(f"SimTinyConfig.shared_prefix needs sample_turns=1 (a member's trained tokens are then "
                             f"text after the group's shared context); got sample_turns={self.sample_turns}")
        try:
            self.grpo_sampling()
        except ValueError as error:
            raise ValueError(f"SimTinyConfig sampling of the GRPO rollouts: {error}") from None
        if isinstance(self.grpo_frozen, str) or not all(isinstance(n, str) for n in self.grpo_frozen):
            raise ValueError(f"SimTinyConfig.grpo_frozen must be a sequence of parameter path names; got "
                             f"{self.grpo_frozen!r}")
        object.__setattr__(self, "grpo_frozen", tuple(self.grpo_frozen))  # a JSON round trip gives a list
        if self.advantages not in pipeline.ADVANTAGE_ESTIMATORS:
            known = " or ".join(repr(name) for name in pipeline.ADVANTAGE_ESTIMATORS)
            raise ValueError(f"SimTinyConfig.advantages must be {known}; got {self.advantages!r}")
        if self.grpo_steps < 0:
            raise ValueError(f"SimTinyConfig.grpo_steps must be >= 0; got {self.grpo_steps}")
        if self.group_size < 2 and self.grpo_steps:
            raise ValueError(f"GRPO needs group_size >= 2; got {self.group_size}")
        for name in ("greedy_member", "share_continuations"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SimTinyConfig.{name} must be a bool; got {getattr(self, name)!r}")


    def grpo_sampling(self) -> policy_lib.SamplingParams:
        """How the GRPO rollouts' sampled turns are sampled."""
        return policy_lib.SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                         draw_below=self.draw_below, max_draws=self.max_draws)

    # seeds: each run seed owns [1000·seed + 1, 1000·seed + 999]; the eval seed is never a training seed
    def sft_seeds(self) -> list[int]:
        """World seeds of the SFT data."""
        return [1000 * self.seed + 1 + i for i in range(self.sft_worlds)]

    def grpo_seed(self) -> int:
        """World seed of the GRPO tasks."""
        return 1000 * self.seed + 500

    def eval_seed(self) -> int:
        """World seed of the held-out evaluation tasks."""
        return 1000 * self.seed + 999

    def env_options(self) -> dict[str, Any]:
        """EnvConfig fields of the environment the policy acts in."""
        return {"tools": list(TOOLS), "prompt_style": self.prompt_style, "show_links": False,
                "max_turns": self.max_turns, "max_tool_calls": self.max_tool_calls}


# Named GRPO settings (`recipes/grpo_savanna.py --grpo-schedule`), each measured from SFT policies of several seeds
# (held-out greedy reward difference, paired SE; docs/sim_tiny.md). "default": the config's defaults (8 steps of 120
# decision-sampled groups of 8, half branching at the find_object turn and half at the answer, attention alone).
# "find-object-turn", the default before (every group branching at the find_object turn): on two fresh worlds no
# setting was chosen on, +0.034 (0.013), +0.014 (0.010), +0.026 (0.013), +0.076 (0.018), +0.085 (0.017) on seeds
# 0, 1, 3, 4, 5. The others were measured on the runs' own evaluation worlds, where the settings were chosen; on a
# fresh world none of them beats the SFT policy (docs/sim_tiny.md, "On a fresh world"). Every schedule after "long"
# was measured with the find_object turn alone sampled, and keeps that setting.
FIND_OBJECT_TURN = {"branch_turns": (2,)}
SHORT = {"grpo_tasks": 240, "grpo_tasks_per_step": 30, "grpo_steps": 4,  # 4 steps of 30 groups over 240 tasks
         **FIND_OBJECT_TURN}
GROUPS_OF_4 = {**SHORT, "grpo_tasks_per_step": 60, "group_size": 4}
GRPO_SCHEDULES: dict[str, dict[str, Any]] = {
    "default": {},
    # the default (8 steps of 960 episodes, each task of a 960-task world once), named
    "long": {"grpo_tasks": 960, "grpo_tasks_per_step": 120, "grpo_steps": 8},
    # the default before: the same steps with every group branching at the find_object turn, the answer turn never
    # trained (README, the nineteen-seed table: +0.034 on the fresh worlds, pooled SE 0.0034)
    "find-object-turn": dict(FIND_OBJECT_TURN),
    # the default before, an eighth of the episodes (4 steps of 240): +0.055 (0.029), +0.000 (0.026), +0.082
    # (0.032) on seeds 0, 1, 3 on their own worlds, +0.008, +0.006, -0.006, -0.009, +0.029 on the fresh ones
    # (seeds 0, 1, 3, 4, 5); ~3 minutes of GRPO on 2 CPU cores where the default takes ~12
    "short": dict(SHORT),
    # the default before groups of 8: 60 groups of 4 a step (on machine B +0.009, +0.000, +0.028 for seeds 0, 1, 3,
    # where groups of 8 gave +0.055, +0.000, +0.082)
    "groups-of-4": dict(GROUPS_OF_4),
    # one step fewer of groups of 4 (the default before shared trunks made the actor 1.5x faster): +0.036 (0.023),
    # +0.063 (0.041), +0.019 (0.018); ~90 s less
    "three-steps": {**GROUPS_OF_4, "grpo_steps": 3},
    # an earlier default: 6 steps of 4 groups of 8 over 80 tasks, every token of the sampled turn drawn, every
    # parameter trained at lr 1e-4: -0.009 (0.024), -0.000 (0.032), -0.017 (0.023); ~100-170 s of GRPO
    "small-steps": {**FIND_OBJECT_TURN, "grpo_tasks": 80, "grpo_tasks_per_step": 4, "group_size": 8,
                    "grpo_steps": 6, "grpo_learning_rate": 1e-4, "draw_below": 1.0, "max_draws": 0, "grpo_frozen": ()},
    # 12 steps of 240 episodes over a 720-task world, every token of the sampled turn drawn, every parameter: +0.064
    # (0.027), +0.064 (0.047), -0.009 (0.028); 22-28 minutes of GRPO on 2 CPU cores before the actor's savings
    "large-batch": {**FIND_OBJECT_TURN, "grpo_tasks": 720, "grpo_tasks_per_step": 60, "group_size": 4,
                    "grpo_steps": 12, "grpo_learning_rate": 2e-4, "draw_below": 1.0, "max_draws": 0, "grpo_frozen": ()},
    # four steps of groups of 4 with every parameter trained: +0.037 (0.034), +0.064 (0.044), then -0.210 (0.043)
    # on seed 2, whose trained turn broke at its greedy end (25 unparseable answers in 100; at lr 2e-4 still -0.055)
    "decision-batch": {**GROUPS_OF_4, "grpo_frozen": ()},
}


def _override_value(field: dataclasses.Field, text: str) -> Any:
    """A `--set` value for `field`: JSON (numbers, true/false, null, lists, objects), else the text itself."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = text
    default = field.default
    if value is None and "None" in str(field.type):
        return None
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, tuple):
        ok = isinstance(value, list)
        value = tuple(value) if ok else value
    elif dataclasses.is_dataclass(default):
        ok = isinstance(value, dict)
        if ok:
            try:
                value = dataclasses.replace(default, **value)
            except TypeError as error:
                raise ValueError(f"--set {field.name}: {error}") from None
    else:
        ok = True
    if not ok:
        raise ValueError(f"--set {field.name}={text}: expected {type(default).__name__} like {default!r}")
    return value


def config_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`SimTinyConfig` fields from `KEY=VALUE` texts (the recipe's `--set`), each value checked against the field's
    default's type (an int for `sft_steps`, a JSON list for `branch_turns`, a JSON object for `size`).

    Raises:
        ValueError: a text without "=", an unknown field (the known ones listed), or a value of the wrong type.
    """
    fields = {f.name: f for f in dataclasses.fields(SimTinyConfig)}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"--set needs KEY=VALUE; got {pair!r}")
        if key not in fields:
            raise ValueError(f"--set {key}: SimTinyConfig has no field {key!r}; fields: {', '.join(sorted(fields))}")
        out[key] = _override_value(fields[key], text.strip())
    return out


def configure(*, seed: int = 0, blind: bool = False, grpo_schedule: str = "default",
              overrides: dict[str, Any] | None = None) -> SimTinyConfig:
    """The recipe's `SimTinyConfig`: defaults, then a named GRPO schedule (`GRPO_SCHEDULES`), then `overrides`.

    Raises:
        ValueError: an unknown schedule (the known ones named) or an override the config refuses.
    """
    if grpo_schedule not in GRPO_SCHEDULES:
        raise ValueError(f"unknown GRPO schedule {grpo_schedule!r}; known: {', '.join(GRPO_SCHEDULES)}")
    return SimTinyConfig(**{"seed": seed, "blind": blind, **GRPO_SCHEDULES[grpo_schedule], **(overrides or {})})


def write_env_file(config: SimTinyConfig, path: Path) -> Path:
    """The run's environment as a TOML file (for actor processes and for the exported policy)."""
    options = config.env_options()
    lines = ["# Written by the sim-tiny recipe: the environment its policy was trained in.",
             'backend = "offline"', "", "[env]"]
    for key, value in options.items():
        lines.append(f"{key} = {json.dumps(value)}")
    lines += ["", "[rewards]", 'kind = "sim"', ""]
    path.write_text("\n".join(lines), "utf-8")
    return path


def stage_workers(config: SimTinyConfig) -> int:
    """Processes for the pure-Python stages: `config.workers`, or 1 for a run too small to pay for starting them."""
    tasks = config.sft_worlds * config.tasks_per_world + config.grpo_tasks + config.eval_tasks
    return config.workers if tasks >= MIN_TASKS_FOR_WORKERS else 1


def _build_world(folder: Path, num_tasks: int, seed: int, world_version: int) -> None:
    build.build_world(folder, num_tasks=num_tasks, seed=seed, world_version=world_version)


def build_worlds(config: SimTinyConfig, root: Path, *, pool: process_pool.JobPool | None = None,
                 grpo_in_background: bool = False) -> dict[str, Any]:
    """Builds (or reuses) every world of the run; returns {"sft": [dirs], "grpo": dir, "eval": dir}.

    Worlds are built on `pool` (default: `stage_workers(config)` processes), one job per world (each depends on its
    seed alone). A world already in `root` is reused when it is the one the config asks for. With
    `grpo_in_background` (and a `pool`) the GRPO world, the largest, is submitted first and not waited for: the
    result's "grpo_job" is its `PendingJob` (None when there was nothing to build), whose `result()` must return
    before the GRPO world is read. The work after the other worlds then fills the core it would leave idle.

    Raises:
        ValueError: a folder of `root` holds another world (its seed, task count or generation differs from the
            config's: a rerun into a run folder with, e.g., another `grpo_tasks`); the data and checkpoints the
            folder holds were made from it, so the run asks for a new folder instead of mixing the two.
    """
    plan = [(f"sft-{s}", s, config.tasks_per_world) for s in config.sft_seeds()]
    plan += [(f"grpo-{config.grpo_seed()}", config.grpo_seed(), config.grpo_tasks),
             (f"eval-{config.eval_seed()}", config.eval_seed(), config.eval_tasks)]
    todo = []
    for name, seed, n in plan:
        if not (root / name / world.WORLD_FILE).exists():
            todo.append((name, seed, n))
        elif differ := world.differences(root / name, seed=seed, num_tasks=n, world_version=config.world_version):
            raise ValueError(f"{root / name} holds another world than this run's: {', '.join(differ)}; run "
                             "into a new output folder (this one's data and checkpoints were made from that world)")
    grpo_name, grpo_job = f"grpo-{config.grpo_seed()}", None
    if grpo_in_background and pool is not None and any(name == grpo_name for name, _, _ in todo):
        grpo_job = pool.submit(_build_world, root / grpo_name, config.grpo_tasks, config.grpo_seed(),
                               config.world_version, label=f"world {grpo_name}")
        todo = [job for job in todo if job[0] != grpo_name]
    process_pool.run_jobs(_build_world, [(root / name, n, seed, config.world_version) for name, seed, n in todo],
                          workers=stage_workers(config), pool=pool, labels=[f"world {name}" for name, _, _ in todo],
                          costs=[n for _, _, n in todo], desc="worlds", progress=config.progress)
    out = {name: root / name for name, _, _ in plan}
    built = {"sft": [out[f"sft-{s}"] for s in config.sft_seeds()], "grpo": out[grpo_name],
             "eval": out[f"eval-{config.eval_seed()}"]}
    return {**built, "grpo_job": grpo_job} if grpo_in_background else built


def _texts(state: Any) -> list[str]:
    out = []
    for message in state.messages:
        content = message["content"]
        out.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
    return out


def teacher(config: SimTinyConfig) -> SnippetAgent:
    """The scripted teacher of the run."""
    return SnippetAgent(top_k=config.text_top_k, query=config.teacher_query)


def _teacher_texts(config: SimTinyConfig, folder: Path) -> list[str]:
    """Every message text of the teacher's episodes on the world in `folder`, in task order."""
    texts: list[str] = []
    with env_lib.make("offline", world=str(folder), **config.env_options()) as tool_env:
        for task in world.load_tasks(folder):
            texts.extend(_texts(agents.run_episode(tool_env, task, teacher(config))))
    return texts


def train_tokenizer(config: SimTinyConfig, worlds: list[Path], out: Path, *,
                    pool: process_pool.JobPool | None = None) -> Any:
    """The policy's compact tokenizer, learned from the teacher's episodes on the SFT worlds (played on `pool`,
    default `stage_workers(config)` processes, one job per world)."""
    per_world = process_pool.run_jobs(_teacher_texts, [(config, folder) for folder in worlds],
                                      workers=stage_workers(config), pool=pool,
                                      labels=[f"world {folder.name}" for folder in worlds], desc="tokenizer text",
                                      progress=config.progress)
    texts = [text for world_texts in per_world for text in world_texts]
    return tiny_policy.train_tokenizer(texts, out, vocab_size=config.size.vocab_size)


def rollout_config(config: SimTinyConfig, *, group_size: int = 1, greedy: bool = False,
                   seed: int = 0) -> runner.RolloutConfig:
    """How the run's episodes are rolled out (tiny images, short turns, blank observations when blind)."""
    sampling = episode.GREEDY if greedy else config.grpo_sampling()
    return runner.RolloutConfig(group_size=group_size, concurrency=16, seed=seed, episode=episode.EpisodeConfig(
        max_new_tokens=config.max_new_tokens, max_context_tokens=4096, sampling=sampling,
        vision=tiny_policy.VISION, blank_observations=config.blind))


def _teacher_episodes(config: SimTinyConfig, folder: Path, tokenizer: Any) -> list[tuple[float, bytes]]:
    """The teacher's episodes on the world in `folder` as (reward, serialized trajectory), in task order."""
    renderer = chat.ChatRenderer(tokenizer, merge_size=tiny_policy.VISION.merge_size)
    with env_lib.make("offline", world=str(folder), **config.env_options()) as tool_env:
        scripted = policy_lib.ScriptedPolicy(teacher(config), tokenizer, name="teacher")
        groups = runner.run(tool_env, scripted, world.load_tasks(folder), renderer=renderer,
                            config=rollout_config(config, greedy=True),  # scripted: no sampling
                            scorer=scoring.make_scorer(tool_env, generate_images=False))
    # in task order, not completion order: the same seed writes the same shards (the SFT data order)
    return [(t.reward, t.to_bytes()) for g in sorted(groups, key=lambda g: g.group_id) for t in g.trajectories]


def record_teacher(config: SimTinyConfig, worlds: list[Path], tokenizer: Any, out: Path, *,
                   pool: process_pool.JobPool | None = None) -> dict[str, float]:
    """The teacher's episodes on `worlds`, those with reward >= `teacher_min_reward` (rejection sampling, as both
    papers filter their teacher trajectories), as trajectory shards in `out`; returns its reward and kept share.

    The worlds are played on `pool` (default: `stage_workers(config)` processes), one job per world; the shards are
    written here, in the worlds' and tasks' order, so they are the same whatever the count."""
    per_world = process_pool.run_jobs(_teacher_episodes, [(config, folder, tokenizer) for folder in worlds],
                                      workers=stage_workers(config), pool=pool,
                                      labels=[f"world {folder.name}" for folder in worlds], desc="teacher episodes",
                                      progress=config.progress)
    rewards, kept = [], 0
    with shards.RollingShardWriter(out, prefix="teacher") as writer:
        for reward, data in (episode_ for world_episodes in per_world for episode_ in world_episodes):
            rewards.append(reward)
            if reward >= config.teacher_min_reward:
                writer.write(Trajectory.from_bytes(data))
                kept += 1
    if not kept:
        raise RuntimeError(f"no teacher episode reached reward {config.teacher_min_reward}; nothing to train on")
    return {"teacher_train_reward": sum(rewards) / len(rewards), "teacher_kept": kept,
            "teacher_episodes": len(rewards)}


def batch_spec(tokenizer: Any, batch_size: int) -> batching.BatchSpec:
    """The learner's batch shapes for the tiny policy's episodes. The teacher's episodes are ~830-1,020 tokens:
    with 1,024 beside 1,152, seed 29's first 300 SFT batches are 267 of 1,024 tokens and 6 of 1,152 (273 of 1,152
    without it), 10% fewer tokens for one more compiled step."""
    return batching.BatchSpec.for_tokenizer(tokenizer, batch_size=batch_size,
                                            length_buckets=(640, 896, 1024, 1152, 1536, 2048, 3072),
                                            vision=tiny_policy.VISION, patch_step=256, image_step=8)


def export_policy(config: SimTinyConfig, model: Any, out: Path, tokenizer_dir: Path, env_file: Path) -> Path:
    """Writes a complete policy folder: HF checkpoint, tokenizer, and the settings it acts with (`ranger_env.json`:
    env, rewards, image bounds and token budgets, so `evals/savanna_sim.py` runs it exactly as trained)."""
    from ranger_jax.models import qwen3_vl

    qwen3_vl.save(model, out)
    write_policy_files(config, tokenizer_dir, env_file, out)
    return out


def write_policy_files(config: SimTinyConfig, tokenizer_dir: Path, env_file: Path, out: Path) -> Path:
    """The files a policy folder holds besides its weights: the tokenizer, and `ranger_env.json` (env, rewards,
    image bounds, token budgets, world generation) from the run's env file and config."""
    from ranger_jax.rollout import trained_env

    out.mkdir(parents=True, exist_ok=True)
    tokenizer_lib.copy_tokenizer_files(tokenizer_dir, out)
    settings = tomllib.loads(env_file.read_text("utf-8"))
    episode_config = rollout_config(config).episode
    trained_env.write(out, trained_env.TrainedEnv(
        env=settings.get("env", {}), rewards=settings.get("rewards", {}),
        image={"min_pixels": episode_config.vision.min_pixels, "max_pixels": episode_config.vision.max_pixels},
        episode={"max_new_tokens": episode_config.max_new_tokens,
                 "max_context_tokens": episode_config.max_context_tokens},
        world={"world_version": config.world_version}))
    return out


def grpo_rows(config: SimTinyConfig) -> int:
    """Episodes of one GRPO step: the actor's round, the learner's batch."""
    return config.grpo_tasks_per_step * config.group_size


def actor_rows(config: SimTinyConfig) -> int:
    """Episodes the GRPO actors run at once (their samplers' rows together): a round, or `actor_concurrency` if
    fewer."""
    return min(grpo_rows(config), config.actor_concurrency)


def rows_per_actor(config: SimTinyConfig) -> int:
    """Episodes one of the `actor_processes` runs at once (its sampler's rows; at least one)."""
    return max(1, actor_rows(config) // config.actor_processes)


def actor_rows_warning(config: SimTinyConfig) -> str | None:
    """Why the GRPO actors will be slower than they could be, or None: an actor whose rows hold less than a group
    plays every member's greedy turns itself (`runner.shares_trunks` needs a whole group in flight). Allowed (a
    small run may want it), but worth saying, since it happens silently when `actor_processes` grows."""
    rows = rows_per_actor(config)
    if rows >= config.group_size or not any(turn > 0 for turn in config.branch_turns):
        return None
    return (f"each of the {config.actor_processes} GRPO actor process(es) runs {rows} row(s), fewer than a group of "
            f"{config.group_size}: groups will not share their greedy turns (slower, the same episodes); raise "
            f"actor_concurrency to at least {config.group_size * config.actor_processes} or lower actor_processes")


def actor_command(config: SimTinyConfig, *, env_file: Path, grpo_world: Path, weights_dir: Path, shards_dir: Path,
                  metrics_path: Path, part: int = 0) -> list[str]:
    """Actor process `part` of the GRPO stage's `actor_processes` (shard prefix `actor<part>`)."""
    vision = tiny_policy.VISION
    command = [sys.executable, "-m", "ranger_jax.rollout.actor", "--env", str(env_file), "--world", str(grpo_world),
               "--policy", "jax", "--weights-dir", str(weights_dir), "--out", str(shards_dir),
               "--prefix", f"actor{part}", "--part", f"{part}/{config.actor_processes}",
               "--group-size", str(config.group_size), "--tasks-per-round", str(config.grpo_tasks_per_step),
               "--concurrency", str(rows_per_actor(config)), "--records-per-shard", str(grpo_rows(config)),
               # the learner takes one round a step: the actor stops after the last one instead of sampling a round
               # no step reads while the learner's last step runs
               "--max-rounds", str(config.grpo_steps),
               "--temperature", str(config.temperature), "--top-p", str(config.top_p),
               "--top-k", str(config.top_k), "--draw-below", str(config.draw_below),
               "--max-draws", str(config.max_draws),
               "--max-new-tokens", str(config.max_new_tokens), "--max-context-tokens", "4096",
               "--min-pixels", str(vision.min_pixels), "--max-pixels", str(vision.max_pixels),
               "--seed", str(config.seed), "--run-id", "grpo", "--metrics", str(metrics_path), "--no-images",
               "--branch-turns", ",".join(str(t) for t in config.branch_turns), "--quiet"]
    if config.sample_turns is not None:
        command += ["--sample-turns", str(config.sample_turns)]
    if config.greedy_member:
        command.append("--greedy-member")
    if config.share_continuations and config.sample_turns is not None:
        command.append("--share-continuations")
    if config.blind:
        command.append("--blank-observations")
    if (cpus := actor_cpus(config, part)) is not None:
        command += ["--cpus", ",".join(str(cpu) for cpu in cpus)]
    return command


def actor_cpus(config: SimTinyConfig, part: int) -> list[int] | None:
    """The cores actor process `part` runs on (`pin_actors`; None: every core, as for a single actor, or where the
    platform cannot pin)."""
    if not config.pin_actors or config.actor_processes < 2 or not cpu_affinity.can_pin():
        return None
    return cpu_affinity.split_cpus(config.actor_processes)[part]


def timed(timings: dict[str, float], name: str):
    """A context manager adding the wall time of a stage to `timings[name]`."""
    class _Timer:
        def __enter__(self):
            self.start = time.monotonic()

        def __exit__(self, *exc):
            timings[name] = round(timings.get(name, 0.0) + time.monotonic() - self.start, 2)

    return _Timer()


def sft_learner(config: SimTinyConfig, model: Any, checkpoint_dir: Path, *,
                total_steps: int | None = None) -> learner_lib.Learner:
    """The SFT learner: AdamW, warmup then cosine decay over every update (`total_steps`, default `sft_steps`;
    twice that with the copy rehearsal)."""
    return learner_lib.Learner(model, sft_learner_config(config, total_steps), checkpoint_dir=checkpoint_dir,
                               max_to_keep=1)


def sft_learner_config(config: SimTinyConfig, total_steps: int | None = None) -> learner_config.LearnerConfig:
    """`sft_learner`'s settings (the schedule's length is part of the compiled train step)."""
    updates = (total_steps or config.sft_steps) * (2 if config.copy_rehearsal else 1)
    return learner_config.LearnerConfig(objective="sft", learning_rate=config.sft_learning_rate, schedule="cosine",
                                        warmup_steps=min(20, updates // 10), total_steps=updates, weight_decay=0.0,
                                        max_grad_norm=1.0)


def sft_dataset(config: SimTinyConfig, tokenizer: Any, source: shards.TrajectorySource,
                permutation: augment.TokenPermutation | None) -> Any:
    """The SFT batches: the teacher's episodes, shuffled by the run's seed, in `batch_spec`'s shapes."""
    return pipeline.trajectory_dataset(source, spec=batch_spec(tokenizer, config.sft_batch), vision=tiny_policy.VISION,
                                       grpo_groups=False, seed=config.seed, augment=permutation)


def precompile_sft_steps(config: SimTinyConfig, tokenizer: Any, source: shards.TrajectorySource) -> int:
    """Compiles the SFT train step for the batch shapes of the first `config.sft_steps` SFT batches into the
    persistent compilation cache, from a throwaway learner of the same settings and model shapes; returns how many
    shapes it compiled. `run_sft` runs it in a thread while the stages before SFT train, so SFT loads its programs
    (~0.4 s each) instead of compiling them (~12 s each in the run, ~13 s of CPU over three threads, most in its
    first 10 steps). On 2 cores those stages keep both busy, so this moves the work more than it hides it: seed 24
    (docs/sim_tiny.md) reached SFT step 100 63 s sooner after stages before it ~45 s longer. The content-word
    permutation maps each token to one token, so the shapes are those of the batches without it.

    Raises:
        ValueError: no persistent compilation cache is configured (`Learner.precompile`).
    """
    learner = learner_lib.Learner(tiny_policy.init_policy(tokenizer, config.size, seed=config.seed),
                                  sft_learner_config(config))
    batches = iter(sft_dataset(config, tokenizer, source, None))
    return sum(learner.precompile(next(batches)) for _ in range(config.sft_steps))


def grpo_learner(config: SimTinyConfig, model: Any) -> learner_lib.Learner:
    """The GRPO learner: constant learning rate, π_old = the learner before the update, TIS for stale samples."""
    settings = learner_config.LearnerConfig(objective="grpo", learning_rate=config.grpo_learning_rate,
                                            schedule="constant", max_grad_norm=1.0, old_logp="learner",
                                            agg="seq-mean-token-mean", clip_low=0.2, clip_high=0.28,
                                            tis_cap=None if config.grpo_augment else 2.0,
                                            temperature=config.temperature, frozen=config.grpo_frozen)
    return learner_lib.Learner(model, settings)


def sft_augmentation(tokenizer: Any, source: shards.TrajectorySource, *,
                     per_unit: bool = False) -> augment.TokenPermutation | None:
    """The SFT data's consistent permutation of every content word (`augment.content_words`): all word tokens of the
    vocabulary except the system prompt's, the templates of the teacher's turns and the words it only reads
    (`augment.protected_ids`). `per_unit`: one draw for a whole GRPO group (`grpo_augmentation`)."""
    episodes = ((source[i].token_ids, source[i].loss_mask) for i in range(len(source)))
    protected = augment.protected_ids(episodes, end_of_turn_id=tokenizer.im_end_id, fraction=SCAFFOLD_FRACTION)
    groups = augment.content_words(tokenizer, protected=protected)
    return augment.TokenPermutation(groups, per_unit=per_unit) if groups else None


def grpo_augmentation(tokenizer: Any, sft_data: Path) -> augment.TokenPermutation | None:
    """The SFT permutation (same protected scaffolding, read from the teacher's shards in `sft_data`), one draw per
    GRPO group: the learner sees each group's words permuted, so its update cannot recall a GRPO task's look."""
    return sft_augmentation(tokenizer, shards.TrajectorySource(sft_data), per_unit=True)


def _pre_sft_learner(config: SimTinyConfig, model: Any) -> learner_lib.Learner:
    return learner_lib.Learner(model, learner_config.LearnerConfig(
        objective="sft", learning_rate=config.sft_learning_rate, schedule="constant", weight_decay=0.0,
        max_grad_norm=1.0))


def train_first_turns(config: SimTinyConfig, learner: learner_lib.Learner, batches: Any,
                      metrics: metrics_lib.MetricsWriter | None, *, extend: bool = True,
                      extend_below: float | None = None, log_prefix: str = "first_turns") -> dict[str, Any]:
    """The first-turn stage: `first_turn_steps`, then (with `extend`) FIRST_TURN_EXTENSION more at a time while the
    mean loss of the last steps is above `first_turn_target_loss` (up to `first_turn_max_steps`) and, given
    `extend_below`, at or below it (an attempt that may still start again goes on only once it has made the jump);
    it stops sooner once that mean is at or below `first_turn_stop_loss`. Returns the last step's metrics with
    `steps` taken, that `recent_loss` and `copy_learned` (the target was reached)."""
    def train(steps: int) -> sft.SftResult:
        return sft.train(learner, batches, num_steps=steps, metrics=metrics, progress=config.progress,
                         log_prefix=log_prefix, stop_below=config.first_turn_stop_loss)

    result = train(config.first_turn_steps)
    while (extend and result.recent_loss > config.first_turn_target_loss
           and (extend_below is None or result.recent_loss <= extend_below)
           and result.num_steps < config.first_turn_max_steps):
        steps = min(result.num_steps + FIRST_TURN_EXTENSION, config.first_turn_max_steps)
        why = "the copy is not used yet" if extend_below is None else \
            f"at or below {extend_below}: the copy is used, short of the target"
        print(f"first turns: mean loss {result.recent_loss:.3f} over the last steps is above "
              f"{config.first_turn_target_loss} ({why}); training to step {steps}", file=sys.stderr, flush=True)
        result = train(steps)
    learned = result.recent_loss <= config.first_turn_target_loss
    if not learned and extend and extend_below is None:
        print(f"warning: first turns end at mean loss {result.recent_loss:.3f} after {result.num_steps} steps, above "
              f"{config.first_turn_target_loss}: the policy may not copy names (its held-out scores will show it)",
              file=sys.stderr, flush=True)
    return {**result.last, "steps": result.num_steps, "recent_loss": result.recent_loss, "copy_learned": learned}


def pre_sft(config: SimTinyConfig, tokenizer: Any, source: Any, permutation: augment.TokenPermutation | None,
            metrics: metrics_lib.MetricsWriter | None) -> tuple[Any, dict[str, Any]]:
    """Copy warm-up and first turns of a fresh tiny policy, started again from another initialisation while the
    first turns end above `first_turn_target_loss` (`pre_sft_attempts`; the last attempt extends its first turns
    instead, as does an earlier one that ends at or below `first_turn_jump_loss`). Returns the model and the chosen
    attempt's stage metrics (`copy_warmup`, `first_turns`) with `attempts`: each attempt's seed, first-turn steps
    and mean loss at the end. Attempt k logs its metrics under
    `copy_warmup`/`first_turns` with a `_k` suffix for k > 0."""
    attempts: list[dict[str, Any]] = []
    for attempt in range(config.pre_sft_attempts):
        seed, suffix = config.seed + PRE_SFT_RESEED * attempt, f"_{attempt}" if attempt else ""
        last_attempt = attempt == config.pre_sft_attempts - 1 or not config.first_turn_steps
        model = tiny_policy.init_policy(tokenizer, config.size, seed=seed)
        stages: dict[str, Any] = {}
        if config.copy_warmup_steps:
            warm = _pre_sft_learner(config, model)
            stages["copy_warmup"] = copy_warmup.train(warm, tokenizer, copy_warmup.CopyWarmupConfig(
                steps=config.copy_warmup_steps, seed=seed), metrics=metrics, progress=config.progress,
                log_prefix="copy_warmup" + suffix)
            model = warm.params_model()
            warm.close()
        if not config.first_turn_steps:
            return model, stages
        first = _pre_sft_learner(config, model)
        batches = first_turns.FirstTurnBatches(source, pad_id=tokenizer.pad_id, batch_size=FIRST_TURN_BATCH,
                                               seed=seed, augment=permutation)
        jump = None if last_attempt else config.first_turn_jump_loss
        stages["first_turns"] = train_first_turns(config, first, batches, metrics,
                                                  extend=last_attempt or jump is not None, extend_below=jump,
                                                  log_prefix="first_turns" + suffix)
        model = first.params_model()
        first.close()
        ended = stages["first_turns"]
        attempts.append({"seed": seed, "steps": ended["steps"], "recent_loss": ended["recent_loss"]})
        if ended["copy_learned"] or last_attempt:
            break
        print(f"first turns: mean loss {ended['recent_loss']:.3f} over the last steps after {ended['steps']} steps "
              f"is above {config.first_turn_target_loss} (the copy is not used); starting the copy warm-up and "
              f"first turns again from initialisation seed {seed + PRE_SFT_RESEED}", file=sys.stderr, flush=True)
    stages["attempts"] = attempts
    return model, stages


def run_sft(config: SimTinyConfig, tokenizer: Any, data_dir: Path, out: Path,
            metrics: metrics_lib.MetricsWriter) -> tuple[learner_lib.Learner, sft.SftResult, dict[str, float]]:
    """Copy warm-up, first turns, then SFT of a fresh tiny policy on the teacher's shards; returns the SFT learner,
    its result and the stages' last metrics before SFT (`copy_warmup`, `first_turns`; empty when skipped: no
    steps, or an SFT run to resume)."""
    checkpoint_dir = out / "checkpoints" / "sft"
    source = shards.TrajectorySource(data_dir)
    permutation = sft_augmentation(tokenizer, source) if config.sft_augment else None
    if checkpoint_dir.exists() and any(checkpoint_dir.iterdir()):  # a resumed SFT run skips the stages before it
        model, stages = tiny_policy.init_policy(tokenizer, config.size, seed=config.seed), {}
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            ahead = thread.submit(precompile_sft_steps, config, tokenizer, source) \
                if jax.config.jax_compilation_cache_dir else None
            model, stages = pre_sft(config, tokenizer, source, permutation, metrics)
            if ahead is not None:
                stages["sft_shapes_precompiled"] = ahead.result()
    learner = sft_learner(config, model, checkpoint_dir)
    dataset = sft_dataset(config, tokenizer, source, permutation)
    rehearsal = None
    if config.copy_rehearsal:
        rehearsal = copy_warmup.RepeatedRandomTokens(copy_warmup.ordinary_ids(tokenizer), window=REHEARSAL_WINDOW,
                                                     batch_size=REHEARSAL_BATCH, seed=config.seed + 1,
                                                     gaps=REHEARSAL_GAPS)
    def train(learner: learner_lib.Learner, steps: int) -> sft.SftResult:
        return sft.train(learner, dataset, num_steps=steps, metrics=metrics, resume=True,
                         checkpoint_every=max(50, config.sft_steps // 4), progress=config.progress,
                         rehearsal=rehearsal)

    segments = [train(learner, config.sft_steps)]
    while (steps := next_sft_steps(config, segments[-1].num_steps, segments[-1].recent_loss)) is not None:
        loss = segments[-1].recent_loss
        print(f"sft: mean loss {'unknown' if loss is None else f'{loss:.3f}'} over the last steps after "
              f"{segments[-1].num_steps} steps (target {config.sft_target_loss}); training to step {steps}",
              file=sys.stderr, flush=True)
        model = learner.params_model()
        learner.close()
        learner = sft_learner(config, model, checkpoint_dir, total_steps=steps)
        segments.append(train(learner, steps))
    result = segments[-1]
    if len(segments) > 1:  # the summary's figures cover every segment
        wall = sum(s.wall_s for s in segments)
        tokens = sum(s.tokens_per_s * s.wall_s for s in segments)
        result = dataclasses.replace(result, wall_s=wall, tokens_per_s=tokens / wall if wall > 0 else 0.0)
    if result.recent_loss is not None and result.recent_loss > config.sft_target_loss:
        print(f"warning: SFT ends at mean loss {result.recent_loss:.3f} after {result.num_steps} steps, above "
              f"{config.sft_target_loss}: the SFT policy may be weak (its held-out scores will show it)",
              file=sys.stderr, flush=True)
    return learner, result, stages


def next_sft_steps(config: SimTinyConfig, done: int, recent_loss: float | None) -> int | None:
    """Where SFT goes on to after `done` steps whose last ones averaged `recent_loss`, or None: it stops. Ends lie
    on the grid `sft_steps + k·sft_extension_steps` (capped at `sft_steps + sft_max_extra_steps`), so a run killed
    inside an extension goes on to that extension's end whatever its loss, as the uninterrupted run did."""
    last = config.sft_steps + config.sft_max_extra_steps
    if done >= last or not config.sft_extension_steps or done < config.sft_steps:
        return None
    beyond = done - config.sft_steps
    inside_extension = beyond % config.sft_extension_steps != 0
    if not inside_extension and (recent_loss is None or recent_loss <= config.sft_target_loss):
        return None
    return min(config.sft_steps + (beyond // config.sft_extension_steps + 1) * config.sft_extension_steps, last)


GRPO_PREFIX_BUCKETS = (1152, 1536, 2048, 3072)  # the shared contexts' lengths (~900-1,150 tokens)


def learner_groups(config: SimTinyConfig) -> int:
    """GRPO groups per learner batch: a step's, or as many as `grpo_learner_rows` holds (at least one) if fewer (the
    step then spans batches)."""
    return min(config.grpo_tasks_per_step, max(1, config.grpo_learner_rows // config.group_size))


def grpo_batch_spec(config: SimTinyConfig, tokenizer: Any) -> batching.BatchSpec:
    """Batches of `learner_groups` groups (a round is one or several, one update either way); with
    `shared_prefix`, each group's shared context is one prefix row (`data.shared_prefix`)."""
    spec = batch_spec(tokenizer, learner_groups(config) * config.group_size)
    if not config.shared_prefix:
        return spec
    # Few shapes: each new one is a compile of the learner's step (~10 s of CPU, more beside the actors). The
    # eight rounds of seeds 20, 21 and 22 ran 7, 8 and 9 shapes with the SFT batches' fine steps, 4, 5 and 3 with
    # these: prefixes from 1,152 tokens, pixels and images in coarse steps (padding patches cost the one-layer
    # vision tower little), and a round's few groups left over from a full batch in a batch of 8 or 16 groups, not
    # a full one (`prefix_row_buckets`); docs/sim_tiny.md, "Fewer learner shapes"
    groups = learner_groups(config)
    return dataclasses.replace(spec, prefix_rows=groups, suffix_buckets=(64, 128, 256, 512, 1024, 2048),
                               length_buckets=GRPO_PREFIX_BUCKETS, patch_step=1024, image_step=64,
                               prefix_row_buckets=tuple(b for b in (8, 16) if b < groups))


def run_grpo(config: SimTinyConfig, model: Any, tokenizer_dir: Path, env_file: Path, grpo_world: Path, out: Path,
             metrics: metrics_lib.MetricsWriter, actor_env: dict[str, str] | None = None,
             augment: augment.TokenPermutation | None = None) -> tuple[learner_lib.Learner, grpo_loop.GrpoResult]:
    """GRPO from the SFT policy with `actor_processes` decoupled actor processes splitting each round (`actor_env`:
    their extra environment variables; `augment`: the permutation of each group's words the learner sees,
    `grpo_augmentation`)."""
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir)
    if (warning := actor_rows_warning(config)) is not None:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    learner = grpo_learner(config, model)
    weights_dir, shards_dir = out / "weights", out / "grpo_shards"
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    actor_metrics = {f"actor{part}": out / "metrics" / f"actor{part}.jsonl" for part in range(config.actor_processes)}
    grpo_loop.clear_earlier_attempt([weights_dir, shards_dir, *(out / "metrics").glob("actor*.jsonl")])
    commands = [actor_command(config, env_file=env_file, grpo_world=grpo_world, weights_dir=weights_dir,
                              shards_dir=shards_dir, metrics_path=actor_metrics[f"actor{part}"], part=part)
                for part in range(config.actor_processes)]
    # every published version is a complete policy folder: tokenizer and the settings it acts with
    policy_files = write_policy_files(config, tokenizer_dir, env_file, out / "checkpoints" / "policy_files")
    result = grpo_loop.run(
        learner, shards_dir=shards_dir, weights_dir=weights_dir,
        spec=grpo_batch_spec(config, tokenizer),
        config=grpo_loop.GrpoLoopConfig(num_steps=config.grpo_steps, max_staleness=config.max_staleness,
                                        advantages=config.advantages, one_update_per_round=True,
                                        split_rounds=True),
        vision=tiny_policy.VISION, tokenizer_dir=policy_files, actor_commands=commands,
        filter_config=filters.FilterConfig(trim_untrained_tail=True), actor_metrics=actor_metrics,
        actor_env=actor_env, metrics=metrics, progress=config.progress, augment=augment)
    return learner, result


def scripted_scores(config: SimTinyConfig, eval_world: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """What the run reports that needs no policy: `evaluate_scripted` on the held-out world and the `find_object`
    tool's accuracy there (pure Python: `_run` plays it on a worker while the worlds and teacher stages use the
    other)."""
    from ranger_jax.env.backends import offline

    finder = offline.OfflineBackend(eval_world).object_finder
    accuracy = perception.accuracy_on_world(world.load_world(eval_world), eval_world, finder)
    return evaluate_scripted(config, eval_world), accuracy


def evaluate_scripted(config: SimTinyConfig, eval_world: Path) -> dict[str, dict[str, Any]]:
    """Naive, teacher and oracle-expert summaries on the held-out world (the teacher in the run's env)."""
    from ranger_jax.env.sim import savanna

    out = {}
    for name, agent, options in (("naive", "naive", {}), ("expert", "expert", {}),
                                 ("teacher", teacher(config), config.env_options())):
        out[name] = savanna.evaluate(eval_world, agent, progress=config.progress, **options)
    return out


def evaluate_policy(config: SimTinyConfig, checkpoint: Path, eval_world: Path,
                    trajectories_out: Path | None = None) -> dict[str, Any]:
    """A policy folder on the held-out world, greedy, observations blank when the run is blind; in as many processes
    with as many rows each as the GRPO actors (the same sampler shapes: with the compilation cache, compiled once
    for both)."""
    return evaluate.evaluate_checkpoint(eval_world, checkpoint, blank_observations=config.blind,
                                        concurrency=rows_per_actor(config) * config.actor_processes,
                                        processes=config.actor_processes, pin_cpus=config.pin_actors,
                                        trajectories_out=trajectories_out,
                                        progress=config.progress)


def _summary_scores(prefix: str, result: dict[str, Any]) -> dict[str, float]:
    return {f"{prefix}_search_score": result["search_score"], f"{prefix}_reward": result["reward_mean"]}


def run(config: SimTinyConfig, out: str | Path) -> dict[str, Any]:
    """The whole sim-tiny job into folder `out` (see the module docstring); returns the summary it writes.

    With `config.compilation_cache` this process and its children compile into `compilation_cache_folder(config)`
    during the run only: the caller's cache settings are back on return."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    folder = compilation_cache_folder(config)
    cache = compilation_cache.enabled(folder) if folder is not None else contextlib.nullcontext({})
    with cache as actor_env:
        return _run(config, out, actor_env)


def compilation_cache_folder(config: SimTinyConfig) -> Path | None:
    """The run's compilation cache folder: `config.compilation_cache_dir`, else the shared default; None when off."""
    if not config.compilation_cache:
        return None
    if config.compilation_cache_dir is None:
        return compilation_cache.default_dir()
    return Path(config.compilation_cache_dir).expanduser()


def _run(config: SimTinyConfig, out: Path, actor_env: dict[str, str]) -> dict[str, Any]:
    from ranger_jax.data import viewer

    started, timings = time.monotonic(), {}
    env_file = write_env_file(config, out / ENV_FILE)
    with process_pool.JobPool(stage_workers(config)) as pool:  # one set of workers for the pure-Python stages
        # the GRPO world, the largest, builds on one worker while the other builds the rest and then plays the
        # scripted agents and the teacher; the stage's time is counted under "worlds" up to the others' end and
        # under "teacher_data" after
        with timed(timings, "worlds"):
            worlds = build_worlds(config, out / "worlds", pool=pool, grpo_in_background=True)
        scripted_job = pool.submit(scripted_scores, dataclasses.replace(config, progress=False), worlds["eval"],
                                   label="scripted agents on the held-out world")
        with timed(timings, "teacher_data"):
            tokenizer_dir = out / "tokenizer"
            tokenizer = train_tokenizer(config, worlds["sft"], tokenizer_dir, pool=pool)
            data_dir = out / "sft_data"
            teacher_stats = {}
            if not (data_dir.exists() and shards.list_shards(data_dir)):  # a rerun of the folder reuses its data
                teacher_stats = record_teacher(config, worlds["sft"], tokenizer, data_dir, pool=pool)
            if worlds["grpo_job"] is not None:
                worlds["grpo_job"].result()
    with metrics_lib.MetricsWriter(out / "metrics") as metrics:
        with timed(timings, "sft"):
            learner, sft_result, pre_sft = run_sft(config, tokenizer, data_dir, out, metrics)
            sft_model = learner.params_model()
            learner.close()
            sft_dir = export_policy(config, sft_model, out / "sft_policy", tokenizer_dir, env_file)
        with timed(timings, "eval"):  # before GRPO: the actor then loads the sampler programs this compiled
            sft_eval = evaluate_policy(config, sft_dir, worlds["eval"])
        grpo_result = None
        if config.grpo_steps:
            with timed(timings, "grpo"):
                permutation = grpo_augmentation(tokenizer, data_dir) if config.grpo_augment else None
                grpo, grpo_result = run_grpo(config, sft_model, tokenizer_dir, env_file, worlds["grpo"], out,
                                             metrics, actor_env, augment=permutation)
                final_model = grpo.params_model()
        else:
            final_model = sft_model
    policy_dir = export_policy(config, final_model, out / "policy", tokenizer_dir, env_file)
    with timed(timings, "eval"):
        scripted, perception_accuracy = scripted_job.result()
        grpo_eval = evaluate_policy(config, policy_dir, worlds["eval"], trajectories_out=out / "eval_grpo.array_record")
    summary: dict[str, Any] = {
        "preset": "sim-tiny", "seed": config.seed, "blind": config.blind,
        **_summary_scores("naive", scripted["naive"]), **_summary_scores("teacher", scripted["teacher"]),
        **_summary_scores("expert", scripted["expert"]), **_summary_scores("sft", sft_eval),
        **_summary_scores("grpo", grpo_eval), "num_eval_tasks": grpo_eval["num_tasks"],
        "find_object_accuracy": perception_accuracy,
        "world_version": config.world_version, "eval_world_seed": config.eval_seed(),
        "train_world_seeds": config.sft_seeds() + [config.grpo_seed()],
        "sft": {"steps": sft_result.num_steps, "final_loss": sft_result.last.get("loss"),
                "recent_loss": sft_result.recent_loss, "tokens_per_s": sft_result.tokens_per_s, **teacher_stats},
        "pre_sft": pre_sft,
        "grpo": dataclasses.asdict(grpo_result) if grpo_result else None,
        "grpo_minus_sft_reward": evaluate.compare(sft_eval, grpo_eval)["reward_difference"],
        "reward_per_task": {"sft": sft_eval["reward_per_task"], "grpo": grpo_eval["reward_per_task"]},
        "timings_s": timings, "wall_seconds": round(time.monotonic() - started, 1),
        "compilation_cache": jax.config.jax_compilation_cache_dir or None,  # programs loaded from it took no time
        "config": dataclasses.asdict(config),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n", "utf-8")
    logged = {k for row in metrics_lib.read_jsonl(out / "metrics" / "metrics.jsonl") for k in row}
    keys = [k for k in ("sft/loss", "grpo/reward_mean", "grpo/loss", "grpo/idle_fraction") if k in logged]
    # the GRPO rollouts' reward beside what the evaluation measured: the greedy policies on the held-out world
    held_out = {"held-out naive": summary["naive_reward"], "held-out SFT (greedy)": summary["sft_reward"],
                "held-out GRPO (greedy)": summary["grpo_reward"]}
    metrics_lib.plot_curves([out / "metrics" / "metrics.jsonl"], out / "curves.png", keys=keys,
                            labels=["GRPO rollouts (sampled)"], title=f"sim-tiny (seed {config.seed})",
                            log_keys=[k for k in keys if k == "sft/loss"],
                            reference={"grpo/reward_mean": held_out} if "grpo/reward_mean" in keys else None)
    viewer.write_viewer(out / "eval_grpo.array_record", out / "viewer.html", limit=40)
    return summary
