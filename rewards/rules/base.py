"""Rule records, their settings, and small AST helpers shared by the checks."""
from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rewards.rules.analysis import Answer

if TYPE_CHECKING:
    from rewards.config import RulesConfig


@dataclass(frozen=True)
class RuleSettings:
    allowed_torch_calls: frozenset[str]      # dotted names; "prefix.*" allows a whole namespace
    allowed_tensor_methods: frozenset[str]   # method names allowed on tensors in forward (and in C++)
    allowed_extension_calls: frozenset[str]  # torch::/at:: names C++/CUDA sources may call; "ns::*" too

    @classmethod
    def from_config(cls, rules_cfg: RulesConfig) -> "RuleSettings":
        return cls(frozenset(rules_cfg.allowed_torch_calls), frozenset(rules_cfg.allowed_tensor_methods),
                   frozenset(rules_cfg.allowed_extension_calls))

    def torch_call_allowed(self, name: str) -> bool:
        return _allowed(name, self.allowed_torch_calls, ".")

    def extension_call_allowed(self, name: str) -> bool:
        return _allowed(name, self.allowed_extension_calls, "::")


def _allowed(name: str, allowed: frozenset[str], sep: str) -> bool:
    if name in allowed:
        return True
    star = f"{sep}*"
    return any(p.endswith(star) and name.startswith(p[:-1]) for p in allowed)


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    check: Callable[[Answer, RuleSettings], list[str]]


@dataclass(frozen=True)
class Violation:
    rule: str
    reason: str


def line_of(node: ast.AST) -> str:
    return f"line {getattr(node, 'lineno', '?')}"


def calls_in(nodes: Iterable[ast.AST]) -> Iterable[ast.Call]:
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Call):
                yield node
