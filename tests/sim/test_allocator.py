"""PyTorch's caching allocator (sim/allocator.py), worked out by hand from
NOTE [ The caching allocator ]: rounding, pool choice, segment sizes,
splitting, best fit, coalescing, the cache and a fragmentation case; then
invariants over random malloc / free sequences (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memplan.sim.allocator import CachingAllocator, alone_size, round_size, segment_size

KiB, MiB = 1 << 10, 1 << 20


def layout(a: CachingAllocator) -> list[list[tuple[int, bool]]]:
    """Each segment's blocks as (size in bytes, free), addresses relative."""
    return [[(size, free) for _addr, size, free in seg.blocks] for seg in a.segments()]


@pytest.mark.parametrize(
    "nbytes, rounded",
    [(1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024), (MiB + 1, MiB + 512)],
)
def test_rounding_to_512_bytes(nbytes, rounded):
    assert round_size(nbytes) == rounded


@pytest.mark.parametrize(
    "nbytes, small, segment",
    [
        (1, True, 2 * MiB),  # small pool: 2 MiB segments
        (MiB, True, 2 * MiB),  # 1 MiB is still small
        (MiB + 1, False, 20 * MiB),  # large, under 10 MiB: 20 MiB segments
        (10 * MiB - 513, False, 20 * MiB),  # rounds to 10 MiB - 512, still under 10 MiB
        (10 * MiB - 1, False, 10 * MiB),  # rounds to 10 MiB: a segment of its own
        (11 * MiB, False, 12 * MiB),  # 10 MiB and more: rounded up to 2 MiB
    ],
)
def test_pool_and_segment_of_a_request(nbytes, small, segment):
    a = CachingAllocator()
    b = a.malloc(nbytes)
    assert (b.small, a.reserved, segment_size(round_size(nbytes))) == (small, segment, segment)


def test_splitting_small_and_large():
    a = CachingAllocator()
    a.malloc(1000)  # 1024 B of a 2 MiB small segment; the rest stays in the small pool
    a.malloc(5 * MiB)  # 5 MiB of a 20 MiB large segment; 15 MiB left
    assert layout(a) == [
        [(1024, False), (2 * MiB - 1024, True)],
        [(5 * MiB, False), (15 * MiB, True)],
    ]
    assert (a.allocated, a.reserved) == (1024 + 5 * MiB, 22 * MiB)


def test_a_large_remainder_of_1_mib_or_less_is_not_split():
    a = CachingAllocator()
    b = a.malloc(11 * MiB)  # a 12 MiB segment; 1 MiB would remain: not more than 1 MiB
    assert (b.size, a.allocated, layout(a)) == (12 * MiB, 12 * MiB, [[(12 * MiB, False)]])
    c = CachingAllocator()
    c.malloc(2 * MiB - 512)  # large pool, a 20 MiB segment: 18 MiB + 512 B remain, split
    assert layout(c) == [[(2 * MiB - 512, False), (18 * MiB + 512, True)]]
    d = CachingAllocator()
    d.malloc(MiB - 512)  # small pool: a remainder of 512 B or more is split
    assert layout(d) == [[(MiB - 512, False), (MiB + 512, True)]]


def test_small_requests_never_use_the_large_pool():
    a = CachingAllocator()
    big = a.malloc(5 * MiB)
    a.free(big)  # a free 20 MiB large segment
    assert a.growth(4 * KiB) == 2 * MiB  # a small request still reserves a small segment
    a.malloc(4 * KiB)
    assert a.reserved == 22 * MiB


def test_best_fit_is_the_smallest_block_then_the_lowest_address():
    a = CachingAllocator()
    x, _y, z, _w = (a.malloc(n) for n in (6 * MiB, 2 * MiB, 4 * MiB, 8 * MiB))  # one segment
    a.free(x)  # free: 6 MiB at 0, 4 MiB at 8 MiB; w's 8 MiB runs to 20 MiB
    a.free(z)
    got = a.malloc(3 * MiB)  # the 4 MiB hole is the smallest that fits (1 MiB left: no split)
    assert (got.addr - x.addr, got.size) == (8 * MiB, 4 * MiB)
    # two equal holes: the lower address wins
    b = CachingAllocator()
    p, _q, r, _s = (b.malloc(n) for n in (4 * MiB, 2 * MiB, 4 * MiB, 10 * MiB))
    b.free(r)
    b.free(p)
    assert b.malloc(4 * MiB).addr == p.addr


