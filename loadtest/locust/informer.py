"""InformerUser: list-then-watch like a client-go reflector, relisting on 410.

client-go's order, modelled here: the first LIST asks for ``resourceVersion=0`` (any cached state,
paged with ``limit=500``), the watch starts at the list's rv with ``allowWatchBookmarks``, and each
stream is resumed from the newest rv seen; a 410 makes the next LIST a consistent one
(``resourceVersion`` unset), as ``relistResourceVersion`` does after "too old resource version".
A restart (the relist-storm's broadcast, ``context.Restarts``) is a new process: LIST at rv=0 again.

The informer's store is only the set of keys (``continuity.StoreCheck``): enough to flag an event
that contradicts what the client holds, without keeping megabytes of objects per user.
"""

from __future__ import annotations

import gevent
from locust import FastHttpUser, constant, task

from loadtest.locust.context import user_context
from loadtest.locust.continuity import StoreCheck
from loadtest.locust.reads import collection_path, list_all, object_key
from loadtest.locust.watching import Outcome, WatchSession

PAGE_SIZE = "500"  # client-go's pager default
BROKEN_PAUSE = 1.0


class InformerUser(FastHttpUser):
    weight = 2
    wait_time = constant(0)

    def on_start(self) -> None:
        self.ctx = user_context(self.environment)
        # Pods: the big, sim-churned collection; configmaps: the stamped one (timed events).
        self.resource = ("configmaps", "pods")[self.ctx.deal("InformerUser") % 2]
        self.path = collection_path(self.resource, None)
        self.store = StoreCheck()
        assert self.host is not None  # locust's --host, required by the profile
        self.session = WatchSession(
            self.environment, self.ctx, self.host, self.path, {}, f"{self.resource} -A (informer)", store=self.store
        )
        self.watching = False
        self.ctx.informers += 1

    def on_stop(self) -> None:
        if not hasattr(self, "ctx"):  # on_start stopped it: the test did not start
            return
        self.ctx.informers -= 1
        self._set_watching(False)
        self.session.close()

    def _set_watching(self, watching: bool) -> None:
        if watching != self.watching:
            self.ctx.informers_watching += 1 if watching else -1
            self.watching = watching

    def _list(self, consistent: bool) -> int | None:
        """The relist: replace the store; the rv to watch from, or None on failure."""
        if consistent:
            params, name = {"limit": PAGE_SIZE}, f"{self.resource} -A limit=500 (informer relist)"
            self.ctx.counters["informer consistent relists"] += 1
        else:
            params, name = {"resourceVersion": "0", "limit": PAGE_SIZE}, f"{self.resource} -A rv=0 limit=500 (informer)"
            self.ctx.counters["informer lists"] += 1
        page = list_all(self.client, self.path, params, name, self.ctx.settings.headers())
        if page is None:
            return None
        self.store.replace({object_key(item) for item in page.items})
        self.session.continuity.reset()
        return page.resource_version

    def _watch(self, rv: int) -> Outcome | None:
        """One stream, read in a child greenlet the relist-storm can kill; None if it was."""
        restarts = self.ctx.restarts
        reader = gevent.spawn(self.session.stream_from, rv)
        restarts.readers.add(reader)
        try:
            result = reader.get()
        finally:
            restarts.readers.discard(reader)
            if not reader.dead:  # this user is being stopped: the stream must not outlive it
                reader.kill(block=False)
        return result if isinstance(result, Outcome) else None

    @task
    def list_and_watch(self) -> None:
        consistent = False
        while True:  # until locust stops the user
            epoch = self.ctx.restarts.epoch
            self._set_watching(False)
            rv = self._list(consistent)
            if rv is None:
                gevent.sleep(BROKEN_PAUSE)
                continue
            consistent = False
            self._set_watching(True)
            while epoch == self.ctx.restarts.epoch:
                outcome = self._watch(self.session.continuity.resume_rv or rv)
                if outcome is None:  # killed by a restart
                    break
                if outcome is Outcome.EXPIRED:
                    consistent = True
                    break
                if outcome is Outcome.BROKEN:
                    gevent.sleep(BROKEN_PAUSE)
                self.ctx.counters["informer watch resumptions"] += 1
            if epoch != self.ctx.restarts.epoch:
                self.ctx.counters["informer restarts"] += 1
