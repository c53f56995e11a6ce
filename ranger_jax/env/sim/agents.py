"""Scripted agents that drive a `ToolEnv` through `reset`/`step` with protocol-formatted turns.

Both agents are policies in the same sense as a model: `act(state) -> assistant_text` reads only the episode
so far (`state.messages`, `state.images`) and writes `<think>…</think><tool_call>{…}</tool_call>` or
`<answer>{…}</answer>`, so their trajectories are valid SFT data.

- `ExpertAgent` — Locate, Corroborate, Isolate, for one subject or two (`requests.parse_request`):
  1. Locate: `text_search` each subject (its proper nouns, or its maker: past month when the request says the
     thing is new), then `web_fetch` up to five promising hits at once (name overlap, launch headlines, no
     keyword-stuffed or rumour headlines, recency), more pages or a narrower search while facts are missing.
     Facts are read from the pages (`knowledge`: prose in version-2 worlds, fact sheets in version 1; pages
     that hedge are not trusted; a maker's family is found the same way); the release meant is the newest
     whose name holds every word the request names, with no special-edition tag the request did not ask for.
  2. Corroborate: `image_search` that release by name, restricted to dates since its release; every picture
     is checked object by object against the colours, pattern, trim and emblem the pages gave. Look-alikes
     (earlier editions, other colourways, special editions, leaks, fan renders, re-hosts captioned with the
     release's name) fail the check; when nothing passes, a second search asks for the alt text of a picture
     on the release's own article.
  3. Isolate: `crop_image` the matching object (preferring one that stands in front, whole, with little
     overlap), then answer with a gen_prompt that spells out the attributes of each subject and cites the crops.
  Pixels are read through `detector.OracleDetector`, a stand-in for a perfect VLM's grounding (it reports
  boxes and visible attributes, never identities); the agent never reads the task's ground truth. It reads
  page text, so it expects `web_fetch` without a summariser (the offline default). `isolate` is the one
  perception step; `finder_agent.PixelExpertAgent` replaces it with the pixel-only `find_object` tool.
- `NaiveAgent`: `image_search` the request, answer with the first image.
- `CaptionAgent`: one image search for the request's names, answer with the best-captioned picture (a one-pass
  strategy; `finder_agent.SnippetAgent` is the one-pass strategy that picks by colour).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from typing import Any, Protocol

from ranger_jax.env.sim import knowledge, requests
from ranger_jax.env.sim.detector import Detection, OracleDetector
from ranger_jax.env.sim.world import box_area, box_intersection

MAX_TOOL_CALLS = 8  # the environment's default limit
MAX_TEXT_SEARCHES = 3
MAX_IMAGE_SEARCHES = 4  # per subject, as the tool budget allows
FETCH_URLS = 5  # pages read by one web_fetch call
RECENT_DAYS = knowledge.RECENT_DAYS
RECENCY_CUES = requests.RECENCY_CUES
# Headlines and snippets of launch articles and side-by-side pieces, the pages that carry facts.
_LAUNCH = knowledge.LAUNCH_CUES

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


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


Release = knowledge.Release


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
    return requests.wants_recent(prompt)


def describe(release: Release) -> str:
    """The release and the attributes that identify it, in words: "the X kit (navy with white hoops, …)"."""
    a = release.attributes
    if a.primary and a.secondary:
        look = f"plain {a.primary} with {a.secondary} bands" if a.pattern == "plain" else \
            f"{a.primary} with {a.secondary} {a.pattern}".rstrip()
    else:
        look = " ".join(v for v in (a.primary, a.secondary, a.pattern) if v) or "look unknown"
    extra = [f"{a.trim} trim"] if a.trim else []
    extra += [f"{a.emblem} emblem"] if a.emblem else []
    return f"the {release.name} ({', '.join([look, *extra])})"


# Words of the prose that states each fact (`prose.PHRASINGS`), for a search that looks for the missing ones.
_LAUNCH_WORDS = "unveils revealed official"
_CUE_WORDS = {"released": "release date sale unveils revealed", "primary": "colour colourway",
              "secondary": "colour colourway", "pattern": "pattern design covered", "emblem": "emblem badge crest",
              "trim": "trim edges outline"}


class ExpertAgent:
    """The scripted Locate–Corroborate–Isolate expert (see the module docstring).

    Args:
        detector: perception of objects inside images (an `OracleDetector` over the episode's world).
    """

    def __init__(self, detector: OracleDetector | None):
        self.detector = detector

    # ---- reading the episode -------------------------------------------------------------------------

    @staticmethod
    def findings(state: Any, turns: list[Turn]) -> list[knowledge.Finding]:
        """What the episode has established about each subject of the request (`knowledge.findings`)."""
        return knowledge.findings(state.task.prompt, turns, state.today)

    @staticmethod
    def _searches(turns: list[Turn], release: Release) -> list[Turn]:
        return [t for t in turns if t.name == "image_search" and str(t.arguments.get("query", "")).startswith(
            release.name)]

    @staticmethod
    def _images(state: Any, searches: list[Turn]) -> list[str]:
        """Ids of the downloaded pictures those searches showed (crops left out)."""
        ids = dict.fromkeys(i for t in searches for i in t.img_ids)
        return [i for i in ids if i in state.images and state.images[i].root_box is None]

    def _matches(self, state: Any, release: Release, img_ids: list[str]) -> list[tuple[str, Detection, float]]:
        """(img_id, detection, overlap with other objects) of every object that looks like `release`."""
        out = []
        want = release.attributes.as_dict()
        for img_id in img_ids:
            found = self.detector.detect(state.images[img_id])
            for det in found:
                seen = det.attributes.as_dict()
                if any(value and seen.get(key) != value for key, value in want.items()):  # known attributes only
                    continue
                if not release.name.endswith(det.kind):
                    continue
                overlap = sum(box_area(box_intersection(det.box, o.box)) for o in found if o is not det)
                out.append((img_id, det, overlap / max(box_area(det.box), 1.0)))
        return out

    # ---- perception: overridden by the pixel-only expert --------------------------------------------------

    def isolated(self, state: Any, release: Release, turns: list[Turn], img_ids: list[str]) -> tuple[bool, str | None]:
        """(whether this subject is isolated, the crop to cite for it) from the episode's perception turns."""
        crops = [t for t in turns if t.name == "crop_image" and t.arguments.get("img_id") in img_ids and t.img_ids]
        return (True, crops[-1].img_ids[0]) if crops else (False, None)

    def isolate(self, state: Any, release: Release, turns: list[Turn], img_ids: list[str]) -> str | None:
        """The perception call that isolates `release` among `img_ids`, or None when none of them shows it."""
        matches = self._matches(state, release, img_ids)
        if not matches:
            return None
        img_id, det, _ = max(matches, key=lambda m: (m[1].visible_fraction >= 1.0, m[1].unhidden >= 0.95, -m[2],
                                                    box_area(m[1].box), m[0]))
        record = state.images[img_id]
        bbox = [round(det.box[0] / record.width, 4), round(det.box[1] / record.height, 4),
                round(det.box[2] / record.width, 4), round(det.box[3] / record.height, 4)]
        seen = det.attributes
        others = len(self.detector.detect(record)) - 1
        return tool_call("crop_image", {"img_id": img_id, "bbox": bbox},
                         f"{img_id} shows a {det.kind} in {seen.primary} with {seen.secondary} {seen.pattern}"
                         + (f", {seen.trim} trim" if seen.trim else "") + f" and the {seen.emblem} emblem, matching "
                         f"what the pages say about the {release.name}"
                         + (f"; {others} other object(s) share the picture, so I crop it out." if others
                            else "; I crop it tight."))

    # ---- acting --------------------------------------------------------------------------------------

    def act(self, state: Any) -> str:
        """The next assistant turn for `state`."""
        turns = read_history(state)
        found = self.findings(state, turns)
        if state.final_turn:
            return self._answer(state, turns, found, final=True)
        calls = sum(t.name is not None for t in turns)
        if not any(t.name == "text_search" for t in turns):
            recent = any(f.subject.recent for f in found)
            queries = [f.subject.query for f in found]
            if len(found) == 1 and found[0].subject.maker:  # the maker's name alone finds the pages naming it
                queries.append(found[0].subject.maker)
            elif len(found) == 1:  # the launch article is where a release's facts start
                queries.append(" ".join(filter(None, [found[0].subject.query, found[0].subject.noun, _LAUNCH_WORDS])))
            args: dict[str, Any] = {"queries": queries, "top_k": 10}
            if recent:
                args["time_range"] = "month"
            names = " and ".join(f.subject.query for f in found)
            return tool_call("text_search", args, f"I need to find out exactly which {names} is meant and what it "
                                                  "looks like" + (", searching the past month." if recent else "."))
        started = any(t.name in ("image_search", "crop_image", "find_object") for t in turns)
        need = [f for f in found if f.release is None or not f.sure or f.missing]
        if need and not started and MAX_TOOL_CALLS - calls - 2 * len(found) > 0:
            step = self._locate(state, turns, need)
            if step is not None:
                return step
        return self._corroborate(state, turns, found, calls)

    def _locate(self, state: Any, turns: list[Turn], need: list[knowledge.Finding]) -> str | None:
        """Read more pages about the subjects still unsettled, or search for them more narrowly."""
        asked = knowledge.asked_urls(turns)
        ranked = []
        for f in need:
            words = {t for w in [*f.subject.words, f.family or ""] for t in knowledge._tokens(w)}
            pool = [h for h in knowledge.hits(turns) + knowledge.links(turns) if not knowledge.is_junk(h)]
            hits = [h for h in pool if h["url"] not in asked and (
                f.name in f"{h['title']} {h['snippet']}" if f.name and f.sure else
                f.family in f"{h['title']} {h['snippet']}" if f.family else words & knowledge._tokens(h["title"]))]
            ranked.append(sorted(hits, key=lambda h: knowledge.priority(h, words, f.subject.recent,
                                                                        f.name if f.sure else None), reverse=True))
        picks: list[dict[str, str]] = []
        for rank in range(FETCH_URLS):
            for hits in ranked:
                fresh = [h for h in hits if h not in picks]
                if fresh and len(picks) < FETCH_URLS:
                    picks.append(fresh[0])
        if picks:
            return tool_call("web_fetch", {"url": [h["url"] for h in picks],
                                           "prompt": "release name, date, colours, pattern, trim and emblem"},
                             "These look like the best sources for the exact release and its details: "
                             + "; ".join(f"'{h['title']}' ({h['date'] or 'undated'})" for h in picks) + ".")
        if sum(t.name == "text_search" for t in turns) >= MAX_TEXT_SEARCHES:
            return None
        queries = []
        for f in need:
            if f.family is None:
                queries.append(f"{f.subject.maker} {f.subject.noun or ''}".strip())
            elif f.name is None:
                queries.append(" ".join(dict.fromkeys([*f.family.split(), *f.subject.name_words,
                                                       f.subject.noun or "", _LAUNCH_WORDS])).strip())
            else:
                cues = dict.fromkeys(_CUE_WORDS[m] for m in f.missing) or (_LAUNCH_WORDS,)
                queries.append(f"{f.name} {' '.join(cues)}")
        asked_queries = {q for t in turns if t.name == "text_search" for q in t.arguments.get("queries", [])}
        queries = [q for q in dict.fromkeys(queries) if q not in asked_queries]
        if not queries:
            return None
        args: dict[str, Any] = {"queries": queries[:3], "top_k": 10}
        if any(f.subject.recent for f in need):
            args["time_range"] = "month"
        return tool_call("text_search", args, "The pages so far do not settle which release is meant or how it "
                                              "looks; I search more narrowly.")

    def _corroborate(self, state: Any, turns: list[Turn], found: list[knowledge.Finding], calls: int) -> str:
        """Search pictures of each subject in turn and isolate it; answer when every subject is done."""
        for i, f in enumerate(found):
            if f.release is None:
                continue
            searches = self._searches(turns, f.release)
            img_ids = self._images(state, searches)
            done, _ = self.isolated(state, f.release, turns, img_ids)
            if done:
                continue
            later = sum(1 for g in found[i + 1:] if g.release is not None)
            if searches:
                step = self.isolate(state, f.release, turns, img_ids)
                if step is not None and MAX_TOOL_CALLS - calls >= 1 + 2 * later:
                    return step
            if len(searches) < MAX_IMAGE_SEARCHES and MAX_TOOL_CALLS - calls >= 2 + 2 * later:
                step = self._search_images(state, turns, f, searches)
                if step is not None:
                    return step
        return self._answer(state, turns, found, final=False)

    def _search_images(self, state: Any, turns: list[Turn], f: knowledge.Finding, done: list[Turn]) -> str | None:
        """The next picture search for a release, or None when every query has been tried: its name since its
        release, then the settings of the pictures its own articles show, scene captions, and its name with its
        colours at any date."""
        release = f.release
        a = release.attributes
        start = dt.date.fromisoformat(release.released)
        tbs = (f"cdr:1,cd_min:{start.month}/{start.day}/{start.year},"
               f"cd_max:{state.today.month}/{state.today.day}/{state.today.year}")
        look = " ".join(v for v in (a.primary, a.secondary, a.pattern) if v)
        label = knowledge._tokens(f.family) | knowledge._tokens(f.subject.noun or "") | (
            knowledge._tokens(release.name) & {t.lower() for t in requests.VARIANTS})
        settings = knowledge.picture_queries(turns, release.name, label, knowledge.failed_images(turns))
        options = [(release.name, tbs, f"The {release.name} came out on {release.released}: {describe(release)}. "
                                       "Earlier editions and look-alikes circulate too, so I search pictures published "
                                       "since its release.")]
        options += [(f"{release.name} {where}", tbs, f"None of those pictures shows {describe(release)}; its own "
                                                     f"articles show a picture of it at the {where}, so I search for "
                                                     "that one.") for where in settings]
        options += [(f"{release.name} spotted featuring", tbs, f"None of those pictures shows {describe(release)}; I "
                                                               "look for scenes captioned with its name."),
                    (f"{release.name} {look}".strip(), None, f"None of the pictures so far shows {describe(release)}; "
                                                             "they are look-alikes. I search more widely.")]
        asked = {str(t.arguments.get("query", "")) for t in done}
        for query, date_range, think in options:
            if query not in asked:
                return tool_call("image_search", {"query": query, **({"tbs": date_range} if date_range else {})}, think)
        return None

    def _answer(self, state: Any, turns: list[Turn], found: list[knowledge.Finding], *, final: bool) -> str:
        refs, parts = [], []
        for f in found:
            if f.release is None:
                continue
            img_ids = self._images(state, self._searches(turns, f.release))
            _, crop = self.isolated(state, f.release, turns, img_ids)
            if crop is not None:
                refs.append((crop, f"clean crop of the {f.release.name}"))
            parts.append(describe(f.release))
        prompt = state.task.prompt.rstrip(".")
        if not refs:
            refs = [(i, "closest image found") for i in sorted(state.images)[:1]]
            think = "I could not verify the exact release; I hand over the closest image I found."
        else:
            think = "The crops isolate " + " and ".join(p.split(" (")[0] for p in parts) + "; I have what the " \
                    "generator needs."
        if not parts:
            return answer(prompt + ".", refs, None if final else think)
        ordinals = ("first", "second", "third")
        said = "; ".join(f"subject {n + 1} is {p}" for n, p in enumerate(parts)) if len(parts) > 1 else \
            f"the subject is {parts[0]}"
        gen_prompt = (f"{prompt}. {said[0].upper()}{said[1:]}; reproduce colours, pattern, trim and emblem exactly as "
                      f"in the {' and '.join(ordinals[:len(refs)])} reference image" + ("s" if len(refs) > 1 else "")
                      + ".")
        return answer(gen_prompt, refs, None if final else think)


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


class CaptionAgent:
    """A one-pass baseline: one image search for the request's proper nouns (the past month when it asks for
    something new), then the picture whose caption shares the most words with the request, uncropped."""

    def act(self, state: Any) -> str:
        """The next assistant turn for `state`."""
        turns = read_history(state)
        prompt = state.task.prompt
        query = " ".join(s.query for s in requests.parse_request(prompt))
        if not turns and not state.final_turn:
            args: dict[str, Any] = {"query": query}
            if requests.wants_recent(prompt):
                args["time_range"] = "month"
            return tool_call("image_search", args, "I search images for the subject's name.")
        words = set(knowledge._tokens(prompt))
        titles = {m.group(1): m.group(2) for t in turns for m in re.finditer(r"^(IMG_\d+): title: (.*)$",
                                                                               t.response, re.MULTILINE)}
        best = max(titles, key=lambda i: (len(words & knowledge._tokens(titles[i])), -int(i[4:])), default=None)
        refs = [(best, "best-captioned picture")] if best else []
        return answer(prompt, refs, None if state.final_turn else "I pick the picture whose caption fits best.")


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
