"""The offline corpus backend: real BM25 ranking, date filters, fetches by world URL, every error, and the
failures and noise of version-2 worlds."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import math
import re
import shutil
import statistics

import pytest
from PIL import Image

from ranger_jax.env.backends import base
from ranger_jax.env.backends.offline import OfflineBackend
from ranger_jax.env.sim import bm25, build, load_tasks, world


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return build.build_world(tmp_path_factory.mktemp("offline") / "w", 6, 3, world_version=1)


@pytest.fixture(scope="module")
def root_v2(tmp_path_factory):
    return build.build_world(tmp_path_factory.mktemp("offline") / "w2", 4, 3)


@pytest.fixture(scope="module")
def backend(root):
    return OfflineBackend(root)


def test_bm25_matches_the_formula():
    index = bm25.build_index([("d0", bm25.tokenize("Apple banana")), ("d1", bm25.tokenize("the apple, apple cherry")),
                              ("d2", bm25.tokenize("cherry date elder fig"))])
    assert index.doc_len == (2, 3, 4)  # "the" is a stopword
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    scores = index.scores("apple APPLE")  # query terms count once
    assert scores[0] == pytest.approx(idf * 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 2 / 3)))
    assert scores[1] == pytest.approx(idf * 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 3 / 3)))
    assert 2 not in scores
    assert [d for d, _ in index.search("apple", 5)] == [1, 0]
    assert [d for d, _ in index.search("apple", 5, keep=lambda d: d != 1)] == [0]
    assert bm25.Index.from_json(json.loads(json.dumps(index.to_json())), "x") == index


def test_index_json_errors():
    with pytest.raises(ValueError, match=r"index here lacks keys \['postings'\]"):
        bm25.Index.from_json({"k1": 1, "b": 1, "docs": [], "doc_len": []}, "here")
    with pytest.raises(ValueError, match="index here has 2 docs but 1 doc lengths"):
        bm25.Index.from_json({"k1": 1, "b": 1, "docs": ["a", "b"], "doc_len": [3], "postings": {}}, "here")


def test_is_a_backend_with_the_worlds_today(backend, root):
    assert isinstance(backend, base.Backend)
    assert backend.today == dt.date.fromisoformat(world.read_meta(root)["today"])
    run(backend.aclose())


def test_text_search_is_bm25_over_the_pages(backend, root):
    target = load_tasks(root)[0].ground_truth["target_name"]
    hits = run(backend.text_search(target, top_k=10))
    assert [h.position for h in hits] == list(range(1, len(hits) + 1))
    assert target in backend.world.pages[hits[0].url].text
    reference = bm25.build_index((p.url, bm25.tokenize(p.title) * 2 + bm25.tokenize(p.text))
                                 for p in backend.world.pages.values())
    expected = [reference.docs[d] for d, _ in reference.search(target, 10)]
    assert [h.url for h in hits] == expected
    assert all(set(bm25.tokenize(h.snippet)) & set(bm25.tokenize(target)) for h in hits)
    assert all(h.date == backend.world.pages[h.url].date for h in hits)
    assert run(OfflineBackend(root).text_search(target, top_k=10)) == hits  # deterministic


def test_date_filters_read_relative_to_the_worlds_today(backend, root):
    task = load_tasks(root)[0]
    family = backend.world.entities[task.ground_truth["target_id"]].family
    week = run(backend.text_search(family, top_k=20, tbs="qdr:w"))
    assert week and all(backend.today - dt.timedelta(days=7) <= dt.date.fromisoformat(h.date) <= backend.today
                        for h in week)
    everything = run(backend.text_search(family, top_k=20))
    assert len(everything) > len(week)
    old = dt.date.fromisoformat(min(h.date for h in everything))
    tbs = f"cdr:1,cd_min:{old.month}/{old.day}/{old.year},cd_max:{old.month}/{old.day}/{old.year}"
    assert {h.date for h in run(backend.text_search(family, top_k=20, tbs=tbs))} == {old.isoformat()}
    assert run(backend.text_search(family, top_k=5, tbs="cdr:1,cd_min:1/1/1990,cd_max:1/1/1991")) == []
    images = run(backend.image_search(family, top_k=20, tbs="qdr:m"))
    assert images and all(backend.world.images[h.image_url].date >= (backend.today - dt.timedelta(days=31)).isoformat()
                          for h in images)


def test_image_search_over_titles_alt_text_and_page_context(backend):
    image = next(iter(backend.world.images.values()))
    hits = run(backend.image_search(image.alt, top_k=20))
    assert image.url in [h.image_url for h in hits]
    for hit in hits:
        known = backend.world.images[hit.image_url]
        assert (hit.title, hit.page_url, hit.width, hit.height) == (known.title, known.page_url, known.width,
                                                                    known.height)
        assert hit.source == known.page_url.split("/")[2] and hit.page_url in backend.world.pages
    page = backend.world.pages[image.page_url]
    by_page = run(backend.image_search(page.title, top_k=20))
    assert image.url in [h.image_url for h in by_page]


def test_fetches_by_world_url(backend):
    page = next(iter(backend.world.pages.values()))
    fetched = run(backend.fetch_page(page.url + "/#section"))
    assert (fetched.url, fetched.title, fetched.text, fetched.date) == (page.url, page.title, page.text, page.date)
    image = backend.world.images[page.image_urls[0]] if page.image_urls else next(iter(backend.world.images.values()))
    blob = run(backend.fetch_image(image.url))
    assert blob.content_type == "image/png" and blob.page_url == image.page_url
    assert Image.open(io.BytesIO(blob.data)).size == (image.width, image.height)


def test_errors_name_the_thing(backend, root, tmp_path):
    with pytest.raises(base.BackendError, match=r"no page at 'https://nowhere.sim/x' in the offline world \(404\)"):
        run(backend.fetch_page("https://nowhere.sim/x"))
    image_url = next(iter(backend.world.images))
    with pytest.raises(base.BackendError, match="is an image, not a page"):
        run(backend.fetch_page(image_url))
    with pytest.raises(base.BackendError, match=r"no image at 'https://nowhere.sim/x.png'"):
        run(backend.fetch_image("https://nowhere.sim/x.png"))
    with pytest.raises(base.BackendError, match=r"tbs 'qdr:z' is not a date filter"):
        run(backend.text_search("kit", top_k=5, tbs="qdr:z"))
    with pytest.raises(base.BackendError, match=r"image_search top_k must be in 1..20, got 0"):
        run(backend.image_search("kit", top_k=0))
    with pytest.raises(base.BackendError, match="text_search query is empty"):
        run(backend.text_search("  ", top_k=5))
    with pytest.raises(base.BackendError, match="has no searchable words"):
        run(backend.text_search("the of ...", top_k=5))
    copy = shutil.copytree(root, tmp_path / "copy")
    first = next(iter(OfflineBackend(copy).world.images.values()))
    (copy / first.file).unlink()
    with pytest.raises(base.BackendError, match="is missing its file"):
        run(OfflineBackend(copy).fetch_image(first.url))
    index = json.loads((copy / world.INDEX_FILE).read_text())
    index["pages"]["docs"] = index["pages"]["docs"][:-1]
    index["pages"]["doc_len"] = index["pages"]["doc_len"][:-1]
    (copy / world.INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"indexes \d+ pages but the world has \d+; rebuild the world"):
        OfflineBackend(copy)
    (copy / world.INDEX_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="index.json not found"):
        OfflineBackend(copy)
    with pytest.raises(FileNotFoundError, match="is not an offline world"):
        OfflineBackend(tmp_path / "empty")


def test_world_files_are_trusted_by_their_build_hash(backend, root, tmp_path):
    image = next(iter(backend.world.images.values()))
    blob = run(backend.fetch_image(image.url))
    assert blob.trusted_file == str((root / image.file).resolve())
    copy = shutil.copytree(root, tmp_path / "tampered")
    other = Image.new("RGB", (image.width, image.height), (1, 2, 3))
    other.save(copy / image.file)  # a valid PNG, but not the one the builder wrote
    tampered = run(OfflineBackend(copy).fetch_image(image.url))
    assert tampered.trusted_file is None and tampered.data == (copy / image.file).read_bytes()


def test_dead_links_and_failed_downloads_answer_what_the_world_recorded(root_v2):
    backend = OfflineBackend(root_v2)
    dead = [p for p in backend.world.pages.values() if p.error]
    broken = [i for i in backend.world.images.values() if i.error]
    assert dead and broken
    for page in dead:
        with pytest.raises(base.BackendError, match=f"^{re.escape(page.error)} from {re.escape(page.url)}$"):
            run(backend.fetch_page(page.url))
    for image in broken:
        with pytest.raises(base.BackendError, match=f"^{re.escape(image.error)} from {re.escape(image.url)}$"):
            run(backend.fetch_image(image.url))
    hits = run(backend.text_search(dead[0].title, top_k=20))
    assert dead[0].url in [h.url for h in hits]  # still listed: search does not know the link is dead
    live = next(i for i in backend.world.images.values() if i.error is None)
    blob = run(backend.fetch_image(live.url))
    assert blob.content_type == "image/jpeg" and blob.data[:2] == b"\xff\xd8"
    assert Image.open(io.BytesIO(blob.data)).size == (live.width, live.height)


def test_ranking_noise_is_seeded_per_query_and_document(root_v2, tmp_path):
    backend = OfflineBackend(root_v2)
    assert backend.world.ranking_noise > 0
    queries = [t.prompt for t in load_tasks(root_v2)]
    noisy = [[h.url for h in run(backend.text_search(q, top_k=10))] for q in queries]
    assert noisy == [[h.url for h in run(OfflineBackend(root_v2).text_search(q, top_k=10))] for q in queries]
    reference = bm25.build_index((p.url, bm25.tokenize(p.title) * 2 + bm25.tokenize(p.text))
                                 for p in backend.world.pages.values())
    exact = [[reference.docs[d] for d, _ in reference.search(q, 10)] for q in queries]
    assert noisy != exact
    factor = backend._noise(queries[0], exact[0][0])
    assert factor == backend._noise(queries[0].upper(), exact[0][0]) != backend._noise(queries[0], exact[0][1])
    sigma = backend.world.ranking_noise
    factors = [backend._noise(q, u) for q in queries for u in exact[0]]
    assert 0.5 * sigma < statistics.pstdev(math.log(f) for f in factors) < 1.5 * sigma


def test_version_two_snippets_are_prose(root_v2):
    backend = OfflineBackend(root_v2)
    for task in load_tasks(root_v2):
        for hit in run(backend.text_search(task.prompt, top_k=10)):
            assert not hit.snippet.startswith(("Posted ", "See also:", "More:", "[image:", "Media:", "PRESS RELEASE",
                                               "*", "="))
