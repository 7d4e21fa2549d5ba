from tests.support.factories import pod
from watchcache.cache.events import ADDED, DELETED
from watchcache.cache.listing import ListScope, list_page
from watchcache.cache.store import CacheConfig, ResourceCache
from watchcache.resources import PODS


def cache_with(names: list[tuple[str, str]]) -> ResourceCache:
    c = ResourceCache(PODS, CacheConfig(), lambda: 0.0)
    c.replace([pod(n, ns, rv=1, labels={"i": str(i % 2)}) for i, (ns, n) in enumerate(names)], rv=5)
    return c


def test_namespace_scope_does_not_leak_into_prefix_sharing_namespaces():
    c = cache_with([("a", "x"), ("a-b", "y"), ("ab", "z"), ("a", "w")])
    page = list_page(c.snapshot(), ListScope.of("a"), None)
    assert [o.key for o in page.items] == ["a/w", "a/x"]


def test_cluster_wide_order_is_etcd_key_order():
    c = cache_with([("a", "x"), ("a-b", "y")])
    page = list_page(c.snapshot(), ListScope.of(None), None)
    # '-' sorts before '/', as in etcd keys /registry/pods/a-b/y < /registry/pods/a/x
    assert [o.key for o in page.items] == ["a-b/y", "a/x"]


def test_paging_with_limit_returns_continue_and_remaining():
    c = cache_with([("ns", f"p{i}") for i in range(5)])
    page = list_page(c.snapshot(), ListScope.of("ns"), None, limit=2)
    assert [o.name for o in page.items] == ["p0", "p1"]
    assert page.next_start == "p1\x00" and page.remaining == 3
    page2 = list_page(c.snapshot(), ListScope.of("ns"), None, limit=2, start=page.next_start)
    assert [o.name for o in page2.items] == ["p2", "p3"] and page2.remaining == 1
    page3 = list_page(c.snapshot(), ListScope.of("ns"), None, limit=2, start=page2.next_start)
    assert [o.name for o in page3.items] == ["p4"] and page3.next_start is None and page3.remaining is None


def test_last_full_page_has_no_continue():
    c = cache_with([("ns", f"p{i}") for i in range(4)])
    page = list_page(c.snapshot(), ListScope.of("ns"), None, limit=2, start="p1\x00")
    assert page.next_start is None


def test_selector_fills_the_page_and_omits_remaining_count():
    c = cache_with([("ns", f"p{i}") for i in range(6)])
    page = list_page(c.snapshot(), ListScope.of("ns"), lambda o: o.labels["i"] == "1", limit=2)
    assert [o.name for o in page.items] == ["p1", "p3"]
    assert page.next_start == "p3\x00" and page.remaining is None


def test_pages_at_an_old_rv_ignore_later_writes():
    c = cache_with([("ns", f"p{i}") for i in range(4)])
    first = list_page(c.snapshot(5), ListScope.of("ns"), None, limit=2)
    c.apply([(DELETED, pod("p2", "ns", rv=6))])
    c.apply([(ADDED, pod("p25", "ns", rv=7))])
    second = list_page(c.snapshot(5), ListScope.of("ns"), None, limit=2, start=first.next_start)
    assert [o.name for o in second.items] == ["p2", "p3"]
    assert second.rv == 5
