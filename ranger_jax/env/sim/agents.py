"""Scripted agents that drive a `ToolEnv` through `reset`/`step` with protocol-formatted turns.

Both agents are policies in the same sense as a model: `act(state) -> assistant_text` reads only the episode
so far (`state.messages`, `state.images`) and writes `<think>…</think><tool_call>{…}</tool_call>` or
`<answer>{…}</answer>`, so their trajectories are valid SFT data.

- `ExpertAgent` — Locate, Corroborate, Isolate:
  1. Locate: `text_search` the proper nouns of the request (past month when the request says the thing is
     new), then `web_fetch` the most promising hits (name overlap, launch articles, recency) until a fact
     sheet names a release that matches the request — the newest one when the request asks for the new one.
  2. Corroborate: `image_search` that release by name, restricted to dates since its release; every image
     returned is checked object by object against the colours, pattern and emblem from the fact sheet.
     Candidates that fail the check (earlier editions, other colourways) are discarded; wider searches follow
     when none passes.
  3. Isolate: `crop_image` the matching object out of its scene, then answer with a gen_prompt that spells
     out the identifying attributes and cites the crop.
  Pixels are read through `detector.OracleDetector`, a stand-in for a perfect VLM's grounding (it reports
  boxes and visible attributes, never identities); the agent never reads the task's ground truth. It reads
  fact sheets from the page text, so it expects `web_fetch` without a summariser (the offline default).
- `NaiveAgent`: `image_search` the request, answer with the first image.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from typing import Any, Protocol

from ranger_jax.env.sim import bm25
from ranger_jax.env.sim.detector import Detection, OracleDetector
from ranger_jax.env.sim.world import Attributes, box_area

# Tool budget: at most 2 + 3 + 2 + 1 = 8 calls, the environment's default limit.
MAX_TEXT_SEARCHES = 2
MAX_FETCHES = 3
MAX_IMAGE_SEARCHES = 2
RECENT_DAYS = 45  # a release this recent counts as "new"
RECENCY_CUES = ("new", "latest", "newest", "just-released", "just released", "revealed", "this week",
                "last week", "days ago", "weeks ago", "recent", "brand-new")
# Headlines and snippets of launch articles and side-by-side pieces, the pages that carry fact sheets.
_LAUNCH = re.compile(r"\b(unveils|unveiled|reveals|revealed|official|officially|first look|arrives|vs|what changed|"
                     r"side by side|goes on sale)\b", re.IGNORECASE)

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_TEXT_HIT = re.compile(r"^\d+\. \[(?P<title>[^\]]*)\]\((?P<url>[^)\s]+)\)(?: \((?P<date>[^)]*)\))?"
                       r"(?:\n(?P<snippet>(?!\d+\. \[|--- ).*))?$", re.MULTILINE)
_FACT_SHEET = re.compile(
    r"Fact sheet\nName: (?P<name>.+)\nSeries: (?P<series>.+)\nRelease date: (?P<released>\d{4}-\d{2}-\d{2})\n"
    r"Colours: (?P<primary>[\w-]+), (?P<secondary>[\w-]+)\nPattern: (?P<pattern>[\w-]+)\nEmblem: (?P<emblem>\S+)"
)
_IMAGE_LINE = re.compile(r"^(IMG_\d+): ", re.MULTILINE)


class Policy(Protocol):
    """A scripted policy: reads the episode so far and writes the next assistant turn."""

    def act(self, state: Any) -> str:
        """The next assistant turn for the episode in `state`, in the output protocol."""


@dataclasses.dataclass(frozen=True)
class Turn:
    """One past tool call of the episode and what came back."""

    name: str | None
    arguments: dict[str, Any]
    response: str
    img_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Release:
    """A fact sheet read from a page: a release's name, series, date and visible attributes."""

    name: str
    series: str
    released: str
    attributes: Attributes

    @classmethod
    def from_match(cls, m: re.Match) -> Release:
        """The release of one `_FACT_SHEET` match."""
        return cls(name=m["name"], series=m["series"], released=m["released"],
                   attributes=Attributes(primary=m["primary"], secondary=m["secondary"], pattern=m["pattern"],
                                         emblem=m["emblem"]))


