"""Building training and benchmark data: news- and category-driven prompts, teacher trajectories with rejection,
ground-truth images with quality filtering, and the splits — live against real services, or exactly offline.

The stages of a run (`pipeline`, command line `recipes/datagen.py` / `cli`):

- prompt synthesis: news-driven as Savanna (`news`: a meta query per subcategory (`taxonomy`) in a one-day window;
  `extract`: an LLM, or offline a template, writes the request, with an image-oriented fallback; `dedupe`;
  `confusion`: kept only when the image search is crowded with look-alikes) orchestrated by `synthesis`, and
  category-driven as Gen-Searcher (`categories`: 20 categories of multi-hop prompts, QA pairs turned into prompts);
  every prompt is a `records.Prompt` with its date, domain / subcategory, source headline and URL and keep reason;
- `teacher`: a teacher policy's episodes, kept when the search judge passes them, as trajectory shards;
- `groundtruth`: generated ground-truth images, six-perspective quality scores and rule filters;
- `splits`: benchmark, RL and SFT sets in published formats (`sft_export`: shards and LLaMA-Factory ShareGPT;
  offline also as worlds, `world_tasks`).

Underneath: `ledger` (what each stage finished, so reruns resume), `stages` (running a stage concurrently with a
progress bar; the kept/dropped report), `calls` (every request and response recorded; tokens, requests and cost per
stage and service), `services` (one spec, client, concurrency limit and retry policy per service).
"""

__all__ = ["calls", "categories", "cli", "confusion", "dedupe", "extract", "groundtruth", "ledger", "news", "pipeline",
           "records", "services", "sft_export", "splits", "stages", "synthesis", "taxonomy", "teacher", "world_tasks"]
