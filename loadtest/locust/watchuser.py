"""WatchUser: one long-lived watch, resumed from the last resourceVersion as client-go does.

It starts either like ``kubectl get -w`` (a LIST for the collection's rv, then a watch from it)
or like client-go's WatchList (a streaming list: ``sendInitialEvents=true&
resourceVersionMatch=NotOlderThan``); when the server ends a stream (``timeoutSeconds``) it
resumes from the newest rv it saw, bookmarks included; on 410 it starts over.
"""

from __future__ import annotations

import random

import gevent
from locust import FastHttpUser, constant, task

from loadtest.locust.context import RunContext, user_context
from loadtest.locust.reads import collection_path, list_page
from loadtest.locust.watching import Outcome, WatchSession

BROKEN_PAUSE = 1.0  # seconds before resuming after a connection error (client-go backs off too)


def choose_target(ctx: RunContext, index: int) -> tuple[str, str | None, dict[str, str], str]:
    """(resource, namespace, selectors, label) of the collection the ``index``-th watcher watches."""
    settings = ctx.settings
    churned = settings.churn_namespaces[0] if settings.churn_namespaces else settings.namespaces[0]
    if settings.profile == "fanout":
        return "configmaps", churned, {}, "configmaps -n [churned]"
    # Mostly the configmaps the ChurnUser stamps (their events are timed); some pods, whose
    # events come from the simulated cluster's churn (counted, untimed).
    namespace = settings.namespaces[index % len(settings.namespaces)]
    cycle = [
        ("configmaps", None, {}, "configmaps -A"),
        ("configmaps", churned, {}, "configmaps -n [churned]"),
        ("pods", None, {}, "pods -A"),
        ("configmaps", None, {}, "configmaps -A"),
        ("configmaps", churned, {}, "configmaps -n [churned]"),
        ("pods", namespace, {"labelSelector": "tier=web"}, "pods -n [ns] tier=web"),
    ]
    return cycle[index % len(cycle)]


class WatchUser(FastHttpUser):
    weight = 4
    wait_time = constant(0)

    def on_start(self) -> None:
        self.ctx = user_context(self.environment)
        resource, namespace, selectors, label = choose_target(self.ctx, self.ctx.deal("WatchUser"))
        self.path = collection_path(resource, namespace)
        self.selectors = selectors
        self.label = label
        assert self.host is not None  # locust's --host, required by the profile
        self.session = WatchSession(self.environment, self.ctx, self.host, self.path, selectors, label)

    def on_stop(self) -> None:
        if not hasattr(self, "ctx"):  # on_start stopped it: the test did not start
            return
        self.session.close()

    def _start(self) -> Outcome:
        """A fresh start: a streaming list, or a LIST for the rv and a watch from it."""
        while True:
            if self.ctx.streaming_lists and random.random() < 0.5:
                return self.session.streaming_list()
            params = {**self.selectors, "limit": "1"}
            page = list_page(self.client, self.path, params, f"{self.label} limit=1", self.ctx.settings.headers())
            if page is not None:
                self.session.continuity.reset()
                return self.session.stream_from(page.resource_version)
            gevent.sleep(BROKEN_PAUSE)

    @task
    def watch(self) -> None:
        outcome = self._start()
        while True:  # until locust stops the user
            if outcome is Outcome.EXPIRED:
                self.ctx.counters["watch restarts"] += 1  # after a 410, or a refused streaming list
                outcome = self._start()
                continue
            if outcome is Outcome.BROKEN:
                gevent.sleep(BROKEN_PAUSE)
            if self.session.continuity.resume_rv == 0:
                # Broken before any rv was known (a streaming list cut short): nothing to resume from.
                outcome = self._start()
                continue
            self.ctx.counters["watch resumptions"] += 1
            outcome = self.session.stream_from(self.session.continuity.resume_rv)
