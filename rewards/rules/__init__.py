"""Anti-hack and format rules. Rules are data: a name, a description and a check.

A check takes the analysed answer (:class:`rewards.rules.analysis.Answer`) and the rule settings and
returns human-readable reasons (empty = the answer passes). Any violation scores 0 and the rule
name is recorded (``hack/<rule>`` in the metrics). Checks are AST-based; a string search is used
only for code that lives in string literals (the C++/CUDA sources given to ``load_inline``).
"""
from __future__ import annotations

from collections.abc import Sequence

from rewards.rules.analysis import Answer
from rewards.rules.base import Rule, RuleSettings, Violation
from rewards.rules.build import check_build_arguments
from rewards.rules.caching import check_result_cache
from rewards.rules.compute import COMPUTE_METHODS, check_extension_compute, check_torch_compute
from rewards.rules.escape import (check_dynamic_code, check_environment, check_file_or_network,
                                  check_inherits_reference, check_monkey_patching, check_processes,
                                  check_reference_access, check_streams, check_try_except)
from rewards.rules.format import check_kernel, check_model_new

__all__ = ["COMPUTE_METHODS", "RULES", "Answer", "Rule", "RuleSettings", "Violation", "check_rules"]

RULES: dict[str, Rule] = {r.name: r for r in [
    Rule("no_model_new", "The answer must define class ModelNew.", check_model_new),
    Rule("no_kernel", "The answer must contain a kernel for its backend (cuda: __global__ + load_inline; "
         "triton: @triton.jit; cpu: C++ through load_inline) and ModelNew.forward must call it.", check_kernel),
    Rule("torch_compute_in_forward", "ModelNew.forward and the helpers it calls may allocate and reshape "
         "tensors but must not compute with torch ops, torch.nn layers, torch.nn.functional, tensor "
         "methods or tensor arithmetic.", check_torch_compute),
    Rule("torch_compute_in_extension", "The C++/CUDA sources may allocate tensors and query their shape but "
         "must not call ATen/torch compute (torch::matmul, at::softmax, x.sum(), ...).", check_extension_compute),
    Rule("try_except", "No try/except: a fallback would hide a failing kernel.", check_try_except),
    Rule("inherits_reference", "ModelNew must not subclass or alias the reference Model.",
         check_inherits_reference),
    Rule("threads_or_processes", "No threads, process pools, subprocesses or os.system.", check_processes),
    Rule("cuda_streams", "No extra CUDA streams or graphs: all work must run on the timed stream.",
         check_streams),
    Rule("monkey_patching", "No rebinding of library or module attributes (timers, torch functions, "
         "CUDA events).", check_monkey_patching),
    Rule("file_or_network", "No file or network access (open, sockets, HTTP, pathlib writes, "
         "torch.save/load).", check_file_or_network),
    Rule("environment_access", "No reading or changing environment variables.", check_environment),
    Rule("dynamic_code", "No eval/exec/compile/__import__, getattr on modules or star imports: they hide "
         "code from these checks.", check_dynamic_code),
    Rule("reference_access", "No use of the reference Model, the harness's inputs, or the interpreter's "
         "internals (sys.modules, frames, gc, importlib, __main__).", check_reference_access),
    Rule("build_arguments", "load_inline/load compiler and linker flags must be on the sandbox's allowlist "
         "(optimisation and target flags, -D/-U macros, warnings, nvcc arch/ptxas/fast-math options, -l for CUDA "
         "math libraries, OpenMP); no include or library paths, build directories, wrappers, plugins, "
         "response files or linker options.", check_build_arguments),
    Rule("result_cache", "ModelNew must compute every call: no caching of results keyed by an input tensor's "
         "identity or values (data_ptr, id, hash, item, tolist, the tensor itself) and no functools cache "
         "around code given inputs.", check_result_cache),
]}


def check_rules(code: str, backend: str, enabled: Sequence[str], settings: RuleSettings,
                max_reasons: int = 3) -> list[Violation]:
    """All violations of the enabled rules, in rule order. ``code`` must be valid Python."""
    unknown = [n for n in enabled if n not in RULES]
    if unknown:
        raise ValueError(f"unknown rule(s) {unknown} in reward.rules.enabled; known: {', '.join(RULES)}")
    answer = Answer.from_source(code, backend)
    out: list[Violation] = []
    for name in RULES:
        if name in enabled:
            for reason in RULES[name].check(answer, settings)[:max_reasons]:
                out.append(Violation(name, reason))
    return out
