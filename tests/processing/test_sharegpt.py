"""messages_from_sharegpt on Gen-Searcher / LLaMA-Factory rows, rendered through ChatRenderer."""

import numpy as np
import pytest

from ranger_jax.processing import chat, sharegpt

GEN_SEARCHER_ROW = {
    "messages": [
        {"role": "system", "content": "You ground prompts.\n 2025-11-02"},
        {"role": "user", "content": "Draw the trophy of the 2025 final."},
        {"role": "assistant", "content": "<think>\nsearch\n</think>\n<tool_call>\n{\"name\": \"image_search\", \"arguments\": {\"query\": \"trophy\"}}\n</tool_call>"},
        {"role": "user", "content": "<image><image><tool_response>\nIMG_001: title: a\nIMG_002: title: b\n</tool_response>"},
        {"role": "assistant", "content": "<think>\nok\n</think>\n<answer>{}</answer>"},
    ],
    "images": ["imgs/a.jpg", "/abs/b.jpg"],
}


def test_gen_searcher_row(tmp_path):
    messages = sharegpt.messages_from_sharegpt(GEN_SEARCHER_ROW, media_dir=tmp_path)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[1]["content"] == GEN_SEARCHER_ROW["messages"][1]["content"]
    assert messages[3]["content"] == [
        {"type": "image", "image": str(tmp_path / "imgs/a.jpg")},
        {"type": "image", "image": "/abs/b.jpg"},
        {"type": "text", "text": "<tool_response>\nIMG_001: title: a\nIMG_002: title: b\n</tool_response>"},
    ]


def test_row_renders_with_images_in_place(qwen_tokenizer):
    messages = sharegpt.messages_from_sharegpt(GEN_SEARCHER_ROW)
    grids = np.array([[1, 4, 4], [1, 2, 6]])
    rendered = chat.ChatRenderer(qwen_tokenizer).render(messages, images_grid_thw=grids)
    expected_text = "".join(
        f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in GEN_SEARCHER_ROW["messages"]
    )
    for count in (4, 3):
        expected_text = expected_text.replace("<image>", "<|vision_start|>" + "<|image_pad|>" * count + "<|vision_end|>", 1)
    assert qwen_tokenizer.decode(rendered.ids) == expected_text
    assert [c for _, c in rendered.image_spans] == [4, 3]
    assert int(rendered.loss_mask.sum()) == sum(
        len(qwen_tokenizer.encode(m["content"])) + 1 for m in GEN_SEARCHER_ROW["messages"] if m["role"] == "assistant"
    )


def test_placeholder_in_middle_and_conversations_format():
    row = {
        "conversations": [
            {"from": "human", "value": "Compare <image> with <image>, please."},
            {"from": "gpt", "value": "Same."},
            {"from": "observation", "value": "<image>crop"},
            {"from": "gpt", "value": "Done."},
        ],
        "images": ["x.png", "y.png", "z.png"],
        "system": "Be exact.",
    }
    messages = sharegpt.messages_from_sharegpt(row)
    assert messages[0] == {"role": "system", "content": "Be exact."}
    assert messages[1]["content"] == [
        {"type": "text", "text": "Compare "}, {"type": "image", "image": "x.png"},
        {"type": "text", "text": " with "}, {"type": "image", "image": "y.png"}, {"type": "text", "text": ", please."},
    ]
    assert messages[3] == {"role": "user", "content": [
        {"type": "text", "text": "<tool_response>\n"}, {"type": "image", "image": "z.png"},
        {"type": "text", "text": "crop\n</tool_response>"},
    ]}


def test_system_column_does_not_duplicate_a_system_message():
    row = {"messages": [{"role": "system", "content": "A"}, {"role": "user", "content": "B"}], "system": "C"}
    assert [m["content"] for m in sharegpt.messages_from_sharegpt(row)] == ["A", "B"]


def test_bad_rows_name_the_problem():
    with pytest.raises(ValueError, match="sharegpt row has 2 <image> tags but 1 images"):
        sharegpt.messages_from_sharegpt({**GEN_SEARCHER_ROW, "images": ["a.jpg"]})
    with pytest.raises(ValueError, match="sharegpt row has 0 <image> tags but 1 images"):
        sharegpt.messages_from_sharegpt({"messages": [{"role": "user", "content": "x"}], "images": ["a.jpg"]})
    with pytest.raises(ValueError, match="message 0 has from='function_call'"):
        sharegpt.messages_from_sharegpt({"conversations": [{"from": "function_call", "value": "{}"}]})
    with pytest.raises(ValueError, match=r"message 0 \(assistant\) holds <image>"):
        sharegpt.messages_from_sharegpt({"messages": [{"role": "assistant", "content": "<image>"}], "images": ["a"]})
    with pytest.raises(ValueError, match="message 0 content is a list, not a string"):
        sharegpt.messages_from_sharegpt({"messages": [{"role": "user", "content": []}]})
    with pytest.raises(ValueError, match="neither 'messages' nor 'conversations'"):
        sharegpt.messages_from_sharegpt({"prompt": "x"})
