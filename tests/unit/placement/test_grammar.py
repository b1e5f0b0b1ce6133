"""The component_placement grammar, against expectations written from RLinf's documented text."""

from __future__ import annotations

import pytest

from rltrain.errors import PlacementError
from rltrain.placement import grammar


def resolve(text: str, num_resources: int, uneven_ok: bool = False) -> list[tuple[int, ...]]:
    entry = grammar.parse_entry("actor", text)
    return grammar.resolve(entry, num_resources, f"{num_resources} resources", uneven_ok)


def test_one_process_per_resource_when_process_ranks_are_omitted():
    # "0-4 means process 0-4 will be assigned to resource ranks 0-4 respectively"
    assert resolve("0-4", 8) == [(0,), (1,), (2,), (3,), (4,)]


def test_processes_share_resources_evenly():
    # "0-3:0-7 means process 0-7 will be evenly assigned to resource ranks 0-3, 2 per resource"
    assert resolve("0-3:0-7", 4) == [(0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,)]


def test_fewer_processes_than_resources_split_the_resources():
    # "If the number of processes is smaller ... one process occupy multiple resources"
    assert resolve("0-7:0-3", 8) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_mixed_parts_continue_process_ranks_implicitly():
    # "0-1:0-3,3-5,7-10:7-14": procs 0-3 on 0-1, procs 4-6 on 3-5, procs 7-14 on 7-10
    expected = [(0,), (0,), (1,), (1,), (3,), (4,), (5,)] + [
        (r,) for r in (7, 7, 8, 8, 9, 9, 10, 10)
    ]
    assert resolve("0-1:0-3,3-5,7-10:7-14", 11) == expected


def test_all_means_every_resource_and_single_ranks_work():
    assert resolve("all", 3) == [(0,), (1,), (2,)]
    assert resolve("ALL", 3) == resolve("All", 3) == [(0,), (1,), (2,)]  # RLinf: any case
    assert resolve("5", 8) == [(5,)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # RLinf strips every part and skips empty ones: a trailing comma is harmless.
        (" 0-1 , 4-5 ,", [(0,), (1,), (4,), (5,)]),
        (" 2 - 3 ", [(2,), (3,)]),
        ("0 - 1 : 0 - 3", [(0,), (0,), (1,), (1,)]),
        (",0,,1,", [(0,), (1,)]),
        ("\t0-1\n", [(0,), (1,)]),
        ("007", [(7,)]),  # leading zeros are still ASCII digits
    ],
)
def test_whitespace_and_empty_parts_are_ignored_as_in_rlinf(text, expected):
    assert resolve(text, 8) == expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        # Before: '0 1' and '0_1' became device 1, '٣' device 3, '1 0' was reported as '10'.
        ("0 1", "whitespace cannot separate digits"),
        ("1 0", "whitespace cannot separate digits"),
        ("0_1", "an underscore cannot separate digits"),
        ("٣", "'٣' is not an ASCII digit"),
        ("0-３", "is not an ASCII digit"),  # a full-width 3
        ("+1", "not a rank spec"),
        ("-1", "not a rank spec"),
        ("1.0", "not a rank spec"),
    ],
)
def test_numbers_are_ascii_digits_and_nothing_else(text, needle):
    with pytest.raises(PlacementError) as err:
        resolve(text, 8)
    msg = str(err.value)
    assert needle in msg
    assert f"component_placement['actor']={text!r}" in msg  # the string exactly as given


def test_errors_quote_the_string_exactly_as_given():
    with pytest.raises(PlacementError, match=r"\['actor'\]=' 0-1 , 9 ,': part '9' asks"):
        resolve(" 0-1 , 9 ,", 8)


def test_parts_may_go_backwards_over_resources_keeping_rank_order():
    # An rltrain extension (RLinf wants ascending parts): ranks follow the parts' order.
    assert resolve("4-5,0-1", 6) == [(4,), (5,), (0,), (1,)]


def test_explicit_process_ranks_may_come_in_any_order_if_they_cover_0_to_n():
    assert resolve("2-3:2-3,0-1:0-1", 4) == [(0,), (1,), (2,), (3,)]


def test_an_implicit_part_continues_after_the_highest_rank_so_far():
    # RLinf's rule: "2-3:2-3,0-1:0-1,4-5" -> processes 4-5 on resources 4-5.
    assert resolve("2-3:2-3,0-1:0-1,4-5", 6)[4:] == [(4,), (5,)]


@pytest.mark.parametrize(
    ("text", "n", "first", "again", "alternatives"),
    [
        # the examples: 4 processes on devices 0,1,1,2; 9 processes on 8 devices
        ("0-1,1-2", 4, "0-1", "1-2", ["'0-1:0-3' (4 processes, 2 per resource)", "'0-3'"]),
        ("all,0", 8, "all", "0", ["'0-2:0-8' (9 processes, 3 per resource)", "'0-7'"]),
        # even, yet still one resource in two parts: written as one part instead
        ("0-1:0-1,0-1:2-3", 4, "0-1:0-1", "0-1:2-3", ["'0-1:0-3'"]),
        ("0-3:0-7,2-5:8-11", 8, "0-3:0-7", "2-5:8-11", ["'0-5:0-11' (12 processes, 2 per"]),
    ],
)
def test_two_parts_never_name_one_resource(text, n, first, again, alternatives):
    with pytest.raises(PlacementError) as err:
        resolve(text, n)
    msg = str(err.value)
    assert f"parts {first!r} and {again!r} both name resource" in msg
    for alt in alternatives:
        assert alt in msg


