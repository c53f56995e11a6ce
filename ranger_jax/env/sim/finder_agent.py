"""Scripted Locate–Corroborate–Isolate agents that perceive only through the `find_object` tool.

Unlike `agents.ExpertAgent`, whose perception reads the world's annotations (an oracle), these agents see
nothing but tool observations and let the pixel-only `find_object` tool (`ranger_jax.env.perception`) find and
crop the object with the colours, pattern and trim the pages gave.

`PixelExpertAgent` is the expert itself with that one change: it locates and corroborates exactly as
`agents.ExpertAgent` does (one subject or two, prose facts or fact sheets, makers, look-alikes), and isolates
each subject with `find_object` over that subject's pictures, accepting a match only when the tool reports the
expected colours, pattern and trim; otherwise it searches more pictures. It shows that the tasks are solvable
from observations alone.

`FinderAgent` is the compact teacher whose trajectories a small policy can imitate step for step, since every
decision it makes can be made from what the policy sees. Turns are compact (no `<think>` by default): search the
request's proper nouns, read the most promising page, search images of the release by name, find the object,
answer.

`SnippetAgent` is the shortest such strategy, for policies with small contexts: it never reads a page. It
searches the request's proper nouns, searches images for them, copies the look ("green with orange dots") from
the search snippet that best names the newest matching release into `find_object`, and answers with the crop.
"""

from __future__ import annotations

import re
from typing import Any

from ranger_jax.env import tools
from ranger_jax.env.sim import agents, bm25, knowledge

MAX_FETCHES = 3
MAX_IMAGE_SEARCHES = 2
MAX_FINDS = 2
# A text search hit, with or without its link: "3. [title](url) (date)\nsnippet" or "3. title (date)\nsnippet".
_HIT = re.compile(r"^\d+\. (?:\[(?P<title>[^\]]*)\]\([^)\s]+\)|(?P<bare>.*?))(?: \((?P<date>\d{4}-\d{2}-\d{2})\))?"
                  r"\n(?P<snippet>(?!\d+\. |--- ).*)$", re.MULTILINE)
_BEST_MATCH = re.compile(r"Best match in (IMG_\d+).*?(IMG_\d+): crop of", re.DOTALL)
_SEEN = re.compile(r"Best match in IMG_\d+ \((?P<primary>[a-z]+) with (?P<secondary>[a-z]+) (?P<pattern>[a-z]+)"
                   r"(?:, (?P<trim>[a-z]+) trim)?, match (?P<score>[\d.]+)\)")
MIN_MATCH = 0.15  # the find_object score below which a reported match is not trusted
# How the world's prose words a look (see `env.sim.pages.describe`), e.g. "comes in green with orange dots",
# "a lime body covered in maroon chevrons", "maroon chevrons against a lime ground".
_LOOK = re.compile(r"(?:pairs a|comes in|Expect a) [a-z]+ (?:base |body )?(?:with|covered in) [a-z]+ [a-z]+"
                   r"(?: finish with [a-z]+ trim)?|[a-z]+ [a-z]+ against a [a-z]+ ground")


def describe_look(release: agents.Release) -> str:
    """The look of a release as `find_object` reads it: "green with orange dots" (", lime trim" when known)."""
    a = release.attributes
    look = f"{a.primary} with {a.secondary} {a.pattern}".strip()
    return f"{look}, {a.trim} trim" if a.trim else look


