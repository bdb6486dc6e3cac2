from rewards.parse import parse_response, split_thinking, strip_thinking

GOOD = "class ModelNew:\n    pass"


def test_think_summary_and_code_are_split():
    p = parse_response(f"<think>long reasoning</think>\nI fused the ops.\n```python\n{GOOD}\n```\n")
    assert p.ok and p.thinking == "long reasoning" and p.summary == "I fused the ops." and p.code == GOOD


def test_close_tag_only_when_the_template_opened_think():
    p = parse_response(f"reasoning here</think>Summary.\n```python\n{GOOD}\n```")
    assert p.ok and p.thinking == "reasoning here" and p.summary == "Summary."


def test_last_python_block_wins_and_summary_has_no_code():
    text = f"Draft:\n```python\nx = 1\n```\nFinal version:\n```py\n{GOOD}\n```\nDone."
    p = parse_response(text)
    assert p.ok and p.code == GOOD
    assert "x = 1" not in p.summary and "Final version:" in p.summary and "Done." in p.summary


def test_non_python_blocks_are_not_the_answer():
    p = parse_response(f"```cpp\nint main() {{}}\n```\n```python\n{GOOD}\n```\n```\nsome log\n```")
    assert p.ok and p.code == GOOD  # tagged python wins over a later untagged block
    assert parse_response(f"```\n{GOOD}\n```").code == GOOD  # untagged counts when nothing says python
    only_cpp = parse_response("```cpp\nint main() {}\n```")
    assert only_cpp.error_kind == "no_code_block"


def test_failure_kinds():
    assert parse_response("").error_kind == "empty"
    assert parse_response("<think>never closed, cut at max length").error_kind == "empty"
    assert parse_response("<think>a</think>   ").error_kind == "empty"
    assert parse_response("I would write a kernel.").error_kind == "no_code_block"
    assert parse_response(f"```python\n{GOOD}\n").error_kind == "unterminated_code_block"
    assert parse_response(f"```python\n{GOOD}\n```\n```python\nclass ModelNew(").error_kind == \
        "unterminated_code_block"
    bad = parse_response("```python\ndef f(:\n    pass\n```")
    assert bad.error_kind == "syntax_error" and "line 1" in bad.error and bad.code is not None
    assert parse_response("```python\nclass Model:\n    pass\n```").error_kind == "no_model_new"
    assert parse_response("\x00\x01\x02 junk" * 10).error_kind == "binary_junk"
    assert parse_response("x" * 50, max_chars=10).error_kind == "too_long"


def test_model_new_may_be_bound_by_assignment():
    assert parse_response("```python\nclass A:\n    pass\nModelNew = A\n```").ok


def test_strip_thinking():
    assert strip_thinking("<think>secret plan</think>answer") == "answer"
    assert split_thinking("no think at all") == ("", "no think at all")
