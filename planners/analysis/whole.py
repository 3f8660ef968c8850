"""The least cost of covering a number of bytes with whole buffers (NOTE
[ Whole buffers ]): the 0/1 knapsack under the split bound of
`planners.analysis.window_bound`, solved exactly enough to stay a bound.
"""

from __future__ import annotations

import numpy as np

# NOTE [ Whole buffers ]
# A buffer holds all its bytes or none, and an absent gap comes back one way (NOTE [ Absences ]
# in gaps.py), so the cover at one instant (the least cost of gaps holding >= need bytes, each
# taken or not) is a 0/1 knapsack, whose relaxation is the fractional `window_bound._min_cover`.
# Weak duality holds for any inner minimum, so the split bound of NOTE [ Window bounds ] stays a
# bound with the 0/1 cover in it, higher where gaps are large next to the need.
# Solved by dynamic programming over units of `need / UNITS`: a gap of >= `BIG` units is whole,
# its bytes rounded *up* to whole units; smaller gaps stay fractional, cheapest per byte first.
# dp[j] is the least cost of whole gaps of >= j units, and the cover min_j dp[j] + (the small
# gaps' fractional cost of the need - j units still missing): at most any real choice's cost,
# so a lower bound of the exact 0/1 optimum (tests/planners/test_whole_cover.py checks both
# against enumeration).
# Example and derivation: docs/notes.md, "Whole buffers".

UNITS = 1024  # units the need is cut into
BIG = 16  # a gap of at least this many units is taken whole (rounded up by < 1/16)


def whole_cover(cost: np.ndarray, nbytes: np.ndarray, need: float) -> np.ndarray:
    """float64[rows]: per row of `cost` (rows x gaps, seconds; inf where the
    gap cannot be used), at most the least cost of gaps taken whole with
    >= `need` bytes in all (NOTE [ Whole buffers ]); inf where all of them
    are not enough, 0 if `need` <= 0."""
    cost = np.atleast_2d(cost)
    rows = cost.shape[0]
    if need <= 0:
        return np.zeros(rows)
    keep = nbytes > 0
    cost, nbytes = cost[:, keep], nbytes[keep]
    unit = need / UNITS
    big = nbytes >= BIG * unit
    dp = _whole(cost[:, big], np.ceil(nbytes[big] / unit).astype(np.int64))
    missing = need * (
        1.0 - np.arange(UNITS + 1) / UNITS
    )  # bytes left to the small gaps (0 at the end)
    small = _fractional(cost[:, ~big], nbytes[~big], missing)
    return np.min(dp + small, axis=1)


def _whole(cost: np.ndarray, units: np.ndarray) -> np.ndarray:
    """float64[rows, UNITS + 1]: dp[i, j], the least cost at row i of some
    of the gaps with >= j units in all (inf if none reach j)."""
    dp = np.full((cost.shape[0], UNITS + 1), np.inf)
    dp[:, 0] = 0.0
    j = np.arange(UNITS + 1)
    for g, u in enumerate(units.tolist()):
        dp = np.minimum(dp, dp[:, np.maximum(j - u, 0)] + cost[:, g : g + 1])
    # the least cost of >= j units: a set of more units also has >= j
    return np.minimum.accumulate(dp[:, ::-1], axis=1)[:, ::-1]


def _fractional(cost: np.ndarray, nbytes: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """float64[rows, len(missing)]: per row, the least cost of `missing`
    bytes taken fractionally from the gaps with a finite cost, cheapest per
    byte first; 0 where nothing is missing, inf where they hold too little."""
    out = np.empty((cost.shape[0], len(missing)))
    for i, c in enumerate(cost):
        ok = np.isfinite(c)
        c, nb = c[ok], nbytes[ok]
        order = np.argsort(c / nb, kind="stable")
        held = np.concatenate([[0.0], np.cumsum(nb[order])])
        spent = np.concatenate([[0.0], np.cumsum(c[order])])
        row = np.interp(np.maximum(missing, 0.0), held, spent)
        out[i] = np.where(missing > held[-1], np.inf, row)
    return out
