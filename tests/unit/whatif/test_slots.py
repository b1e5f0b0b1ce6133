"""The carry buffer (``trainer.partial_rollout=carry``): which rows carry, when a group is
complete, what the bound drops, and the slot accounting, all with hand-computed values."""

from __future__ import annotations

import pytest

from rltrain.whatif.slots import CarryBuffer, Segmented


def _three_groups() -> CarryBuffer:
    buf = CarryBuffer(slots=4, segment=2)
    buf.admit(0, 0, [1, 5])
    buf.admit(1, 0, [2, 2])
    buf.admit(2, 0, [3, 1])
    return buf


def test_a_call_ends_once_enough_groups_are_complete_and_carries_the_rest():
    buf = _three_groups()
    done = buf.run(want=2, oldest=0)
    # segment 1 (2 steps): rows g0[1,5] g1[2,2] decode, 1+2+2+2 = 7 row-steps; g1 completes.
    # segment 2 (2 steps): g0's row of 3 left and g2[3,1] decode, 2+2+1 = 5; nothing completes.
    # segment 3 (1 step, the longest left): g0's 1 and g2's 1: 2; g0 and g2 complete.
    assert done == Segmented(ready=(0, 1), dropped=(), steps=5, busy=14, slot_steps=20)
    assert buf.held() == [2]  # complete, carried to the next call
    assert buf.carried_rows() == 0


def test_carried_groups_are_handed_on_before_newer_ones():
    buf = _three_groups()
    buf.run(want=2, oldest=0)
    buf.admit(3, 1, [4, 4])
    done = buf.run(want=2, oldest=0)
    assert done == Segmented(ready=(2, 3), dropped=(), steps=4, busy=8, slot_steps=16)
    assert buf.held() == []


def test_a_group_past_the_bound_is_dropped_even_when_complete():
    buf = _three_groups()
    buf.run(want=2, oldest=0)
    buf.admit(3, 1, [4, 4])
    buf.admit(4, 1, [1, 1])
    done = buf.run(want=2, oldest=1)
    # g2 started with version 0 < 1: dropped; g3 and g4 decode together (2, then 2 steps)
    assert done == Segmented(ready=(3, 4), dropped=(2,), steps=4, busy=10, slot_steps=16)


def test_rows_wait_for_a_free_slot_and_unfinished_rows_stay():
    buf = CarryBuffer(slots=2, segment=3)
    buf.admit(0, 0, [1, 1])
    buf.admit(1, 0, [9, 2])
    done = buf.run(want=1, oldest=0, due=0)  # the next call keeps version 0: nothing is due
    # g1 waits for g0's slots; g0's rows end in step 1 and idle until the segment ends
    assert done == Segmented(ready=(0,), dropped=(), steps=1, busy=2, slot_steps=2)
    assert buf.carried_rows() == 2  # g1 has not started: both rows still to decode
    done = buf.run(want=1, oldest=0, due=0)
    # segment (3): 3 + 2 = 5; then 3 + 3 steps with one row busy: 6
    assert done == Segmented(ready=(1,), dropped=(), steps=9, busy=11, slot_steps=18)


def test_the_slots_idle_less_than_a_static_batch_decoding_to_its_longest_row():
    lengths = [[1, 12], [2, 3], [1, 2], [4, 1]]
    static_busy = sum(map(sum, lengths)) / (4 * 2 * max(map(max, lengths)))
    buf = CarryBuffer(slots=8, segment=1)
    for key, rows in enumerate(lengths):
        buf.admit(key, 0, rows)
    done = buf.run(want=3, oldest=0, due=0)
    assert done.ready == (1, 2, 3) and done.steps == 4  # the 12-token row carries on
    assert done.busy / done.slot_steps > static_busy
    assert buf.carried_rows() == 1


def test_bad_sizes_and_a_held_key_are_refused():
    with pytest.raises(ValueError, match="slots=0"):
        CarryBuffer(0, 1)
    buf = CarryBuffer(1, 1)
    buf.admit(0, 0, [1])
    with pytest.raises(ValueError, match="already"):
        buf.admit(0, 0, [1])


