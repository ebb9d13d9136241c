"""The verify-width ladder: parsing JETSPEC_VERIFY_WIDTHS, the cap at the reserved width, and the rung a
step's largest tree is padded to."""

from __future__ import annotations

import pytest

from sglang_jetspec.core.verify_widths import WIDTHS_ENV, VerifyWidths, VerifyWidthsError


def test_unset_or_empty_means_no_padding():
    for text in (None, "", "  "):
        widths = VerifyWidths.parse(text, reserved=16)
        assert not widths.pads and [widths.width_for(n) for n in (1, 5, 16)] == [1, 5, 16]


def test_the_ladder_is_capped_by_the_reserved_width_which_is_always_the_top_rung():
    assert VerifyWidths.parse("4,8,16,32,64", reserved=16).rungs == (4, 8, 16)
    assert VerifyWidths.parse("64, 4,8 ,32", reserved=24).rungs == (4, 8, 24)  # unsorted, spaces, 24 not a rung
    assert VerifyWidths.parse("4,8,16,32,64", reserved=256).rungs == (4, 8, 16, 32, 64, 256)
    assert VerifyWidths.parse("8", reserved=4).rungs == (4,)


def test_a_step_pads_to_the_smallest_rung_that_holds_its_largest_tree_and_roots_stay_a_decode():
    widths = VerifyWidths.parse("4,8,16", reserved=16)
    assert [widths.width_for(n) for n in (1, 2, 4, 5, 8, 9, 16)] == [1, 4, 4, 8, 8, 16, 16]
    with pytest.raises(ValueError, match="exceed the widest verify width 16"):
        widths.width_for(17)
    with pytest.raises(ValueError, match="at least its roots"):
        widths.width_for(0)


@pytest.mark.parametrize("text", ["4,eight", "4,,8", "1,4", "-4", "4.5"])
def test_a_malformed_ladder_names_the_variable_the_bad_part_and_the_fix(text):
    with pytest.raises(VerifyWidthsError, match=rf"{WIDTHS_ENV}=.*is not a width.*e\.g\. 4,8,16,32,64"):
        VerifyWidths.parse(text, reserved=16)
