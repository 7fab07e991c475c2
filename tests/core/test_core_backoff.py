"""The one backoff (nodefabric_devicemanager.backoff): each caller's timings, the cap, the jitter range,
bounded at any attempt count, and refusals of timings that are no durations."""

from __future__ import annotations

import math
import time

import pytest

from nodefabric_devicemanager import nodeclient
from nodefabric_devicemanager.backoff import API_BASE_S, API_CAP_S, Backoff


def test_doubles_from_base_up_to_the_cap_without_jitter() -> None:
    steady = Backoff(0.1, 5.0, jitter=False)
    assert [steady.delay(n) for n in range(8)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])


def test_a_negative_attempt_waits_the_base() -> None:
    assert Backoff(5.0, 300.0, jitter=False).delay(-3) == 5.0


@pytest.mark.parametrize("attempt", [33, 64, 2100, 2**62, 10**18, 10**400])
def test_huge_attempt_counts_wait_the_cap_at_once(attempt: int) -> None:
    # From 1e-300 s the cap of 1e300 s is 1,994 doublings away: no float overflow on the way there.
    extreme = [Backoff(1e-300, 1e300, jitter=False)] if attempt > 2000 else []
    for backoff in (Backoff(0.001, 300.0, jitter=False), *extreme):
        started = time.perf_counter()
        assert backoff.delay(attempt) == backoff.cap
        assert time.perf_counter() - started < 0.1  # no 2 ** (a huge count) computed before the cap


def test_the_cap_is_reached_even_from_a_tiny_base() -> None:
    # A bound of 32 on the exponent (what two of the four old backoffs used) stops short of this cap.
    tiny = Backoff(1e-12, 60.0, jitter=False)
    assert tiny.delay(40) < 60.0
    assert tiny.delay(46) == 60.0


def test_jitter_stays_between_half_and_all_of_the_ceiling() -> None:
    backoff = Backoff(0.5, 30.0)
    for attempt in (0, 3, 10, 10**9):
        ceiling = backoff.ceiling(attempt)
        waits = [backoff.delay(attempt) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert len(set(waits)) > 1  # spread, so nodes that failed together come back apart


def test_defaults_are_the_api_clients_timings_and_nodeclient_names_the_same_class() -> None:
    assert nodeclient.Backoff is Backoff
    assert (Backoff().base, Backoff().cap, Backoff().jitter) == (API_BASE_S, API_CAP_S, True)
    assert Backoff().ceiling(100) == API_CAP_S


def test_a_base_above_the_cap_waits_the_cap_and_zero_waits_nothing() -> None:
    assert Backoff(10.0, 5.0, jitter=False).delay(0) == 5.0
    assert Backoff(0.0, 5.0).delay(7) == 0.0
    assert Backoff(1.0, 0.0).delay(7) == 0.0


@pytest.mark.parametrize(
    ("base", "cap"),
    [(-1.0, 5.0), (1.0, -5.0), (math.inf, 5.0), (1.0, math.inf), (math.nan, 5.0), (1.0, math.nan)],
)
def test_timings_that_are_no_durations_are_refused(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match=r"backoff (base|cap) must be finite"):
        Backoff(base, cap)


@pytest.mark.parametrize("bad", ["1", None, True, [1.0]])
def test_timings_of_the_wrong_type_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="must be a number of seconds"):
        Backoff(bad, 5.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be a number of seconds"):
        Backoff(1.0, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("attempt", "expected"), [(2.0, 2.0), (2.5, 2.0), (3.9, 4.0), (-1.5, 0.5)])
def test_an_attempt_count_that_is_a_float_counts_its_whole_part(attempt: float, expected: float) -> None:
    # The old backoffs computed base * 2 ** attempt and took a float count (one read back from JSON);
    # math.ldexp refused it with a TypeError that ended the retry loop.
    assert Backoff(0.5, 30.0, jitter=False).delay(attempt) == pytest.approx(expected)


@pytest.mark.parametrize(("attempt", "expected"), [(math.nan, 0.5), (math.inf, 30.0), (-math.inf, 0.5)])
def test_an_attempt_count_that_is_no_finite_number_waits_the_base_or_the_cap(
    attempt: float, expected: float
) -> None:
    assert Backoff(0.5, 30.0, jitter=False).delay(attempt) == expected


@pytest.mark.parametrize("bad", ["3", None, b"3", [3]])
def test_an_attempt_count_of_the_wrong_type_is_refused_by_name(bad: object) -> None:
    with pytest.raises(TypeError, match="attempt must be a number"):
        Backoff().delay(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="attempt must be a number"):
        Backoff(0.0, 0.0).delay(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("base", "cap"), [(5e-324, 1e308), (1.0, 1.5e308), (1e300, 1.7e308)])
def test_a_cap_near_the_largest_float_is_reached_without_overflow(base: float, cap: float) -> None:
    # The exponent that reaches the cap is rounded up, so base * 2 ** it may pass the largest float
    # when the cap is near it (a resync period given in seconds as 1e308, say).
    backoff = Backoff(base, cap, jitter=False)
    assert backoff.delay(10**6) == cap
    assert backoff.delay(5000) == cap
