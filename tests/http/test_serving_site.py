"""A stopping process lets the write requests under way finish (and does not
wait for reads such as /sync long-polls)."""

from __future__ import annotations

from typing import Any

import treq
from twisted.internet import defer, reactor, task
from twisted.trial import unittest
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request

from synapse_lite.http.server import make_site
from tests.harness.processes import NO_KEEPALIVE


class SlowResource(Resource):
    """Answers every request when the test says so."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[Request] = []

    def render(self, request: Request) -> object:
        self.waiting.append(request)
        return NOT_DONE_YET

    def answer_all(self) -> None:
        for request in self.waiting:
            request.write(b"{}")
            request.finish()
        self.waiting.clear()


async def spin_until(condition: object) -> None:
    for _ in range(200):
        if condition():  # type: ignore[operator]
            return
        await task.deferLater(reactor, 0.01, lambda: None)
    raise AssertionError("condition not reached")


class ServingSiteTestCase(unittest.TestCase):
    async def test_waits_for_writes_not_reads(self) -> None:
        resource = SlowResource()
        site = make_site(resource, 1024 * 1024)
        port: Any = reactor.listenTCP(0, site, interface="127.0.0.1")  # type: ignore[arg-type]
        self.addCleanup(port.stopListening)
        base = f"http://127.0.0.1:{port.getHost().port}"
        self.assertTrue(site.wait_for_writes().called)  # nothing under way

        read = treq.get(base + "/sync", pool=NO_KEEPALIVE)
        write = treq.put(base + "/send", data=b"{}", pool=NO_KEEPALIVE)
        await spin_until(lambda: len(resource.waiting) == 2)
        self.assertEqual(site.writes_in_flight, 1)
        writes_done = site.wait_for_writes()
        self.assertFalse(writes_done.called)

        resource.answer_all()
        await writes_done
        self.assertEqual(site.writes_in_flight, 0)
        for response in await defer.gatherResults([read, write]):
            self.assertEqual(response.code, 200)
            await treq.content(response)
