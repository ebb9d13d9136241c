"""Hypothesis strategies for pushed tables (flat keys) of a given server policy: the valid ones, and
ones broken in a way every server must refuse. Shared by the in-process fuzz and the real server's."""

from __future__ import annotations

from hypothesis import strategies as st

from policies.head import HeadCapacity
from policies.schema import MAX_TTL_S, Policy


def valid_tables(policy: Policy, head: HeadCapacity, ttl_s=st.floats(min_value=0.001, max_value=MAX_TTL_S)):
    """A table the policy allows: each cohort a candidate budget, a probe of another candidate or none,
    codes in range, widths within the head's, a finite ttl in (0, MAX_TTL_S]."""

    @st.composite
    def tables(draw) -> dict:
        flat: dict = {"jetspec_policy.ttl_s": draw(ttl_s)}
        for cohort in policy.cohorts:
            prefix = f"jetspec_policy.{cohort.name}."
            budget = draw(st.sampled_from(cohort.budgets))
            flat[prefix + "budget"] = budget
            for field, top in (
                ("drafter", 1),
                ("tree_sizing", 1),
                ("sampled_children", 1),
                ("tree_width", head.tree_width),
            ):
                if draw(st.booleans()):
                    flat[prefix + field] = draw(st.integers(0, top))
            others = [b for b in cohort.budgets if b != budget]
            if others and draw(st.booleans()):
                flat[prefix + "probe_budget"] = draw(st.sampled_from(others))
                flat[prefix + "probe_share"] = draw(st.floats(min_value=0.001, max_value=policy.gate.probe_share))
        return flat

    return tables()


def broken_tables(
    policy: Policy, head: HeadCapacity, json_types: bool = True, ttl_s=st.floats(min_value=0.001, max_value=MAX_TTL_S)
):
    """A valid table with one value out of its field's range, or of a type the field never takes (with
    `json_types`: also null, booleans, strings, arrays -- SGLang's own request type converts or refuses
    those before a plugin sees them), or an unknown key added."""
    widest = head.tree_width

    @st.composite
    def tables(draw) -> dict:
        flat = draw(valid_tables(policy, head, ttl_s))
        key = draw(st.sampled_from(sorted(flat)))
        field = key.rpartition(".")[2]
        real = field in ("ttl_s", "probe_share")
        out_of_range = {
            "ttl_s": st.sampled_from([0.0, -1.0, MAX_TTL_S * 2, 1e308]),
            "probe_share": st.sampled_from([0.0, -0.1, 0.9]),
            "budget": st.integers(1, 10**6).filter(lambda b: all(b not in c.budgets for c in policy.cohorts)),
            "probe_budget": st.integers(1, 10**6).filter(lambda b: all(b not in c.budgets for c in policy.cohorts)),
            "tree_width": st.integers(widest + 1, 10**6),
            "draft_rounds": st.integers(policy.head.max_draft_rounds + 1, 10**6),
            "drafter": st.integers(2, 10**6),
            "tree_sizing": st.integers(2, 10**6),
            "sampled_children": st.integers(2, 10**6),
        }[field]
        wrong = [out_of_range, st.just(-1 if not real else float("nan"))]
        if not real:
            wrong.append(st.sampled_from([0.5, 1.5, 4.25]))  # a fraction where an integer belongs
        if json_types:
            wrong += [st.none(), st.booleans(), st.text(max_size=4), st.lists(st.integers(), max_size=2)]
        choice = draw(st.integers(0, 2))
        if choice == 0:
            flat[key] = draw(st.one_of(wrong))
        elif choice == 1:
            flat[draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in flat))] = 4
        else:  # a cohort's budget left out
            flat.pop(f"jetspec_policy.{draw(st.sampled_from([c.name for c in policy.cohorts]))}.budget")
        return flat

    return tables()
