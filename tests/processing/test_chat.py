"""ChatRenderer against transformers' apply_chat_template with the Qwen3-VL template and the real Qwen3 vocabulary."""

import datetime

import numpy as np
import pytest
from support.tiny_tokenizer import write_tiny_tokenizer

from ranger_jax.processing import chat, tokenizer as tokenizer_lib

TEMPLATE = chat.qwen3_vl_chat_template()
SYSTEM = "You are a helpful assistant for grounding prompts for image generation.\n# Tools\n<tools>\n{}\n</tools>\n "
TASK = "Draw the sneaker Nike released last week, on a wet street at night."
A1 = '<think>\nFind the release first.\n</think>\n<tool_call>\n{"name": "image_search", "arguments": {"query": "nike sneaker"}}\n</tool_call>'
OBS1 = "--- image search result for [nike sneaker] ---\nIMG_001: title: Side view\n  url: https://x.test/a.jpg\n--- end of image search result ---"
A2 = "<think>\nIMG_001 fits.\n</think>\n<answer>{\"gen_prompt\": \"the first reference image\", \"reference_images\": [{\"img_id\": \"IMG_001\"}]}</answer>"
GRIDS = np.array([[1, 4, 6], [1, 8, 2], [1, 2, 2], [1, 10, 14]])