def read_history(state: Any) -> list[Turn]:
    """The episode's (assistant turn, user reply) pairs after the task prompt, as `Turn`s."""
    turns = []
    messages = state.messages[2:]
    for i in range(0, len(messages) - 1, 2):
        said, reply = messages[i]["content"], messages[i + 1]["content"]
        name, arguments = None, {}
        if m := _TOOL_CALL.search(said):
            try:
                call = json.loads(m.group(1))
                name, arguments = call.get("name"), call.get("arguments") or {}
            except ValueError:
                pass
        if isinstance(reply, str):
            text, ids = reply, ()
        else:
            text = "".join(p.get("text", "") for p in reply if p.get("type") == "text")
            ids = tuple(p["img_id"] for p in reply if p.get("type") == "image")
        turns.append(Turn(name=name, arguments=arguments, response=text, img_ids=ids))
    return turns


def tool_call(name: str, arguments: dict[str, Any], think: str) -> str:
    """A protocol turn that calls one tool."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<think>{think}</think>\n<tool_call>\n{body}\n</tool_call>"


def answer(gen_prompt: str, refs: list[tuple[str, str]], think: str | None) -> str:
    """A protocol turn with the final answer (`think` None in the forced final turn)."""
    body = json.dumps({"gen_prompt": gen_prompt, "reference_images": [{"img_id": i, "note": n} for i, n in refs]},
                      ensure_ascii=False)
    return (f"<think>{think}</think>\n" if think else "") + f"<answer>{body}</answer>"


def subject_query(prompt: str) -> str:
    """The proper nouns and numbers of a request, in order ("… the new Lake FC Home kit …" -> "Lake FC Home")."""
    words = re.findall(r"[A-Za-z0-9][\w'-]*", prompt)
    kept = [w for i, w in enumerate(words) if i > 0 and (w[0].isupper() or w.isdigit())]
    return " ".join(dict.fromkeys(kept)) or prompt


def wants_recent(prompt: str) -> bool:
    """Whether the request asks for a recent release."""
    text = prompt.lower()
    return any(re.search(rf"(?<![a-z]){re.escape(cue)}(?![a-z])", text) for cue in RECENCY_CUES)


def _describe(release: Release) -> str:
    a = release.attributes
    if a.pattern == "plain":
        look = f"plain {a.primary} with {a.secondary} trim"
    else:
        look = f"{a.primary} with {a.secondary} {a.pattern}"
    return f"the {release.name} ({look}, {a.emblem} emblem)"


class ExpertAgent:
    """The scripted Locate–Corroborate–Isolate expert (see the module docstring).

    Args:
        detector: perception of objects inside images (an `OracleDetector` over the episode's world).
    """

    def __init__(self, detector: OracleDetector):
        self.detector = detector

    # ---- reading the episode -------------------------------------------------------------------------

    @staticmethod
    def _hits(turns: list[Turn]) -> list[dict[str, str]]:
        seen, hits = set(), []
        for turn in turns:
            if turn.name == "text_search":
                for m in _TEXT_HIT.finditer(turn.response):
                    if m["url"] not in seen:
                        seen.add(m["url"])
                        hits.append({"title": m["title"], "url": m["url"], "date": m["date"] or "",
                                     "snippet": m["snippet"] or ""})
        return hits

    @staticmethod
    def _releases(turns: list[Turn]) -> list[Release]:
        found = {}
        for turn in turns:
            if turn.name == "web_fetch":
                for m in _FACT_SHEET.finditer(turn.response):
                    found.setdefault(m["name"], Release.from_match(m))
        return list(found.values())

    @staticmethod
    def _choose(prompt: str, releases: list[Release], today: dt.date) -> tuple[Release | None, bool]:
        """The release the request means, and whether the evidence is conclusive."""
        words = set(bm25.tokenize(prompt))
        scored = [(len(words & set(bm25.tokenize(r.name))), r) for r in releases]
        best = max((s for s, _ in scored), default=0)
        if best < 2:
            return None, False
        candidates = [r for s, r in scored if s == best]
        target = max(candidates, key=lambda r: (r.released, r.name))
        if wants_recent(prompt):
            return target, (today - dt.date.fromisoformat(target.released)).days <= RECENT_DAYS
        digits = {w for w in bm25.tokenize(subject_query(prompt)) if w.isdigit()}
        return target, digits <= set(bm25.tokenize(target.name))

    def _matches(self, state: Any, release: Release) -> list[tuple[str, Detection]]:
        """(img_id, detection) of every object in the episode's downloaded images that looks like `release`."""
        out = []
        for img_id in sorted(state.images):
            record = state.images[img_id]
            if record.root_box is not None:
                continue
            for det in self.detector.detect(record):
                if det.attributes == release.attributes and release.name.endswith(det.kind):
                    out.append((img_id, det))
        return out

    # ---- acting --------------------------------------------------------------------------------------

    def act(self, state: Any) -> str:
        """The next assistant turn for `state`."""
        turns = read_history(state)
        prompt = state.task.prompt
        subject = subject_query(prompt)
        recent = wants_recent(prompt)
        searches = [t for t in turns if t.name == "text_search"]
        fetched = [t for t in turns if t.name == "web_fetch"]
        image_searches = [t for t in turns if t.name == "image_search"]
        crops = [t for t in turns if t.name == "crop_image"]
        release, sure = self._choose(prompt, self._releases(turns), state.today)
        if state.final_turn:
            return self._final(state, release, crops)
        if not searches:
            args: dict[str, Any] = {"queries": [subject], "top_k": 8}
            if recent:
                args["time_range"] = "month"
            why = "The request says it is new, so I search the past month" if recent else "I search its name"
            return tool_call("text_search", args, f"I need to find out exactly which {subject} this is and what "
                                                  f"it looks like. {why}.")
        if release is None or not sure:
            done = {u for t in fetched for u in ([t.arguments.get("url")] if "url" in t.arguments else [])}
            todo = [h for h in self._hits(turns) if h["url"] not in done]
            if todo and len(fetched) < MAX_FETCHES:
                words = set(bm25.tokenize(subject))

                def is_launch(text: str) -> bool:  # a cue that is part of the name ("Official" ball) is no cue
                    return any(m.group(0).lower() not in words for m in _LAUNCH.finditer(text))

                def priority(hit: dict[str, str]) -> tuple:
                    launch = is_launch(hit["title"]) or is_launch(hit["snippet"])
                    overlap = len(words & set(bm25.tokenize(hit["title"])))
                    return (overlap, launch, hit["date"] if recent else "")

                hit = max(todo, key=priority)
                return tool_call("web_fetch", {"url": hit["url"], "prompt": f"name, release date, colours, pattern "
                                                                           f"and emblem of the {subject}"},
                                 f"'{hit['title']}' ({hit['date'] or 'undated'}) looks like the best source for the "
                                 "exact release and its distinguishing details; I read it.")
            if len(fetched) < MAX_FETCHES and len(searches) < MAX_TEXT_SEARCHES:
                return tool_call("text_search", {"queries": [f"{subject} release date", f"{subject} revealed"],
                                                 "top_k": 10},
                                 "The pages so far do not settle which release is meant; I widen the search.")
            if release is None:
                return self._give_up(state, prompt)
        matches = self._matches(state, release)
        if not matches:
            return self._search_images(state, release, image_searches, prompt)
        if not crops:
            img_id, det = max(matches, key=lambda m: (m[1].visible_fraction >= 1.0, box_area(m[1].box), m[0]))
            record = state.images[img_id]
            bbox = [round(det.box[0] / record.width, 4), round(det.box[1] / record.height, 4),
                    round(det.box[2] / record.width, 4), round(det.box[3] / record.height, 4)]
            others = len(self.detector.detect(record)) - 1
            seen = det.attributes
            return tool_call("crop_image", {"img_id": img_id, "bbox": bbox},
                             f"{img_id} shows a {det.kind} in {seen.primary} with {seen.secondary} {seen.pattern} "
                             f"and the {seen.emblem} emblem, matching the fact sheet of the {release.name}"
                             + (f"; {others} other object(s) share the picture, so I crop it out." if others
                                else "; I crop it tight."))
        crop_id = crops[-1].img_ids[0] if crops[-1].img_ids else None
        if crop_id is None:
            return self._give_up(state, prompt)
        return self._answer(prompt, release, crop_id, think=f"{crop_id} isolates the {release.name}; "
                                                          "I have what the generator needs.")

    def _search_images(self, state: Any, release: Release, done: list[Turn], prompt: str) -> str:
        if len(done) >= MAX_IMAGE_SEARCHES:
            return self._give_up(state, prompt)
        a = release.attributes
        if not done:
            start = dt.date.fromisoformat(release.released)
            tbs = (f"cdr:1,cd_min:{start.month}/{start.day}/{start.year},"
                   f"cd_max:{state.today.month}/{state.today.day}/{state.today.year}")
            return tool_call("image_search", {"query": release.name, "tbs": tbs},
                             f"The {release.name} came out on {release.released}: {a.primary} with "
                             f"{a.secondary} {a.pattern}, emblem {a.emblem}. Earlier editions look "
                             "alike, so I search images published since its release.")
        query = f"{release.name} {a.primary} {a.secondary} {a.pattern}"
        return tool_call("image_search", {"query": query},
                         f"None of the images so far shows {a.emblem} on {a.primary} with "
                         f"{a.secondary} {a.pattern}; they are look-alikes. I search more widely.")

    def _answer(self, prompt: str, release: Release, img_id: str, think: str | None) -> str:
        gen_prompt = (f"{prompt.rstrip('.')}. The subject is {_describe(release)}; reproduce its colours, "
                      f"{release.attributes.pattern} pattern and {release.attributes.emblem} emblem exactly as in the "
                      "first reference image.")
        return answer(gen_prompt, [(img_id, f"clean crop of the {release.name}")], think)

    def _final(self, state: Any, release: Release | None, crops: list[Turn]) -> str:
        if release is not None and crops and crops[-1].img_ids:
            return self._answer(state.task.prompt, release, crops[-1].img_ids[0], think=None)
        if release is not None and (matches := self._matches(state, release)):
            return self._answer(state.task.prompt, release, matches[0][0], think=None)
        return answer(state.task.prompt, [(i, "best available image") for i in sorted(state.images)[:1]], None)

    def _give_up(self, state: Any, prompt: str) -> str:
        refs = [(i, "closest image found") for i in sorted(state.images)[:1]]
        return answer(prompt, refs, "I could not verify the exact release; I hand over the closest image I found.")


class NaiveAgent:
    """The baseline: image_search the request and answer with the first image result."""

    def act(self, state: Any) -> str:
        """The next assistant turn for `state`."""
        turns = read_history(state)
        prompt = state.task.prompt
        if not turns and not state.final_turn:
            return tool_call("image_search", {"query": prompt}, "I search images for the request.")
        shown = next((t.img_ids for t in turns if t.img_ids), ())
        refs = [(shown[0], "first image result")] if shown else []
        return answer(prompt, refs, None if state.final_turn else "I use the first image result.")


def run_episode(tool_env: Any, task: Any, policy: Policy) -> Any:
    """Runs one episode of `policy` on `task` to the end; returns the final `EnvState`."""
    state = tool_env.reset(task)
    for _ in range(tool_env.config.max_turns + 2):  # +1 forced final turn, +1 slack
        if state.done:
            break
        state, _ = tool_env.step(state, policy.act(state))
    if not state.done:
        state = tool_env.terminate(state, "error")
    return state
