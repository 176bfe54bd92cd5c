"""Statistics for the sampling tests (no scipy needed)."""

from __future__ import annotations

from collections import Counter


def chi2_ppf(q: float, dof: int) -> float:
    """The chi-square quantile by the Wilson-Hilferty approximation."""
    z = {0.999: 3.090232}[q]
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


def assert_drawn_from(samples: list[int], expected: dict[int, float]) -> None:
    """Every sample is in ``expected``'s support and the counts pass a chi-square test
    against it (0.1 % level); tokens expected less than 5 times are pooled."""
    n = len(samples)
    seen = Counter(samples)
    outside = set(seen) - {t for t, p in expected.items() if p > 0}
    assert not outside, f"drawn outside the support: {sorted(outside)}"
    cells, pooled_o, pooled_e = [], 0, 0.0
    for tok, p in expected.items():
        if p * n >= 5:
            cells.append((seen[tok], p * n))
        else:
            pooled_o, pooled_e = pooled_o + seen[tok], pooled_e + p * n
    if pooled_e > 0:
        cells.append((pooled_o, pooled_e))
    if len(cells) < 2:
        return
    chi2 = sum((o - e) ** 2 / e for o, e in cells)
    assert chi2 < chi2_ppf(0.999, len(cells) - 1), (chi2, len(cells) - 1)
