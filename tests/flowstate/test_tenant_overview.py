"""The operator's list of tenants read in one go (``QuotaStore.everyone``, ``RetentionStore.policies``,
``TenantStore.all_keys``): each the same as the per-tenant read it replaces, on both databases."""

from __future__ import annotations

import time

from flowstate.store.quotas import Quota
from flowstate.store.repository import Repository
from flowstate.store.retention import parse_policy


def test_one_read_for_all_tenants_says_what_one_read_a_tenant_says(any_repo: Repository) -> None:
    repo = any_repo
    made = [repo.tenants.create_tenant(f"tenant {i}") for i in range(4)]
    a, b, c, d = (t.id for t in made)
    repo.tenants.create_key(a)
    key, _ = repo.tenants.create_key(b)
    repo.tenants.create_key(b)
    repo.tenants.revoke(key.id)
    repo.quotas.set_quota(a, Quota(requests_per_minute=10, concurrent_turns=2))
    repo.quotas.set_quota(b, Quota(tokens_per_day=1000))
    for tenant in (a, a, b):
        assert repo.quotas.admit(tenant).refused is None
    repo.retention.set_policy(c, parse_policy("idle=30d"))
    with repo._write("a policy written before policies were checked") as conn:  # what the sweep passes over
        conn.execute("UPDATE tenants SET retention = 'idle=soon' WHERE id = ?", (d,))

    everyone, policies, keys = repo.quotas.everyone(), repo.retention.policies(), repo.tenants.all_keys()
    for t in made:
        quota, used = everyone[t.id]
        one = repo.quotas.usage(t.id)
        assert quota == repo.quotas.quota(t.id)
        assert (used.requests, used.turns, used.tokens) == (one.requests, one.turns, one.tokens)
        assert keys.get(t.id, []) == repo.tenants.keys(t.id)
    assert (everyone[a][1].requests, everyone[a][1].turns, everyone[b][1].turns) == (2, 2, 1)
    assert [k.state for k in keys[b]] == ["revoked", "active"] and c not in keys
    assert policies[a] is None and policies[c] == parse_policy("idle=30d")
    assert policies[d] is not None and not policies[d]  # unreadable: nothing of it expires, as the sweep keeps it


def test_a_lapsed_turn_is_not_counted(any_repo: Repository) -> None:
    repo = any_repo
    t = repo.tenants.create_tenant("lapsing")
    repo.quotas.set_quota(t.id, Quota(concurrent_turns=3))
    repo.quotas.admit(t.id)
    with repo._write("a lease from long ago") as conn:
        conn.execute("UPDATE quota_turns SET lease_at = ? WHERE tenant_id = ?", (time.time() - 3600, t.id))
    assert repo.quotas.everyone()[t.id][1].turns == 0 == repo.quotas.usage(t.id).turns
