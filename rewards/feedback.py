"""Feedback messages that open the next turn, one per outcome. Written for the model to act on."""
from __future__ import annotations

import re
from collections.abc import Sequence

from rewards.parse import Parsed
from rewards.rules import RULES, Violation
from sandbox.result import SandboxResult

_FIRST_ERROR = (re.compile(r"\berror\b\s*[:(#]", re.IGNORECASE),      # compiler diagnostics
                re.compile(r"\b\w*(Error|Exception)\b|undefined reference|fatal", re.IGNORECASE))
_BUILD_NOISE = re.compile(r"^\s*(\[\d+/\d+\]|FAILED:|ninja: |(c\+\+|g\+\+|gcc|clang\+*|nvcc|/\S*nvcc)\s+-)")
_LONG_PATH = re.compile(r"(?:/[\w.+@-]+)+/([\w.+@-]+)")

_PARSE_HINTS = {
    "too_long": "Your response was too long ({detail}). Keep the reasoning short and give one code block.",
    "binary_junk": "Your response contained binary or control characters ({detail}).",
    "empty": "Your response contained no answer ({detail}).",
    "no_code_block": "Your response had no fenced ```python code block.",
    "unterminated_code_block": "Your code block was not closed ({detail}); end it with a line of three backticks.",
    "syntax_error": "Your code is not valid Python: {detail}.",
    "no_model_new": "Your code does not define `class ModelNew`.",
}
# What the sandbox caught at run time (``error_kind="rule_violation"``, named in ``flags``), in words.
RUNTIME_VIOLATIONS = {
    "disallowed_build_argument": ("passed load_inline/load a compiler or linker argument that is not allowed",
                                  "Use only optimisation, target and macro flags; no include or library paths, "
                                  "build directories, wrappers or linker options."),
    "input_modified": ("modified an input tensor in place", "Leave the inputs unchanged; write into new outputs."),
    "output_aliases_input": ("returned an output that shares memory with an input",
                             "Return freshly allocated outputs, not the inputs or views of them."),
    "output_aliases_output": ("returned outputs that share memory with each other",
                              "Give every output its own memory."),
    "stale_output": ("returned, from a timed call, an output that differs from fresh work (a cached or stale "
                     "result)", "Compute every call's output from its own inputs; do not cache results."),
    "forged_message": ("wrote to the evaluator's channel (a message that was not the protocol's)",
                       "Do not write to the evaluator's file descriptors or streams."),
    "host_poison_disabled": ("turned off the evaluator's poison of fresh host memory (glibc's M_PERTURB) during "
                             "a correctness call, which hides outputs left unwritten",
                             "Leave the allocator's settings alone and write every element of every output."),
    "degenerate_check": ("made the correctness check degenerate",
                         "Return real outputs of the right shape and values; the check must be able to fail."),
}
_FORMAT_REMINDER = ("Answer with a brief summary of your approach followed by exactly one ```python code block "
                    "that defines class ModelNew.")


def trim_log(log: str | None, limit: int) -> str:
    """The part of a compiler/runtime log a person would read first: the first error lines.

    Build-tool noise (ninja progress, FAILED lines, compiler command lines) is dropped and
    absolute paths are cut to file names; the text starts two lines before the first diagnostic
    that says "error" and keeps ``limit`` characters. The full log stays in the evaluator record.
    """
    if not log:
        return ""
    lines = [_LONG_PATH.sub(r"\1", line) for line in log.strip().splitlines() if not _BUILD_NOISE.match(line)]
    first = 0
    for pattern in _FIRST_ERROR:
        hit = next((i for i, line in enumerate(lines) if pattern.search(line)), None)
        if hit is not None:
            first = hit
            break
    text = "\n".join(lines[max(0, first - 2):]).strip()
    if len(text) > limit:
        text = text[:limit].rstrip() + "\n... (truncated)"
    return text


def parse_feedback(parsed: Parsed) -> str:
    hint = _PARSE_HINTS.get(parsed.error_kind or "", "Your response could not be used ({detail}).")
    return f"{hint.format(detail=parsed.error)} {_FORMAT_REMINDER}"


