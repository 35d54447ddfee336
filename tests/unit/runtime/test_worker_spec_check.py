"""Of two workers of one cluster that run different Specs, exactly one leaves: the one that started later."""

from __future__ import annotations

import pytest

from egress.engines import MemberInfo
from egress.runtime.cluster.worker import ClusterSpecError, refuse_joined_later


def member(worker_id: str, digest: str, started_at: float) -> MemberInfo:
    return MemberInfo(worker_id, digest, {"started_at": started_at})


def test_a_worker_that_started_after_a_member_with_another_spec_is_refused_naming_its_spec() -> None:
    with pytest.raises(ClusterSpecError, match=r"^b\.yaml: worker one of this pipeline's cluster runs another Spec"):
        refuse_joined_later([member("one", "aaaa", 10.0)], "bbbb", "two", "b.yaml", started_at=20.0)


def test_the_member_that_started_first_stays() -> None:
    refuse_joined_later([member("two", "bbbb", 20.0)], "aaaa", "one", "a.yaml", started_at=10.0)


def test_the_same_spec_or_itself_is_no_conflict() -> None:
    refuse_joined_later([member("one", "bbbb", 1.0), member("two", "aaaa", 1.0)], "bbbb", "two", None, 5.0)


def test_a_tie_of_start_times_is_decided_by_the_worker_id() -> None:
    with pytest.raises(ClusterSpecError):
        refuse_joined_later([member("a", "aaaa", 5.0)], "bbbb", "b", None, started_at=5.0)
    refuse_joined_later([member("b", "bbbb", 5.0)], "aaaa", "a", None, started_at=5.0)
