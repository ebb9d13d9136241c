"""Load a policy YAML file and report every mistake as `file:line: problem -- fix`.

Line numbers come from the composed YAML node tree: each error location such as
('cohorts', 1, 'budgets', 2) is walked through the nodes to the line that holds it.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from policies.head import HeadCapacity
from policies.problems import Loc, PolicyError, Problem
from policies.pydantic_errors import problems_from_validation_error
from policies.schema import Policy, policy_problems


def _line_of(root: yaml.Node, loc: Loc) -> int:
    """1-based line of the deepest node on `loc` that exists (a missing key points at its parent)."""
    node, line = root, root.start_mark.line
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line
        else:
            break
    return line + 1


def _duplicate_key_problems(node: yaml.Node, loc: Loc = ()) -> list[tuple[Problem, int]]:
    # PyYAML silently keeps the last of two equal keys; an operator editing the file would not notice.
    found: list[tuple[Problem, int]] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if key.value in seen:
                where = ".".join(str(p) for p in loc) or "the top level"
                found.append(
                    (
                        Problem(loc + (key.value,), f"key '{key.value}' appears twice in {where}", "keep one of them"),
                        key.start_mark.line + 1,
                    )
                )
            seen.add(key.value)
            found.extend(_duplicate_key_problems(value, loc + (key.value,)))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found.extend(_duplicate_key_problems(item, loc + (i,)))
    return found


def parse_policy_text(text: str, source: str = "<policy>", head: HeadCapacity | None = None) -> Policy:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        column = mark.column + 1 if mark else 1
        context = f" ({exc.context})" if exc.context else ""
        raise PolicyError(
            [
                Problem(
                    (),
                    f"malformed YAML: {exc.problem}{context}",
                    f"fix the YAML syntax at line {line}, column {column}",
                    source,
                    line,
                )
            ]
        ) from None
    if root is None:
        raise PolicyError([Problem((), "the policy file is empty", "start from policies/default.yaml", source, 1)])
    duplicates = _duplicate_key_problems(root)
    if duplicates:
        raise PolicyError([problem.located(source, line) for problem, line in duplicates])
    data = yaml.safe_load(text)
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation_error(Policy, exc)
    else:
        problems = policy_problems(policy, head)
    if problems:
        raise PolicyError([p.located(source, _line_of(root, p.loc)) for p in problems])
    return policy


def load_policy(path: str | Path, head: HeadCapacity | None = None) -> Policy:
    """Load and fully validate a policy file; raises PolicyError listing every problem."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PolicyError(
            [
                Problem(
                    (),
                    f"cannot read the policy file ({exc.strerror})",
                    "check the path and its permissions",
                    str(path),
                    1,
                )
            ]
        ) from None
    return parse_policy_text(text, str(path), head)