def hf_ids(hf, messages, grids=(), **kwargs):
    """transformers' template string, each <|image_pad|> expanded as Qwen3VLProcessor does, then tokenized."""
    text = hf.apply_chat_template(messages, chat_template=TEMPLATE, tokenize=False, **kwargs)
    counts = [int(np.prod(g)) // 4 for g in grids]
    pieces = text.split("<|image_pad|>")
    assert len(pieces) == len(counts) + 1
    text = pieces[0] + "".join("<|image_pad|>" * n + p for n, p in zip(counts, pieces[1:]))
    return hf(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def renderer(qwen_tokenizer):
    return chat.ChatRenderer(qwen_tokenizer)


def image(**extra):
    return {"type": "image", **extra}


def text(value):
    return {"type": "text", "text": value}


CONVERSATIONS = {
    "text_only": ([
        {"role": "system", "content": SYSTEM + "2026-05-01"},
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": A1},
        {"role": "user", "content": "<tool_response>\n" + OBS1 + "\n</tool_response>"},
        {"role": "assistant", "content": A2},
    ], ()),
    "images_in_user_turns": ([
        {"role": "system", "content": [text("Be brief. "), text("Really.")]},
        {"role": "user", "content": [image(image="a.jpg"), text("What is this?"), image(image_url="b.png")]},
        {"role": "assistant", "content": [text("<think>\nhm\n</think>\nA shoe.")]},
        {"role": "user", "content": [text("And "), text("these?"), image(), image()]},
    ], GRIDS),
    "tool_role_with_images": ([
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": A1},
        {"role": "tool", "content": [image(), text(OBS1)]},
        {"role": "tool", "content": "second result"},
        {"role": "assistant", "content": A2},
        {"role": "tool", "content": [text("crop: "), image()]},
    ], GRIDS[:2]),
    "tool_calls_and_tools": ([
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Find it."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "text_search", "arguments": {"queries": ["Zürich 東京"], "top_k": 3}}},
            {"name": "crop_image", "arguments": '{"image_id": "IMG_001", "bbox": [0.1, 0.2, 0.5, 0.9]}'},
        ]},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "Done.", "tool_calls": [{"name": "web_fetch", "arguments": {"url": "https://x.test"}}]},
    ], ()),
}
TOOLS = [{"type": "function", "function": {"name": "text_search", "description": "Web search — text.",
                                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_render_matches_template(renderer, hf_qwen_tokenizer, name, add_generation_prompt):
    messages, grids = CONVERSATIONS[name]
    tools = TOOLS if name == "tool_calls_and_tools" else None
    rendered = renderer.render(messages, images_grid_thw=grids, add_generation_prompt=add_generation_prompt, tools=tools)
    expected = hf_ids(hf_qwen_tokenizer, messages, grids, add_generation_prompt=add_generation_prompt, tools=tools)
    assert rendered.ids.dtype == np.int32 and rendered.loss_mask.dtype == bool
    assert rendered.ids.tolist() == expected
    assert rendered.image_grid_thw.tolist() == np.asarray(grids).reshape(-1, 3).tolist()


def test_text_only_render_equals_tokenized_template(renderer, hf_qwen_tokenizer):
    messages, _ = CONVERSATIONS["text_only"]
    expected = hf_qwen_tokenizer.apply_chat_template(messages, chat_template=TEMPLATE, tokenize=True,
                                                     return_dict=True, add_generation_prompt=True)["input_ids"]
    assert renderer.render(messages, add_generation_prompt=True).ids.tolist() == expected


def test_loss_mask_covers_exactly_assistant_content_and_im_end(renderer, qwen_tokenizer):
    messages, _ = CONVERSATIONS["text_only"]
    rendered = renderer.render(messages, add_generation_prompt=True)
    mask = np.concatenate([[False], rendered.loss_mask, [False]]).astype(int)
    starts, ends = np.flatnonzero(np.diff(mask) == 1), np.flatnonzero(np.diff(mask) == -1)
    spans = [qwen_tokenizer.decode(rendered.ids[s:e]) for s, e in zip(starts, ends)]
    assert spans == [A1 + "<|im_end|>", A2 + "<|im_end|>"]
    for start in starts:  # each trained run follows the assistant header
        assert qwen_tokenizer.decode(rendered.ids[start - 3:start]) == "<|im_start|>assistant\n"


def test_image_spans_point_at_pad_runs(renderer, qwen_tokenizer):
    messages, grids = CONVERSATIONS["images_in_user_turns"]
    rendered = renderer.render(messages, images_grid_thw=grids)
    assert [count for _, count in rendered.image_spans] == [6, 4, 1, 35]
    assert int((rendered.ids == qwen_tokenizer.image_pad_id).sum()) == 46
    for start, count in rendered.image_spans:
        assert rendered.ids[start - 1] == qwen_tokenizer.vision_start_id
        assert (rendered.ids[start:start + count] == qwen_tokenizer.image_pad_id).all()
        assert rendered.ids[start + count] == qwen_tokenizer.vision_end_id
    assert not rendered.loss_mask[rendered.ids == qwen_tokenizer.image_pad_id].any()


def test_incremental_pieces_concatenate_to_whole_render(renderer, qwen_tokenizer, hf_qwen_tokenizer):
    final = "=== FINAL STEP: OUTPUT ANSWER NOW ==="
    grids = GRIDS[:3]
    pieces = [
        renderer.render_prefix(SYSTEM, TASK, date=datetime.date(2026, 5, 1), images_grid_thw=grids[:1]),
        renderer.generation_prompt(),
        renderer.assistant_generated(qwen_tokenizer.encode(A1) + [qwen_tokenizer.im_end_id]),
        renderer.assistant_suffix(),
        renderer.render_tool_response(OBS1, images_grid_thw=grids[1:]),
        renderer.generation_prompt(),
        renderer.assistant_generated(np.array(qwen_tokenizer.encode(A2) + [qwen_tokenizer.im_end_id])),
        renderer.assistant_suffix(),
        renderer.render_user(final),
        renderer.generation_prompt(),
    ]
    messages = [
        {"role": "system", "content": SYSTEM + "2026-05-01"},
        {"role": "user", "content": [image(), text(TASK)]},
        {"role": "assistant", "content": A1},
        {"role": "user", "content": [image(), image(), text("<tool_response>\n" + OBS1 + "\n</tool_response>")]},
        {"role": "assistant", "content": A2},
        {"role": "user", "content": final},
    ]
    whole = renderer.render(messages, images_grid_thw=grids, add_generation_prompt=True)
    joined = chat.concat(pieces)
    assert joined.ids.tolist() == whole.ids.tolist() == hf_ids(hf_qwen_tokenizer, messages, grids, add_generation_prompt=True)
    assert joined.loss_mask.tolist() == whole.loss_mask.tolist()
    assert joined.image_spans == whole.image_spans and joined.num_images == 3
    np.testing.assert_array_equal(joined.image_grid_thw, grids)
    summed = pieces[0]
    for piece in pieces[1:]:
        summed = summed + piece
    assert summed.ids.tolist() == joined.ids.tolist() and summed.image_spans == joined.image_spans


def test_prefix_date_forms(renderer):
    as_date = renderer.render_prefix("S ", "U", date=datetime.date(2026, 1, 2))
    as_text = renderer.render_prefix("S 2026-01-02", "U", date=None)
    assert as_date.ids.tolist() == as_text.ids.tolist() == renderer.render_prefix("S ", "U", date="2026-01-02").ids.tolist()
    assert not as_date.loss_mask.any()


def test_assistant_turn_is_segmented_like_generation(renderer, qwen_tokenizer):
    # Content starting with a newline: BPE on the template string would merge it with the header's "\n";
    # the render keeps the generation prompt's own ids, as the policy saw them.
    content = "\n\nleading newlines"
    rendered = renderer.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}])
    expected = (renderer.render_user("hi") + renderer.generation_prompt()
                + renderer.assistant_generated(qwen_tokenizer.encode(content) + [qwen_tokenizer.im_end_id])
                + renderer.assistant_suffix())
    assert rendered.ids.tolist() == expected.ids.tolist()
    assert qwen_tokenizer.decode(rendered.ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" + content + "<|im_end|>\n"


def test_tiny_tokenizer_render_matches_template(tmp_path):
    from transformers import AutoTokenizer

    write_tiny_tokenizer(tmp_path)
    tiny = tokenizer_lib.load_tokenizer(tmp_path)
    messages, grids = CONVERSATIONS["tool_role_with_images"]
    rendered = chat.ChatRenderer(tiny).render(messages, images_grid_thw=grids, add_generation_prompt=True)
    assert rendered.ids.tolist() == hf_ids(AutoTokenizer.from_pretrained(tmp_path), messages, grids, add_generation_prompt=True)
    assert int((rendered.ids == 5).sum()) == 6 + 4 and rendered.ids.max() < 512


def test_image_count_mismatch_names_both_counts(renderer):
    messages = [{"role": "user", "content": [image(), image(), text("two")]}]
    with pytest.raises(ValueError, match="messages hold 2 image parts but images_grid_thw has 1 rows"):
        renderer.render(messages, images_grid_thw=GRIDS[:1])
    with pytest.raises(ValueError, match="messages hold 0 image parts but images_grid_thw has 3 rows"):
        renderer.render([{"role": "user", "content": "none"}], images_grid_thw=GRIDS[:3])
    with pytest.raises(ValueError, match=r"images_grid_thw must be \[num_images, 3\], got shape \[4\]"):
        renderer.render_user("x", images_grid_thw=[1, 2, 2, 2])
    with pytest.raises(ValueError, match="grid_thw must be 3 positive ints"):
        renderer.render_user("x", images_grid_thw=[[1, 3, 3]])


def test_vision_tokens_in_text_are_refused(renderer, qwen_tokenizer):
    with pytest.raises(ValueError, match="text of message 0 [(]user[)] contains '<[|]image_pad[|]>'"):
        renderer.render_user("look <|image_pad|> here")
    with pytest.raises(ValueError, match="contains '<[|]vision_start[|]>'"):
        renderer.render_tool_response("<|vision_start|>", images_grid_thw=GRIDS[:1])
    with pytest.raises(ValueError, match="message 1 [(]assistant[)] contains '<[|]video_pad[|]>'"):
        renderer.render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "<|video_pad|>"}])
    ids = qwen_tokenizer.encode("fine") + [qwen_tokenizer.image_pad_id, qwen_tokenizer.im_end_id]
    with pytest.raises(ValueError, match="vision token '<[|]image_pad[|]>' at position 1"):
        renderer.assistant_generated(ids)


