"""The Responses API's store: ids that name their owner (a cluster replica) and are read back
by the front door, least recently used responses dropped first, a missing one a 400 by name."""

from __future__ import annotations

import pytest

from strata.errors import RequestError
from strata.server.responses_api.store import ResponseStore, owner_of


@pytest.mark.parametrize("owner", [None, "k3x9q2ab", "replica_with_underscores"])
def test_ids_name_their_owner(owner):
    store = ResponseStore(owner=owner)
    for request_id in ("1a2b3c4d-0", "1a2b3c4d-17.3"):
        assert owner_of(store.response_id(request_id)) == owner


@pytest.mark.parametrize("foreign", ["resp_", "resp__x", "msg_abc_def", "", "resp_abc"])
def test_ids_not_naming_an_owner(foreign):
    assert owner_of(foreign) is None


def test_the_least_recently_used_go_first_and_a_missing_one_is_named():
    store = ResponseStore(limit=2)
    for i in range(3):
        store.put(f"r{i}", [{"role": "user", "content": str(i)}])
        if i == 1:
            store.conversation("r0")  # r0 used: r1 is the least recently used
    assert store.conversation("r0") == [{"role": "user", "content": "0"}]
    with pytest.raises(RequestError) as err:
        store.conversation("r1")
    assert err.value.param == "previous_response_id"
