"""SFT of a Qwen3-VL checkpoint on Locate–Corroborate–Isolate trajectories (ours or Gen-Searcher's SFT file).

    python recipes/sft_ranger.py --checkpoint CKPT --data runs/sim-tiny/sft_data --out runs/sft
    python recipes/sft_ranger.py --checkpoint CKPT --data data/dataset_info.json --dataset gen_sft --out runs/sft

Assistant-only loss, length-bucketed batches, AdamW with warmup and cosine decay (LLaMA-Factory's Gen-Searcher
settings by default: lr 1e-5, vision tower frozen), Orbax checkpoints with the data position (rerunning the same
command resumes), and OUT/policy: the trained model in the Hugging Face layout with its tokenizer.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from ranger_jax.models import qwen3_vl
    from ranger_jax.parallel import mesh as mesh_lib
    from ranger_jax.processing import tokenizer as tokenizer_lib
    from ranger_jax.rl import learner, learner_config, metrics, sft
    from ranger_jax.rollout import sequence

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--checkpoint", required=True, help="HF Qwen3-VL folder to start from (with tokenizer.json)")
    parser.add_argument("--data", required=True, help="trajectory shard folder, SFT JSON file or dataset_info.json")
    parser.add_argument("--dataset", help="dataset name inside dataset_info.json (e.g. gen_sft)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--max-length", type=int, default=32768, help="longest row in tokens")
    parser.add_argument("--max-pixels", type=int, default=160_000)
    parser.add_argument("--mesh", help="DATA,FSDP,TENSOR sizes (-1 fills; default: one device)")
    parser.add_argument("--train-vision", action="store_true", help="also train the vision tower")
    args = parser.parse_args(argv)
    mesh = None
    if args.mesh:
        data, fsdp, tensor = (int(x) for x in args.mesh.split(","))
        mesh = mesh_lib.make_mesh(data=data, fsdp=fsdp, tensor=tensor)
    model = qwen3_vl.load(args.checkpoint, mesh=mesh)
    tokenizer = tokenizer_lib.load_tokenizer(args.checkpoint)
    vision = sequence.VisionSettings(max_pixels=args.max_pixels)
    buckets = tuple(b for b in (1024, 2048, 4096, 8192, 16384, 32768) if b < args.max_length) + (args.max_length,)
    try:
        dataset = sft.dataset_for(args.data, tokenizer=tokenizer, batch_size=args.batch, length_buckets=buckets,
                                  vision=vision, dataset_name=args.dataset)
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    settings = learner_config.LearnerConfig(objective="sft", learning_rate=args.lr, schedule="cosine",
                                            warmup_steps=max(1, args.steps // 50), total_steps=args.steps,
                                            weight_decay=1e-6, freeze_vision=not args.train_vision)
    trainer = learner.Learner(model, settings, mesh=mesh, checkpoint_dir=f"{args.out}/checkpoints")
    with metrics.MetricsWriter(f"{args.out}/metrics") as writer:
        result = sft.train(trainer, dataset, num_steps=args.steps, metrics=writer, resume=True,
                           checkpoint_every=max(1, args.steps // 10))
    qwen3_vl.save(trainer.params_model(), f"{args.out}/policy")
    tokenizer_lib.copy_tokenizer_files(args.checkpoint, f"{args.out}/policy")
    trainer.close()
    print(f"{result.num_steps} steps, last loss {result.last.get('loss', float('nan')):.4f}; wrote {args.out}/policy")
    return 0


if __name__ == "__main__":
    from ranger_jax import host_memory

    host_memory.retain_freed_memory()  # before JAX runs anything: each step reuses the last one's pages
    sys.exit(main())