def test_unsupported_structure_names_the_message(renderer):
    user = {"role": "user", "content": "u"}
    cases = [
        ([user, {"role": "system", "content": "late"}], "message 1 has role 'system'"),
        ([user, {"role": "developer", "content": "x"}], "message 1 has role 'developer'"),
        ([{"role": "user", "content": [{"type": "video"}]}], "message 0 content part 0 is a video"),
        ([{"role": "user", "content": [{"type": "audio"}]}], "message 0 content part 0 has neither text nor image"),
        ([{"role": "user", "content": ["raw"]}], "message 0 content part 0 is a str"),
        ([user, {"role": "assistant", "content": [image()]}], "message 1 [(]assistant[)] content part 0 is not a text part"),
        ([{"role": "system", "content": [image()]}, user], "message 0 [(]system[)] content part 0 is not a text part"),
        ([{"role": "user"}], "message 0 content must be a string or a list of parts, got NoneType"),
        ([user, {"role": "assistant", "content": "", "tool_calls": [{"arguments": {}}]}], "message 1 tool call 0 has no name"),
        ([], "messages is empty"),
    ]
    for messages, match in cases:
        grids = GRIDS[:1] if any(isinstance(m.get("content"), list) and image() in m["content"] for m in messages) else ()
        with pytest.raises(ValueError, match=match):
            renderer.render(messages, images_grid_thw=grids)


def test_concat_of_nothing_is_empty():
    empty = chat.concat([])
    assert len(empty) == 0 and empty.ids.dtype == np.int32 and empty.image_grid_thw.shape == (0, 3)
