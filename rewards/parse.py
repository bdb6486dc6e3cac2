"""Split a model response into reasoning, summary and code, and say why when it cannot be used.

Expected answer: optional ``<think>...</think>`` reasoning, then a short summary, then exactly one
fenced python code block defining ``class ModelNew``. When several blocks are present the **last**
python-tagged one is the answer (models often show a draft first); an untagged block counts only
when no block is tagged python.
"""
from __future__ import annotations

import ast
import gc
import re
from dataclasses import dataclass

# error kinds, in the order they are checked
PARSE_ERROR_KINDS = ("too_long", "binary_junk", "empty", "no_code_block", "unterminated_code_block",
                     "syntax_error", "no_model_new")

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^\n`]*$")
_PYTHON_TAGS = {"python", "py", "python3", ""}
MAX_AST_DEPTH = 200


def parse_python(code: str) -> ast.Module:
    """``ast.parse`` that survives a CPython 3.11 fault: a garbage-collection finalizer (e.g. of an
    asyncio subprocess transport) running during AST construction can leave the constructor's
    depth count off, raising ``SystemError: AST constructor recursion depth mismatch`` for valid
    code (seen in CI). Such a failure is about the interpreter, not the code: parse again once."""
    try:
        return ast.parse(code)
    except SystemError:
        gc.collect()  # run pending finalizers now, outside the AST constructor
        return ast.parse(code)


def _depth_over(tree: ast.AST, limit: int) -> bool:
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return False


@dataclass
class Parsed:
    thinking: str             # the <think> reasoning ("" when none); dropped from later turns
    summary: str              # the answer text outside the chosen code block
    code: str | None          # the last fenced python block, None when there is none
    error_kind: str | None    # one of PARSE_ERROR_KINDS, None when usable
    error: str = ""           # detail for people (and for the feedback message)

    @property
    def ok(self) -> bool:
        return self.error_kind is None


def split_thinking(text: str) -> tuple[str, str]:
    """(reasoning, answer). Handles templates that put ``<think>`` in the prompt (only a close tag)."""
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        head, answer = text[:close], text[close + len(_THINK_CLOSE):]
        open_ = head.find(_THINK_OPEN)
        thinking = head[open_ + len(_THINK_OPEN):] if open_ >= 0 else head
        return thinking.strip(), answer
    open_ = text.find(_THINK_OPEN)
    if open_ >= 0:  # reasoning never closed (e.g. cut at max length): there is no answer
        return text[open_ + len(_THINK_OPEN):].strip(), text[:open_]
    return "", text


def strip_thinking(text: str) -> str:
    """The response without its reasoning: what later turns keep of an assistant message."""
    return split_thinking(text)[1].strip()


def _is_binary_junk(text: str) -> bool:
    if "\x00" in text:
        return True
    bad = sum(1 for c in text if (ord(c) < 32 and c not in "\n\r\t") or c == "\ufffd")
    return bad > max(8, len(text) // 100)


@dataclass
class _Block:
    start: int      # index of the opening fence line
    end: int | None  # index of the closing fence line; None when never closed
    tag: str
    body: str


def _fenced_blocks(lines: list[str]) -> list[_Block]:
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, tag = m.group(1), m.group(2).lower()
        j = i + 1
        while j < len(lines):
            c = lines[j].strip()
            if c.startswith(fence[0] * len(fence)) and set(c) == {fence[0]}:
                break
            j += 1
        closed = j < len(lines)
        blocks.append(_Block(i, j if closed else None, tag, "\n".join(lines[i + 1:j])))
        i = j + 1
    return blocks


def _prose(lines: list[str], blocks: list[_Block]) -> str:
    """The answer without any fenced block: the model's summary of what it did."""
    inside = set()
    for b in blocks:
        inside.update(range(b.start, (b.end if b.end is not None else len(lines) - 1) + 1))
    kept = "\n".join(line for i, line in enumerate(lines) if i not in inside)
    return re.sub(r"\n{3,}", "\n\n", kept).strip()


def _defines_model_new(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name) == "ModelNew" for a in node.names):
                return True
    return False


def parse_response(text: str, max_chars: int | None = None) -> Parsed:
    """Parse one response; never raises."""
    if max_chars is not None and len(text) > max_chars:
        return Parsed("", "", None, "too_long", f"response has {len(text)} characters, limit {max_chars}")
    if _is_binary_junk(text):
        return Parsed("", "", None, "binary_junk", "response contains NUL or many control characters")
    thinking, answer = split_thinking(text)
    if not answer.strip():
        detail = "the reasoning was never closed with </think>" if _THINK_OPEN in text and \
            _THINK_CLOSE not in text else "no answer after the reasoning"
        return Parsed(thinking, "", None, "empty", detail)
    lines = answer.splitlines()
    all_blocks = _fenced_blocks(lines)
    summary = _prose(lines, all_blocks)
    # python-tagged blocks first; untagged ones only when no block says python
    blocks = [b for b in all_blocks if b.tag in _PYTHON_TAGS - {""}] or [b for b in all_blocks if b.tag == ""]
    if not blocks:
        return Parsed(thinking, summary, None, "no_code_block", "no fenced ```python code block")
    last = blocks[-1]
    if last.end is None:
        return Parsed(thinking, summary, None, "unterminated_code_block",
                      f"the code block opened on answer line {last.start + 1} is never closed")
    code = last.body
    try:
        tree = parse_python(code)
    except SyntaxError as e:
        return Parsed(thinking, summary, code, "syntax_error", f"line {e.lineno}: {e.msg}")
    except ValueError as e:  # e.g. source with NUL bytes that slipped through
        return Parsed(thinking, summary, code, "syntax_error", str(e))
    except (RecursionError, MemoryError):  # e.g. x + x + ... thousands of times
        return Parsed(thinking, summary, code, "syntax_error",
                      "the code is nested too deeply for the parser")
    if _depth_over(tree, MAX_AST_DEPTH):
        # the rules walk the tree recursively: no real kernel nests this deep
        return Parsed(thinking, summary, code, "syntax_error",
                      f"the code nests expressions or blocks more than {MAX_AST_DEPTH} levels deep")
    if not _defines_model_new(tree):
        return Parsed(thinking, summary, code, "no_model_new", "the code block does not define class ModelNew")
    return Parsed(thinking, summary, code, None)
