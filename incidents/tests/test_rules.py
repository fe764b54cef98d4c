"""Pure rules of an incident record (``incidents.rules``) and its state map."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from incidents import rules
from incidents.states import INCIDENT_TRANSITIONS, IncidentStatus, transition_allowed


def test_a_complete_account_with_low_at_or_below_high_is_valid() -> None:
    assert rules.account_errors(low=Decimal(0), high=Decimal(122), basis="lifetime") == {}
    assert rules.account_errors(low=Decimal(23), high=Decimal(23), basis="stall") == {}
    assert rules.account_errors(low=None, high=None, basis="") == {}


def test_lower_bound_above_upper_bound_is_refused_on_the_lower_bound() -> None:
    errors = rules.account_errors(low=Decimal(200), high=Decimal(100), basis="stall")
    assert set(errors) == {"gpu_hours_low"}
    assert "above the upper bound" in errors["gpu_hours_low"]


def test_bounds_without_a_basis_and_a_basis_without_bounds_are_refused() -> None:
    assert set(rules.account_errors(low=Decimal(1), high=Decimal(2), basis="")) == {
        "gpu_hours_basis"
    }
    assert set(rules.account_errors(low=None, high=None, basis="lifetime")) == {"gpu_hours_low"}
    assert set(rules.account_errors(low=Decimal(1), high=None, basis="lifetime")) == {
        "gpu_hours_high"
    }


def test_negative_bounds_and_unknown_bases_are_refused() -> None:
    assert "gpu_hours_low" in rules.account_errors(low=Decimal(-1), high=Decimal(2), basis="stall")
    assert "gpu_hours_basis" in rules.account_errors(low=Decimal(1), high=Decimal(2), basis="vibes")


def test_an_end_before_the_start_is_refused_and_an_open_end_is_fine() -> None:
    start = datetime(2026, 10, 14, 19, 0, tzinfo=UTC)
    assert rules.window_errors(started_at=start, ended_at=None) == {}
    assert rules.window_errors(started_at=start, ended_at=start) == {}
    assert set(rules.window_errors(started_at=start, ended_at=start - timedelta(minutes=1))) == {
        "ended_at"
    }


def test_root_cause_flags_name_the_paper_classes_including_combinations() -> None:
    def label(i: bool, k: bool, c: bool) -> str:
        return rules.cause_class_label(implementation=i, kubernetes_default=k, cluster_service=c)

    assert label(False, False, False) == "not established"
    assert label(True, False, False) == "sandbox implementation"
    assert label(True, True, False) == "implementation and Kubernetes default"
    assert label(False, False, True) == "cluster or shared service"
    assert (
        rules.cause_class_key(implementation=True, kubernetes_default=False, cluster_service=True)
        == "implementation+cluster_service"
    )
    # Every combination has a label and a place in the display order.
    for bits in range(8):
        flags = dict(
            implementation=bool(bits & 1),
            kubernetes_default=bool(bits & 2),
            cluster_service=bool(bits & 4),
        )
        assert rules.cause_class_key(**flags) in rules.CLASS_ORDER
        assert rules.cause_class_label(**flags)


def test_closed_incidents_can_only_be_reopened() -> None:
    assert transition_allowed(IncidentStatus.OPEN, IncidentStatus.FIXED)
    assert transition_allowed(IncidentStatus.FIXED, IncidentStatus.OPEN)
    assert not transition_allowed(IncidentStatus.FIXED, IncidentStatus.MITIGATED)
    assert not transition_allowed(IncidentStatus.WONT_FIX, IncidentStatus.FIXED)
    assert set(INCIDENT_TRANSITIONS) == set(IncidentStatus.values)