def rules_feedback(violations: Sequence[Violation]) -> str:
    lines = ["Your answer was rejected (score 0) because it breaks these rules:"]
    for name in dict.fromkeys(v.rule for v in violations):
        reasons = "; ".join(v.reason for v in violations if v.rule == name)
        lines.append(f"- {name}: {RULES[name].description} ({reasons})")
    lines.append("Write the computation as your own kernel and call it from ModelNew.forward.")
    return "\n".join(lines)


def _runtime(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms:.4g} ms"


def result_feedback(result: SandboxResult, log_chars: int, score: float, note: str = "") -> str:
    """Feedback from the sandbox verdict."""
    kind = result.error_kind
    log = trim_log(result.error, log_chars)
    if kind == "rule_violation":  # whatever else the verdict says
        return runtime_violation_feedback(result, log)
    if result.correct:
        if not result.timed or result.speedup is None:
            return (f"Your kernel is correct ({result.trials_passed}/{result.trials} trials). It was not timed on "
                    f"this backend, so it earned the correctness credit only (score {score:.3g}). Keep it correct "
                    "and make it as fast as you can.")
        faster = "faster than" if result.speedup >= 1.0 else "slower than"
        text = (f"Your kernel is correct ({result.trials_passed}/{result.trials} trials) and {faster} the reference: "
                f"{_runtime(result.new_runtime_ms)} vs {_runtime(result.ref_runtime_ms)}, speedup "
                f"{result.speedup:.3g}x (score {score:.3g}).")
        if note:
            text += f" Note: {note}."
        return text + " Make it faster: fuse more work, improve memory access, or use a better algorithm."
    if kind in ("compile_error", "compile_timeout"):
        what = "Compilation timed out" if kind == "compile_timeout" else "Your kernel failed to compile"
        return f"{what}. First errors:\n{log}\nFix the errors and answer with the corrected code."
    if kind == "load_error":
        return f"Your module failed to load:\n{log}\nMake sure it imports cleanly and defines ModelNew."
    if kind == "wrong_output":
        where = f"output {result.which_output}" if result.which_output is not None else "the output"
        errs = []
        if result.max_abs_err is not None:
            errs.append(f"max abs error {result.max_abs_err:.3g}")
        if result.max_rel_err is not None:
            errs.append(f"max rel error {result.max_rel_err:.3g}")
        detail = f" ({', '.join(errs)})" if errs else ""
        why = f"\n{log}" if log else ""
        return (f"Your kernel ran but {where} is wrong{detail}; {result.trials_passed}/{result.trials} trials "
                f"passed.{why}\nCheck indexing, boundary handling, reduction axes and shapes.")
    if kind == "timeout":
        return ("Your kernel did not finish within the time limit: it never ends (a loop whose bound or exit "
                f"condition is wrong, a wait that is never met) or it is far too slow.\n{log}").rstrip()
    if kind == "memory_limit":
        return "Your kernel exceeded the memory limit of an evaluation."
    if kind == "runtime_error":
        return f"Your kernel crashed at run time:\n{log}\nFix the error and answer with the corrected code."
    if kind in ("reference_error", "sandbox_error"):
        return (f"The evaluator failed on this attempt ({kind}); this was not necessarily your fault:\n{log}\n"
                "Answer again with your best kernel.")
    return f"Your kernel was not correct ({kind or 'unknown'}).\n{log}".rstrip()


def runtime_violations(result: SandboxResult) -> list[str]:
    """The run-time violations a verdict names (its flags that are :data:`RUNTIME_VIOLATIONS`)."""
    return [f for f in result.flags if f in RUNTIME_VIOLATIONS]


def runtime_violation_feedback(result: SandboxResult, log: str) -> str:
    names = runtime_violations(result)
    lines = ["Your answer was rejected (score 0): the evaluator caught it breaking the evaluation protocol "
             "at run time."]
    for name in names:
        what, fix = RUNTIME_VIOLATIONS[name]
        lines.append(f"- {name}: it {what}. {fix}")
    if not names:
        lines.append(f"- {', '.join(result.flags) or 'unnamed violation'}")
    if log:
        lines.append(log)
    lines.append("Write the computation as your own kernel and call it from ModelNew.forward.")
    return "\n".join(lines)