def test_parts_with_different_but_even_sharing_are_accepted_as_in_rlinf():
    # Each part shares its own resources evenly; no resource is in two parts.
    assert resolve("0:0-1,1", 2) == [(0,), (0,), (1,)]


def test_even_alternatives_by_hand():
    # 4 processes near resources 0,1,2 of 4: share 0-1 two each, or one each on 0-3
    assert grammar.even_alternatives([0, 1, 1, 2], 4, 4) == [
        ("0-1:0-3", "4 processes, 2 per resource"),
        ("0-3", "4 processes, one per resource"),
    ]
    # 7 processes (prime) on 3 resources from 5 of 8: all on 5, or resources 5-7 once each
    assert grammar.even_alternatives([5, 6, 7], 7, 8) == [
        ("5:0-6", "7 processes, 7 per resource"),
        ("5-7", "3 processes, one per resource"),
    ]
    assert grammar.even_alternatives([2, 3], 2, 4) == [("2-3", "2 processes, one per resource")]


def test_node_placement_may_be_uneven_as_in_the_seed_example():
    # RLinf: "agent occupies nodes 0-1 for process 0-200, and nodes 2-3 for process 201-511"
    out = resolve("0-1:0-200,2-3:201-511", 4, uneven_ok=True)
    assert len(out) == 512
    counts = [sum(1 for rs in out if rs == (n,)) for n in range(4)]
    assert counts == [101, 100, 156, 155]  # 201 = 101 + 100; 311 = 156 + 155
    assert out[100] == (0,) and out[101] == (1,) and out[201] == (2,) and out[357] == (3,)


@pytest.mark.parametrize(
    ("text", "n", "needle"),
    [
        ("0-3:0-6", 4, "do not share evenly"),
        ("0-7:0-2", 8, "not even"),
        ("0-3:1-4", 4, "ranks [0] are missing"),
        ("0-1:0-1,2-3:1-2", 4, "process rank 1 is placed twice"),
        ("0-8", 8, "asks for resource 8"),
        ("3-1", 8, "not a rank range (needs a <= b): write '1-3'"),
        ("a-b", 8, "not a rank spec"),
        ("0:all", 8, "process ranks cannot be 'all'"),
        ("0:1:2", 8, "more than one ':'"),
        (" , ", 8, "the placement is empty"),
        ("0-1:2-3,2-3", 4, "ranks [0, 1] are missing"),
        ("0-1:", 8, "no process ranks"),
        ("", 8, "empty"),
        ("all", 0, "no resources"),
    ],
)
def test_bad_strings_name_the_component_string_part_and_fix(text: str, n: int, needle: str):
    with pytest.raises(PlacementError) as err:
        resolve(text, n)
    msg = str(err.value)
    assert needle in msg
    assert "actor" in msg


def test_placement_error_is_a_value_error():
    with pytest.raises(ValueError):
        resolve("0-9", 2)


def test_integer_values_from_yaml_are_placements():
    entry = grammar.parse_entry("rollout", 1)
    assert grammar.resolve(entry, 2, "2 devices") == [(1,)]


def test_node_group_forms_string_and_list_keep_order():
    a = grammar.parse_entry("env", {"node_group": "b, a", "placement": "0-3"})
    b = grammar.parse_entry("env", {"node_group": ["b", "a"], "placement": "0-3"})
    assert a.node_groups == b.node_groups == ("b", "a")


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("actor,actor", "0", "distinct component names"),
        ("actor,", "0", "distinct component names"),
        ("env", {"node_group": "a"}, "'placement' (required)"),
        ("env", {"placement": "0", "nodes": "a"}, "'placement' (required)"),
        ("env", {"placement": "0", "node_group": "a,a"}, "lists a group twice"),
        ("env", {"placement": "0", "node_group": ""}, "empty label"),
        ("env", 1.5, "a placement is a string"),
    ],
)
def test_bad_entries(key, value, needle):
    with pytest.raises(PlacementError, match=None) as err:
        grammar.parse_entry(key, value)
    assert needle in str(err.value)


def test_components_listed_together_share_and_a_component_is_placed_once():
    entries = grammar.parse_component_placement({"actor,rollout": "all", "reward": "0"})
    assert [e.components for e in entries] == [("actor", "rollout"), ("reward",)]
    with pytest.raises(PlacementError, match="'actor' is placed twice"):
        grammar.parse_component_placement({"actor,rollout": "all", "actor": "0"})
    with pytest.raises(PlacementError, match="empty"):
        grammar.parse_component_placement({})


@pytest.mark.parametrize("text", ["0:0-9999999", "0-1:0-100000", "0:0-49999,1:50000-100000"])
def test_a_process_count_beyond_any_job_is_refused_at_once(text):
    # 10^7 processes used to be spread one tuple each and die with MemoryError after a minute
    with pytest.raises(PlacementError) as err:
        resolve(text, 2, uneven_ok=True)
    msg = str(err.value)
    assert msg.startswith(f"component_placement['actor']={text!r}: process ranks up to ")
    assert "at most 100,000 processes per component" in msg


def test_the_largest_allowed_process_count_resolves():
    assert len(resolve("0-1:0-99999", 2)) == grammar.MAX_PROCESSES
