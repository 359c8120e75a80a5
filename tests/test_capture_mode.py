"""Arena capture mode (used while a CUDA graph is captured), checked with SimDevice.

While capturing, the arena records, queries and synchronizes no event and
gives no memory back, so a block freed with a stream use stays pending even
when its stream is done; when capture mode ends, the next boundary releases it.
"""
from __future__ import annotations

MiB = 1 << 20


def _pending(a):
    return a.stats()["renaissance"]["pending_bytes"]["current"]


def test_capture_mode_keeps_pending_blocks_and_touches_no_event(C):
    dev = C.SimDevice(0, 512)
    a = C.Arena(dev, planning=False)
    side = dev.new_stream()
    p = a.allocate(MiB, 0)
    a.record_stream(p, side)
    dev.enqueue(side, 5)  # the side stream still works on p
    a.set_capturing(True)
    a.deallocate(p)
    recorded, queries, syncs = dev.events_recorded, dev.event_queries, dev.host_synchronizations
    dev.run_all()  # the side stream is done, but nothing may ask the device
    q = a.allocate(MiB, 0)  # no free block: must not reclaim p through an event query
    assert q != p
    a.sync_point()
    reserved = a.stats()["reserved_bytes"]["all"]["current"]
    a.empty_cache()
    assert a.stats()["reserved_bytes"]["all"]["current"] == reserved  # nothing given back
    assert _pending(a) == MiB
    assert (dev.events_recorded, dev.event_queries, dev.host_synchronizations) == (recorded, queries, syncs)
    a.check_invariants()

    a.set_capturing(False)
    a.sync_point()  # seals p's group on the (finished) side stream and releases it
    assert _pending(a) == 0
    assert dev.events_recorded == recorded + 1
    a.deallocate(q)
    a.empty_cache()
    assert a.stats()["reserved_bytes"]["all"]["current"] == 0
    a.check_invariants()


def test_capture_mode_is_off_by_default_and_changes_nothing_else(C):
    dev = C.SimDevice(0, 512)
    a = C.Arena(dev, planning=False)
    side = dev.new_stream()
    p = a.allocate(MiB, 0)
    a.record_stream(p, side)
    a.deallocate(p)
    dev.run_all()
    a.sync_point()
    assert _pending(a) == 0
    a.set_capturing(True)
    a.set_capturing(False)
    r = a.allocate(MiB, 0)
    assert r == p  # the released block is reused as before
    a.deallocate(r)
    a.check_invariants()
