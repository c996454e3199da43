"""The message a model's own run-time check gives, read from its source: under torch.export a
check (`torch._check(cond, lambda: "...")`, transformers' `torch_compilable_check(cond, "...")`)
leaves only torch.export's assert of its condition in the graph ("Runtime assertion failed for
expression Eq(u0, 1) on node 'eq_9'"), transformers passes no message at all while tracing, but
the node keeps its model source line (capture.provenance). `check_text(path, line)` finds the
check call whose statement holds that line and returns its message when it is a string literal
(or a lambda returning one); the capture's `check` ops (ops/check.py) say it where PyTorch would."""
from __future__ import annotations

import ast
from functools import lru_cache
from typing import Optional

#: the last name of the functions taken as checks: torch._check, torch._check_with,
#: torch._check_value, torch._check_index, torch._check_tensor_all(_with), transformers' own
CHECK_CALLS = ("_check", "_check_with", "_check_value", "_check_index", "_check_tensor_all",
               "_check_tensor_all_with", "torch_compilable_check")


@lru_cache(maxsize=64)
def _tree(path: str) -> Optional[ast.Module]:
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _literal(arg: ast.expr) -> Optional[str]:
    """A string constant, or the constant a lambda of no arguments returns."""
    if isinstance(arg, ast.Lambda) and not arg.args.args:
        arg = arg.body
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value else None


def check_text(path: str, line: int) -> Optional[str]:
    """The message of the check call (CHECK_CALLS) in the statement of file `path` spanning `line`,
    when it is a string literal; None otherwise (no such call, no file, no literal)."""
    tree = _tree(path)
    if tree is None:
        return None
    stmts = [s for s in ast.walk(tree) if isinstance(s, ast.stmt) and not hasattr(s, "body")
             and s.lineno <= line <= (s.end_lineno or s.lineno)]
    for stmt in stmts:
        for call in ast.walk(stmt):
            if isinstance(call, ast.Call) and _name(call.func) in CHECK_CALLS:
                args = list(call.args[1:]) + [k.value for k in call.keywords if k.arg in ("msg", "message")]
                texts = [t for t in map(_literal, args) if t is not None]
                if texts:
                    return texts[0]
    return None
