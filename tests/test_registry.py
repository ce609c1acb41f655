"""The registry's own contract on a two-entry table: its refusals and their one-line messages,
the doc, ``names(exclude)``, ``choice`` and what a ``Choice`` value selects."""

from __future__ import annotations

from typing import Annotated, Literal, get_args, get_origin

import pytest

from proxrl.registry import Choice, Registry, UnknownName


def colours() -> Registry[int]:
    table: Registry[int] = Registry("colour")
    table.add("red", 1, "the warm one")
    table.add("green", 2, "the cool one", knobs=("shade",), bright=True)
    return table


def test_an_unknown_name_names_the_kind_the_choices_and_the_closest():
    with pytest.raises(UnknownName) as refused:
        colours()["gren"]
    message = "unknown colour 'gren'; expected one of ('red', 'green'); did you mean green?"
    assert str(refused.value) == message
    assert refused.value.args == (message,)
    assert isinstance(refused.value, KeyError) and isinstance(refused.value, ValueError)


def test_an_unknown_name_with_no_close_one_offers_no_guess():
    with pytest.raises(UnknownName) as refused:
        colours().knobs("blue")
    assert str(refused.value) == "unknown colour 'blue'; expected one of ('red', 'green')"


def test_a_name_registered_twice_is_refused():
    with pytest.raises(ValueError) as refused:
        colours().add("red", 3, "another red")
    assert str(refused.value) == "colour 'red' is registered twice"


@pytest.mark.parametrize("doc", ["", "two\nlines"])
def test_a_doc_that_is_not_one_non_empty_line_is_refused(doc):
    table = colours()
    with pytest.raises(ValueError) as refused:
        table.add("blue", 3, doc)
    assert str(refused.value) == "colour 'blue': the doc is one non-empty line"
    assert "blue" not in table


def test_doc_knobs_and_traits_are_the_registered_ones():
    table = colours()
    assert (table.doc("red"), table.doc("green")) == ("the warm one", "the cool one")
    assert (table.knobs("red"), table.knobs("green")) == ((), ("shade",))
    assert (table.trait("red", "bright"), table.trait("green", "bright")) == (False, True)
    assert table.having("bright") == ("green",)


def test_names_leave_out_the_excluded_and_refuse_a_typo_in_exclude():
    table = colours()
    assert table.names() == ("red", "green")
    assert table.names(exclude=("red",)) == ("green",)
    with pytest.raises(UnknownName, match="did you mean red"):
        table.names(exclude=("rde",))


def test_choice_offers_off_names_entries_and_aliases_and_refuses_a_bad_alias():
    field = colours().choice(off=("none",), aliases={"verde": "green"})
    assert get_origin(field) is Annotated
    literal, marker = get_args(field)
    assert literal == Literal["none", "red", "green", "verde"]
    assert isinstance(marker, Choice) and marker.spellings == (("verde", "green"),)
    with pytest.raises(UnknownName, match="unknown colour 'gren'"):
        colours().choice(aliases={"verde": "gren"})


def test_a_choice_selects_each_item_of_a_list_through_its_aliases():
    """A name, an alias (the entry it spells), a list or tuple (each item: ``report_to``); an
    off name and an unknown value select nothing."""
    marker = Choice(colours(), off=("none",), spellings=(("verde", "green"),))
    assert marker.selected("red") == ("red",)
    assert marker.selected("verde") == ("green",)
    assert marker.selected(("red", "verde")) == ("red", "green")
    assert marker.selected(["green", "none"]) == ("green",)
    assert marker.selected("none") == ()