def test_a_decoder_ends_rows_at_their_eos_and_a_stamp_moves_a_waiting_group():
    # the torch engine: budgets of 6 steps, the decoder says which rows sampled their EOS
    buf = CarryBuffer(slots=2, segment=2)
    buf.admit(0, 0, [6, 6])
    buf.admit(1, 0, [6, 6])
    asked = []

    def decode(rows, seg):
        asked.append((rows, seg))
        return {(0, 0): 1, (0, 1): 2} if len(asked) == 1 else {}

    done = buf.run(want=1, oldest=0, decode=decode, due=0)
    # segment 1: group 0's rows end after 1 and 2 steps (EOS): complete; group 1 never started
    assert asked == [([(0, 0), (0, 1)], 2)]
    assert done == Segmented(ready=(0,), dropped=(), steps=2, busy=3, slot_steps=4)
    buf.stamp(1, 3)  # it waits: it counts from the weights that will sample its first token
    assert buf.run(want=0, oldest=3).dropped == ()
    done = buf.run(want=1, oldest=3, decode=decode)  # no EOS: rows run to their budget
    assert len(asked) == 4 and all(a == ([(1, 0), (1, 1)], 2) for a in asked[1:])
    assert done == Segmented(ready=(1,), dropped=(), steps=6, busy=12, slot_steps=12)


def _long_old_group() -> CarryBuffer:
    buf = CarryBuffer(slots=2, segment=1)
    buf.admit(0, 0, [1, 6])  # started with version 0: the call for oldest=1 would drop it
    buf.admit(1, 1, [1, 1])
    return buf


def test_a_group_the_next_call_would_drop_is_finished_in_this_one():
    buf = _long_old_group()
    done = buf.run(want=1, oldest=0, due=1)
    # step 1: g0's rows (2 busy); g0r0 ends, g1r0 takes its slot. step 2: g0r1 + g1r0 (2);
    # step 3: g0r1 + g1r1 (2): g1 complete, enough for want=1, but g0 is due: its row of 6 goes
    # on alone for steps 4-6 (1 each). g0 is the older: it is handed on; g1 waits, complete.
    assert done == Segmented(ready=(0,), dropped=(), steps=6, busy=9, slot_steps=12)
    assert buf.held() == [1]
    assert buf.run(want=1, oldest=1).dropped == ()


def test_without_a_deadline_the_long_group_is_left_to_the_bound():
    buf = _long_old_group()
    done = buf.run(want=1, oldest=0, due=0)  # the old rule: end once want groups are complete
    assert done == Segmented(ready=(1,), dropped=(), steps=3, busy=6, slot_steps=6)
    assert buf.run(want=0, oldest=1).dropped == (0,)  # its 4 decoded tokens thrown away


def test_free_slots_go_to_the_oldest_group_first_whatever_the_admission_order():
    buf = CarryBuffer(slots=1, segment=1)
    buf.admit(0, 2, [1])
    buf.admit(1, 1, [1])  # admitted later (e.g. sampled again) but started with an older version
    assert buf.run(want=1, oldest=0, due=0) == Segmented((1,), (), 1, 1, 1)


def test_due_groups_beyond_what_a_call_hands_on_are_still_dropped():
    buf = CarryBuffer(slots=2, segment=1)
    buf.admit(0, 0, [1])
    buf.admit(1, 0, [1])
    assert buf.run(want=1, oldest=0).ready == (0,)  # due defaults to oldest + 1: both finish
    assert buf.run(want=0, oldest=1).dropped == (1,)  # one call hands on one group only


class _Scripted:
    """Lengths handed out in order, ``n`` per group."""

    def __init__(self, lengths: list[int]) -> None:
        self.left = list(lengths)

    def sample(self, rng: object, n: int) -> list[int]:
        out, self.left = self.left[:n], self.left[n:]
        return out


def test_call_steps_follow_the_pipeline_and_its_deadline():
    """2 slots, groups of 2, k = 2. Prime A = (1, 9). Call 0 admits B = (1, 1): A0, B0, B1 end
    at steps 1-3 beside A1, B goes (3 steps; A1 has 6 left). Call 1, C = (1, 1): 2 steps, C
    goes (A1: 4 left). Call 2 admits D with version 1; A (version 0) is due, so after D
    completes at step 2 the call goes on until A1 ends at step 4, and hands A on. Call 3: D is
    complete and nothing is due: 0 steps. Calls from k on count: (4 + 0) / 2."""
    from rltrain.whatif.lengths import Fixed
    from rltrain.whatif.slots import call_steps, carry_share

    script = _Scripted([1, 9] + [1, 1] * 4)
    assert call_steps(script, slots=2, n=2, bound=2, segment=1, calls=4) == 2.0
    # no tail: every call decodes one batch to its end, as a static batch does
    assert carry_share(Fixed(3), slots=2, n=2, bound=2) == 1.0