class PixelExpertAgent(agents.ExpertAgent):
    """`agents.ExpertAgent` with perception through `find_object` only (see the module docstring)."""

    def __init__(self):
        super().__init__(detector=None)

    @staticmethod
    def _finds(turns: list[agents.Turn], img_ids: list[str]) -> list[agents.Turn]:
        return [t for t in turns if t.name == tools.FIND_OBJECT and t.arguments.get("img_ids")
                and set(t.arguments["img_ids"]) <= set(img_ids)]

    @staticmethod
    def accepts(release: agents.Release, response: str) -> bool:
        """Whether a find_object answer reports the release's colours, pattern and trim with a trusted score."""
        m = _SEEN.search(response)
        if m is None or float(m["score"]) < MIN_MATCH:
            return False
        a = release.attributes
        return (m["primary"], m["secondary"], m["pattern"]) == (a.primary, a.secondary, a.pattern) and (
            not a.trim or m["trim"] == a.trim)

    def isolated(self, state: Any, release: agents.Release, turns: list[agents.Turn], img_ids: list[str]
                 ) -> tuple[bool, str | None]:
        """(isolated, crop): done when a find_object answer is accepted; the last crop is cited either way."""
        finds = self._finds(turns, img_ids)
        crops = [(t, m.group(2)) for t in finds if (m := _BEST_MATCH.search(t.response))]
        accepted = [c for t, c in crops if self.accepts(release, t.response)]
        if accepted:
            return True, accepted[-1]
        return False, crops[-1][1] if crops else None

    def isolate(self, state: Any, release: agents.Release, turns: list[agents.Turn], img_ids: list[str]) -> str | None:
        """find_object over the subject's pictures, once per new set of pictures; None when they were searched."""
        a = release.attributes
        if not (a.primary and a.secondary and a.pattern) or not img_ids:
            return None
        if any(set(t.arguments.get("img_ids", ())) == set(img_ids) for t in self._finds(turns, img_ids)):
            return None
        look = describe_look(release)
        return agents.tool_call(tools.FIND_OBJECT, {"description": look, "img_ids": list(img_ids)},
                                f"I look for the {look} object in the pictures of the {release.name}.")


class FinderAgent:
    """Locate (text_search, web_fetch), Corroborate (image_search by name), Isolate (find_object), answer.

    Args:
        think: write a short `<think>` before each call (off: the turn is only the call).
        top_k: results per text search.
    """

    def __init__(self, *, think: bool = False, top_k: int = 8):
        self.think = think
        self.top_k = top_k

    def _call(self, name: str, arguments: dict[str, Any], thought: str) -> str:
        if self.think:
            return agents.tool_call(name, arguments, thought)
        body = agents.json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"<tool_call>\n{body}\n</tool_call>"

    def _answer(self, gen_prompt: str, img_id: str | None, note: str, thought: str) -> str:
        refs = [(img_id, note)] if img_id else []
        return agents.answer(gen_prompt, refs, thought if self.think else None)

    def act(self, state: Any) -> str:
        """The next assistant turn for `state`."""
        turns = agents.read_history(state)
        prompt = state.task.prompt
        subject = agents.subject_query(prompt)
        recent = agents.wants_recent(prompt)
        searches = [t for t in turns if t.name == tools.TEXT_SEARCH]
        fetched = [t for t in turns if t.name == tools.WEB_FETCH]
        image_searches = [t for t in turns if t.name == tools.IMAGE_SEARCH]
        finds = [t for t in turns if t.name == tools.FIND_OBJECT]
        finding = agents.ExpertAgent.findings(state, turns)[0]
        release, sure = finding.release, finding.sure
        crop = next((m.group(2) for t in reversed(finds) if (m := _BEST_MATCH.search(t.response))), None)
        if state.final_turn or (crop is not None and release is not None):
            return self._finish(state, release, crop)
        if not searches:
            args: dict[str, Any] = {"queries": [subject], "top_k": self.top_k}
            if recent:
                args["time_range"] = "month"
            return self._call(tools.TEXT_SEARCH, args, f"I look up which {subject} is meant.")
        if (release is None or not sure) and len(fetched) < MAX_FETCHES:
            done = {t.arguments.get("url") for t in fetched}
            todo = [h for h in knowledge.hits(turns) if h["url"] not in done]
            if todo:
                words = set(bm25.tokenize(subject))

                def is_launch(text: str) -> bool:
                    return any(m.group(0).lower() not in words for m in agents._LAUNCH.finditer(text))

                def priority(hit: dict[str, str]) -> tuple:
                    launch = is_launch(hit["title"]) or is_launch(hit["snippet"])
                    overlap = len(words & set(bm25.tokenize(hit["title"])))
                    return (overlap, launch, hit["date"] if recent else "")

                hit = max(todo, key=priority)
                return self._call(tools.WEB_FETCH, {"url": hit["url"], "prompt": "fact sheet"},
                                  f"I read '{hit['title']}' for the fact sheet.")
        if release is None:
            return self._finish(state, None, None)
        if len(image_searches) < len(finds) + 1 and len(image_searches) < MAX_IMAGE_SEARCHES:
            args = {"query": release.name}
            if not image_searches:
                args["time_range"] = "month" if recent else "year"
            return self._call(tools.IMAGE_SEARCH, args, f"I search pictures of the {release.name}.")
        if len(finds) < MAX_FINDS and image_searches:
            return self._call(tools.FIND_OBJECT, {"description": describe_look(release)},
                              f"I find the {describe_look(release)} object.")
        return self._finish(state, release, None)

    def _finish(self, state: Any, release: agents.Release | None, crop: str | None) -> str:
        prompt = state.task.prompt.rstrip(".")
        if release is None:
            first = min(state.images) if state.images else None
            return self._answer(prompt + ".", first, "closest image found", "I could not pin down the release.")
        gen_prompt = (f"{prompt}. Subject: the {release.name}, {describe_look(release)}, "
                      f"{release.attributes.emblem} emblem, as in the first reference image.")
        img_id = crop or (min(state.images) if state.images else None)
        return self._answer(gen_prompt, img_id, f"the {release.name}", f"I have the {release.name}.")