def test_coalescing_and_the_cache():
    a = CachingAllocator()
    p, q, r = (a.malloc(n) for n in (3 * MiB, 5 * MiB, 4 * MiB))  # + 8 MiB free tail
    a.free(p)
    a.free(r)  # merges with the free tail: 12 MiB
    assert layout(a) == [[(3 * MiB, True), (5 * MiB, False), (12 * MiB, True)]]
    assert a.idle == 0  # no segment is entirely free
    a.free(q)  # merges with both neighbours: the whole segment, free
    assert (layout(a), a.idle, a.allocated, a.reserved) == (
        [[(20 * MiB, True)]],
        20 * MiB,
        0,
        20 * MiB,
    )
    # segments stay reserved until empty_cache
    assert a.malloc(15 * MiB).addr == p.addr and a.reserved == 20 * MiB
    with pytest.raises(RuntimeError, match="freed twice"):
        a.free(q)


def test_empty_cache_returns_only_entirely_free_segments():
    a = CachingAllocator()
    keep = a.malloc(12 * MiB)  # a 12 MiB segment
    gone = a.malloc(3 * MiB)  # a 20 MiB segment
    small = a.malloc(100)  # a 2 MiB small segment
    a.free(gone)
    a.free(small)
    assert a.empty_cache() == 22 * MiB
    assert (a.reserved, a.idle, layout(a)) == (12 * MiB, 0, [[(12 * MiB, False)]])
    assert a.peak_reserved == 34 * MiB and keep.size == 12 * MiB


def test_fragmentation_reserved_over_allocated_by_hand():
    # A and B (6 MiB each) share a 20 MiB segment: [A 6][B 6][free 8]. A is
    # freed: holes of 6 and 8 MiB. C (9 MiB) fits neither: a second 20 MiB
    # segment. Reserved 40 MiB for 15 MiB allocated: 25 MiB of fragmentation.
    a = CachingAllocator()
    blk_a, _b = a.malloc(6 * MiB), a.malloc(6 * MiB)
    a.free(blk_a)
    a.malloc(9 * MiB)
    assert (a.reserved, a.allocated, a.reserved - a.allocated) == (40 * MiB, 15 * MiB, 25 * MiB)
    assert (a.peak_reserved, a.peak_allocated) == (40 * MiB, 15 * MiB)


@pytest.mark.parametrize(
    "nbytes, alone",
    [(1, 512), (MiB + 1, MiB + 512), (10 * MiB - 1, 10 * MiB), (11 * MiB, 12 * MiB)],
)
def test_the_size_planners_see(nbytes, alone):
    assert alone_size(nbytes) == alone


# ---- invariants over random sequences -------------------------------------------------
SIZES = st.one_of(
    st.integers(1, 4 * KiB), st.integers(1, 2 * MiB), st.integers(MiB, 24 * MiB)
)  # small, around the pool boundary, large (some of a segment of their own)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), SIZES, st.integers(0, 99)), max_size=60))
def test_random_sequences_keep_the_books(steps):
    a, live = CachingAllocator(), []
    for do_free, nbytes, pick in steps:
        if do_free and live:
            a.free(live.pop(pick % len(live)))
        else:
            need = a.growth(nbytes)
            before = a.reserved
            b = a.malloc(nbytes)
            live.append(b)
            assert a.reserved - before == need  # growth says what malloc reserves
            assert b.size >= round_size(nbytes) and b.small == (round_size(nbytes) <= MiB)
        if pick % 7 == 0:
            a.empty_cache()
        segs = list(a.segments())
        blocks = [blk for seg in segs for blk in seg.blocks]
        # blocks tile their segments, without gaps or overlaps
        for seg in segs:
            ends = [seg.addr] + [addr + size for addr, size, _ in seg.blocks]
            assert [addr for addr, _, _ in seg.blocks] == ends[:-1]
            # coalesced: no two free neighbours
            frees = [free for _, _, free in seg.blocks]
            assert not any(x and y for x, y in zip(frees, frees[1:], strict=False))
        assert a.reserved == sum(seg.size for seg in segs)
        assert (
            a.allocated
            == sum(size for _, size, free in blocks if not free)
            == sum(b.size for b in live)
        )
        assert a.idle == sum(seg.size for seg in segs if len(seg.blocks) == 1 and seg.blocks[0][2])
    for b in live:
        a.free(b)
    a.empty_cache()
    assert (a.allocated, a.reserved, a.idle) == (0, 0, 0)
