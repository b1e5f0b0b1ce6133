"""Device slices for concurrent jobs: hand-computed expectations (pure logic, no Ray)."""

from __future__ import annotations

from hydra_plugins.rltrain_launcher._slices import DeviceSlice, SliceAllocator


def test_planned_devices_are_kept_when_free():
    alloc = SliceAllocator({0: 4})
    piece = alloc.allocate({(0, 1), (0, 2)})
    assert piece == DeviceSlice((((0, 1), (0, 1)), ((0, 2), (0, 2))))
    assert alloc.free == {(0, 0), (0, 3)}


def test_second_job_with_the_same_plan_lands_on_the_free_devices_in_order():
    alloc = SliceAllocator({0: 4})
    first = alloc.allocate({(0, 0), (0, 1)})
    second = alloc.allocate({(0, 0), (0, 1)})
    assert first is not None and second is not None
    assert second.mapping == (((0, 0), (0, 2)), ((0, 1), (0, 3)))
    assert first.devices.isdisjoint(second.devices)
    assert alloc.allocate({(0, 0)}) is None  # full: the third job waits
    alloc.release(first)
    assert alloc.allocate({(0, 0)}) == DeviceSlice((((0, 0), (0, 0)),))


def test_job_nodes_go_to_distinct_cluster_nodes_best_fit():
    # Node 0 has 1 free device left, node 1 has 4, node 2 has 2.
    alloc = SliceAllocator({0: 4, 1: 4, 2: 2})
    assert alloc.allocate({(0, 0), (0, 1), (0, 2)}) is not None  # takes 0-2 of node 0
    # A two-node job: job node 0 needs 2 (its own node 0 is too full) -> best fit node 2;
    # job node 1 needs 1 -> its own node 1 (planned device 0 free there).
    piece = alloc.allocate({(0, 0), (0, 1), (1, 0)})
    assert piece is not None
    assert piece.node_map() == {0: 2, 1: 1}
    assert piece.devices == {(2, 0), (2, 1), (1, 0)}


def test_two_job_nodes_never_share_a_cluster_node():
    alloc = SliceAllocator({0: 4})
    assert alloc.allocate({(0, 0), (1, 0)}) is None
    reason = alloc.never_fits({(0, 0), (1, 0)})
    assert reason is not None
    assert "1 on job node 0, 1 on job node 1" in reason and "node 0: 4" in reason


def test_never_fits_ignores_what_is_running_now():
    alloc = SliceAllocator({0: 2})
    alloc.allocate({(0, 0), (0, 1)})
    assert alloc.allocate({(0, 0)}) is None
    assert alloc.never_fits({(0, 0)}) is None
    assert alloc.never_fits({(0, d) for d in range(3)}) is not None


def test_jobs_without_devices_take_an_empty_slice():
    alloc = SliceAllocator({})
    piece = alloc.allocate(frozenset())
    assert piece == DeviceSlice()
    assert piece.describe() == ""


def test_slice_json_round_trip_and_description():
    piece = DeviceSlice((((0, 0), (1, 2)), ((0, 1), (1, 3))))
    assert DeviceSlice.from_json(piece.to_json()) == piece
    assert piece.to_json() == '[{"job":[0,0],"cluster":[1,2]},{"job":[0,1],"cluster":[1,3]}]'
    assert piece.describe() == "n1:d2,d3"
