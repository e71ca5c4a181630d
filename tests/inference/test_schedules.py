import math

import pytest

from streamsvi.inference import Constant, RobbinsMonro, schedule_from_dict


def test_robbins_monro_values():
    s = RobbinsMonro(tau0=4.0, kappa=0.75)
    for t in (1, 2, 10, 1000):
        assert s(t) == pytest.approx((4.0 + t) ** -0.75, rel=1e-15)
    assert RobbinsMonro(tau0=0.0, kappa=1.0)(1) == 1.0


def test_robbins_monro_conditions_hold_numerically():
    s = RobbinsMonro(tau0=1.0, kappa=0.6)
    rhos = [s(t) for t in range(1, 200001)]
    assert all(a > b for a, b in zip(rhos, rhos[1:]))                 # decreasing
    # Σρ_t grows like T^0.4 / 0.4 without bound; Σρ_t² is bounded by ζ(1.2) ≈ 5.59
    T = len(rhos)
    assert sum(rhos) == pytest.approx(((1 + T) ** 0.4 - 1.5 ** 0.4) / 0.4, abs=1.0)
    assert sum(r * r for r in rhos) < 5.6


def test_floor_leaves_robbins_monro():
    s = RobbinsMonro(tau0=0.0, kappa=1.0, rho_min=0.01)
    assert s(10) == pytest.approx(0.1)
    assert s(1000) == 0.01 and s(10**6) == 0.01


@pytest.mark.parametrize("kw,msg", [
    (dict(kappa=0.5), r"kappa must be in \(0.5, 1\], got 0.5"),
    (dict(kappa=1.2), r"kappa must be in \(0.5, 1\], got 1.2"),
    (dict(tau0=-1), r"tau0 must be a finite number >= 0, got -1"),
    (dict(tau0=math.inf), r"tau0"),
    (dict(rho_min=0.0), r"rho_min must be in \(0, 1\]"),
])
def test_invalid_robbins_monro(kw, msg):
    with pytest.raises(ValueError, match=msg):
        RobbinsMonro(**kw)


def test_constant_and_round_trip():
    assert Constant(0.25)(7) == 0.25
    with pytest.raises(ValueError, match=r"rho must be in \(0, 1\]"):
        Constant(1.5)
    for s in (Constant(0.3), RobbinsMonro(2.0, 0.9, 0.05)):
        assert schedule_from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="schedule kind"):
        schedule_from_dict({"kind": "adam"})
    with pytest.raises(ValueError, match="1-based"):
        Constant(0.5)(0)