def _bare_call(name: str, arguments: dict[str, Any]) -> str:
    body = agents.json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


class SnippetAgent:
    """Locate from search snippets, Corroborate with image search, Isolate with find_object; three tool calls.

    The look is copied from the snippet that shares most words with the request, then names the highest edition
    number, then is the newest. About 0.6-0.7 search score on fresh worlds (the page-reading `FinderAgent`
    reaches about 0.9 with one more call and a page to read).

    Args:
        top_k: results per text search.
        query: what both searches ask: "subject" (the request's proper nouns) or "request" (the request itself,
            verbatim: a copy a small policy learns much sooner than picking out the proper nouns, at about the
            same search score).
    """

    def __init__(self, *, top_k: int = 5, query: str = "subject"):
        if query not in ("subject", "request"):
            raise ValueError(f"SnippetAgent query must be 'subject' or 'request'; got {query!r}")
        self.top_k = top_k
        self.query = query

    def act(self, state: Any) -> str:
        """The next assistant turn for `state`."""
        turns = agents.read_history(state)
        prompt = state.task.prompt
        subject = agents.subject_query(prompt) if self.query == "subject" else prompt.rstrip(".")
        recent = agents.wants_recent(prompt)
        done = {t.name for t in turns}
        if state.final_turn:
            return self._answer(state, turns, prompt, subject)
        if tools.TEXT_SEARCH not in done:
            args: dict[str, Any] = {"queries": [subject], "top_k": self.top_k}
            if recent:
                args["time_range"] = "month"
            return _bare_call(tools.TEXT_SEARCH, args)
        if tools.IMAGE_SEARCH not in done:
            args = {"query": subject}
            if recent:
                args["time_range"] = "month"
            return _bare_call(tools.IMAGE_SEARCH, args)
        if tools.FIND_OBJECT not in done:
            return _bare_call(tools.FIND_OBJECT, {"description": self.look(turns, subject)})
        return self._answer(state, turns, prompt, subject)

    @staticmethod
    def look(turns: list[agents.Turn], subject: str) -> str:
        """The look phrase of the best snippet (the subject itself when no snippet describes a look)."""
        words = set(bm25.tokenize(subject))
        best = None
        hits = [{"title": m["title"] or m["bare"], "date": m["date"] or "", "snippet": m["snippet"]}
                for t in turns if t.name == tools.TEXT_SEARCH for m in _HIT.finditer(t.response)]
        for hit in hits:
            match = _LOOK.search(hit["snippet"])
            if match is None:
                continue
            text = f"{hit['title']} {hit['snippet']}"
            numbers = [int(n) for n in re.findall(r"\b(\d{1,2})\b", text)]
            key = (len(words & set(bm25.tokenize(text))), max(numbers, default=0), hit["date"])
            if best is None or key > best[0]:
                best = (key, match.group(0))
        return best[1] if best else subject

    def _answer(self, state: Any, turns: list[agents.Turn], prompt: str, subject: str) -> str:
        finds = [t for t in turns if t.name == tools.FIND_OBJECT]
        crop = next((m.group(2) for t in reversed(finds) if (m := _BEST_MATCH.search(t.response))), None)
        if crop is None:
            crop = min(state.images) if state.images else None
        refs = [(crop, "the subject")] if crop else []
        gen_prompt = f"{prompt.rstrip('.')}. Subject: {self.look(turns, subject)}, as in the first reference image."
        return agents.answer(gen_prompt, refs, None)
