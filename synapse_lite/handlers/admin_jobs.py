"""The admin API's long jobs (room deletion, history purges): rows of
``admin_tasks`` (delta 0060), written by the process running a job after
each step, so that any process answers its status from the database and the
main process resumes, when it starts, every job a restart interrupted.

A job's steps must each be safe to repeat: a resumed job repeats at most the
step it was in, and its row's ``result`` records what each step did (and
where a step working in batches got to). A step that fails marks the job
``failed`` with the error; a process that stops ends its jobs between two
steps (:meth:`AdminJobRunner.save` raises :class:`ProcessStopping`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.storage.databases.main.admin_tasks import (
    ACTIVE,
    COMPLETE,
    FAILED,
    UNFINISHED,
    AdminTask,
)

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)


class ProcessStopping(Exception):
    """The process is stopping: the job stops between steps, to be resumed."""


class AdminJobRunner:
    """Runs and resumes the jobs of one ``action``; a process's loop
    (``start``/``stop``), on the main process. Subclasses name the action
    and give its :meth:`steps`."""

    action: str

    def __init__(self, store: GenericWorkerStore) -> None:
        self._store = store
        self._stopping = False
        #: The jobs running in this process, by id.
        self.running: dict[str, defer.Deferred[None]] = {}

    async def steps(self, task: AdminTask, result: dict[str, Any]) -> None:
        """Do (the rest of) ``task``, recording progress in ``result`` and
        calling :meth:`save` after each step."""
        raise NotImplementedError

    def start(self) -> None:
        self._stopping = False
        defer.ensureDeferred(self.resume_unfinished())

    def stop(self) -> None:
        self._stopping = True

    async def resume_unfinished(self) -> None:
        """Run every job left unfinished (by a restart)."""
        for task in await self._store.get_unfinished_admin_tasks(self.action):
            if task.task_id not in self.running:
                logger.info(
                    "resuming the %s job %s of %s", self.action, task.task_id, task.resource_id
                )
                self.launch(task.task_id)

    async def wait(self, task_id: str) -> AdminTask:
        """The job once it has stopped running here (complete or failed)."""
        running = self.running.get(task_id)
        if running is not None:
            waiter: defer.Deferred[None] = defer.Deferred()

            def finished(outcome: object) -> object:
                waiter.callback(None)
                return outcome

            running.addBoth(finished)
            await waiter
        task = await self._store.get_admin_task(task_id)
        assert task is not None
        return task

    def launch(self, task_id: str) -> None:
        running = defer.ensureDeferred(self._run(task_id))
        self.running[task_id] = running

        def finished(outcome: object) -> object:
            self.running.pop(task_id, None)
            return outcome

        running.addBoth(finished)

    async def _run(self, task_id: str) -> None:
        task = await self._store.get_admin_task(task_id)
        if task is None or task.status not in UNFINISHED:
            return
        result = dict(task.result)
        try:
            await self._store.update_admin_task(task_id, ACTIVE, result)
            await self.steps(task, result)
        except ProcessStopping:
            logger.info(
                "the %s job %s stops with the process; it resumes at start", self.action, task_id
            )
            return
        except Exception as e:
            logger.exception("the %s job %s of %s failed", self.action, task_id, task.resource_id)
            await self._store.update_admin_task(task_id, FAILED, result, str(e) or repr(e))
            return
        await self._store.update_admin_task(task_id, COMPLETE, result)
        logger.info("the %s job %s of %s is complete", self.action, task_id, task.resource_id)

    async def save(self, task_id: str, result: dict[str, Any]) -> None:
        """Record a step done; raises :class:`ProcessStopping` if the
        process is stopping."""
        await self._store.update_admin_task(task_id, ACTIVE, result)
        if self._stopping:
            raise ProcessStopping()
