"""The built-in answer corpus: several answers per built-in task and backend that differ in what the
reward sees (correct and fast, correct and slow, wrong output, does not compile).

It is what a supervised warm start learns from (``pipeline.sft``) and what the tests use as answers
with a known verdict. Answers live beside this module as plain files,
``<backend>/level<N>/<ID_name>/<variant>.py`` (``cpu/level1/17_relu/slow.py`` is the ``slow``
answer to ``L1/17_relu`` on the cpu backend); each file is the code block a response would hold
(``ModelNew`` and its extension). ``CorpusAnswer.code`` is the file without its final newline:
exactly what ``rewards.parse`` extracts from ``f"```python\n{code}\n```"``, so a response built that
way is evaluated (and cached by the sandbox) as this very source. The prompts never show them.

Variants and the verdict the sandbox must give (``VARIANTS``):

- ``fast``: correct, and as fast as a short honest kernel gets (these are also
  :mod:`rewards.solutions`, the answers tests use as "must score").
- ``slow``: correct but measurably slower than ``fast`` on the same backend (a scalar loop without
  OpenMP, vectorisation or the fused pass that makes ``fast`` fast).
- ``wrong``: compiles and runs, plausible but wrong output (an off-by-one, a wrong constant).
- ``broken``: does not compile (a typo the compiler rejects), so it fails fast at the compiler.
  Triton compiles a kernel at its first call, so there the sandbox reports a ``runtime_error``.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CORPUS_ROOT = Path(__file__).resolve().parent
BACKENDS = ("cpu", "cuda", "triton")
# variant name -> the sandbox's verdict for it ("correct" or the SandboxResult/TurnOutcome error_kind)
VARIANTS: dict[str, str] = {
    "fast": "correct",
    "slow": "correct",
    "wrong": "wrong_output",
    "broken": "compile_error",
}


# what differs by backend: Triton builds the kernel when it is first launched, inside the run
_BACKEND_VERDICTS: dict[str, dict[str, str]] = {"triton": {"broken": "runtime_error"}}


def expected_verdict(backend: str, variant: str) -> str:
    """The verdict the sandbox must give ``variant`` on ``backend``."""
    return _BACKEND_VERDICTS.get(backend, {}).get(variant, VARIANTS[variant])


@dataclass(frozen=True)
class CorpusAnswer:
    task_id: str    # "L1/17_relu"
    backend: str    # "cpu" | "cuda" | "triton"
    variant: str    # a key of VARIANTS
    expected: str   # the verdict the sandbox must give: "correct" | "wrong_output" | "compile_error" |
                    # "runtime_error" (a broken Triton kernel: Triton compiles it at its first call)
    code: str       # the Python source of the answer (ModelNew + its extension), a response's code block

    @property
    def correct(self) -> bool:
        return self.expected == "correct"


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; the corpus has {', '.join(BACKENDS)}")


def task_dir(backend: str, task_id: str) -> Path:
    """Directory of ``task_id``'s answers ("L2/9_scale_shift_tanh_residual" -> .../level2/9_...)."""
    level, _, stem = task_id.partition("/")
    if not (level.startswith("L") and level[1:].isdigit() and stem):
        raise ValueError(f"task id {task_id!r} must look like L<level>/<ID_name>, e.g. L1/17_relu")
    return CORPUS_ROOT / backend / f"level{level[1:]}" / stem


def _task_id(path: Path) -> str:
    return f"L{path.parent.parent.name.removeprefix('level')}/{path.parent.name}"


def _sort_key(task_id: str) -> tuple[int, int, str]:
    level, _, stem = task_id.partition("/")
    number, _, name = stem.partition("_")
    return int(level[1:]), int(number) if number.isdigit() else -1, name


def corpus_tasks(backend: str) -> list[str]:
    """Task ids with at least one answer for ``backend``, sorted by level then problem number."""
    _check_backend(backend)
    ids = {_task_id(p) for p in (CORPUS_ROOT / backend).glob("level*/*/*.py")}
    return sorted(ids, key=_sort_key)


def corpus_answers(backend: str, task_ids: Iterable[str] | None = None) -> list[CorpusAnswer]:
    """Every answer for ``backend`` (only ``task_ids`` when given), ordered by task then variant
    (in ``VARIANTS`` order). A task id given that has no answer is an error naming it."""
    _check_backend(backend)
    wanted = corpus_tasks(backend) if task_ids is None else list(task_ids)
    missing = [t for t in wanted if not task_dir(backend, t).is_dir()]
    if missing:
        raise KeyError(f"no {backend} corpus answers for {', '.join(missing)} (under {CORPUS_ROOT / backend}); "
                       f"tasks with answers: {', '.join(corpus_tasks(backend)) or 'none'}")
    order = list(VARIANTS)
    out: list[CorpusAnswer] = []
    for task_id in wanted:
        for path in task_dir(backend, task_id).glob("*.py"):
            if path.stem not in VARIANTS:
                raise ValueError(f"{path}: unknown variant {path.stem!r}; known: {', '.join(VARIANTS)}")
            out.append(CorpusAnswer(task_id, backend, path.stem, expected_verdict(backend, path.stem), _code(path)))
    out.sort(key=lambda a: (wanted.index(a.task_id), order.index(a.variant)))
    return out


def corpus_answer(backend: str, task_id: str, variant: str) -> CorpusAnswer:
    """One answer; an error names what exists when it does not."""
    _check_backend(backend)
    path = task_dir(backend, task_id) / f"{variant}.py"
    if variant not in VARIANTS or not path.is_file():
        have = [a.variant for a in corpus_answers(backend, [task_id])] if path.parent.is_dir() else []
        raise KeyError(f"no {variant!r} {backend} answer for {task_id} (looked for {path}); "
                       f"variants there: {', '.join(have) or 'none'}")
    return CorpusAnswer(task_id, backend, variant, expected_verdict(backend, variant), _code(path))


def _code(path: Path) -> str:
    return path.read_text().rstrip("\n")
