"""A FastAPI app that enqueues a task in a request and streams its result when ready.

    POST /reports?month=7       -> {"id": 12, "events": "/reports/12/events"}
    GET  /reports/12/events     -> Server-Sent Events: "pending", then "done" with the result
    GET  /reports/12?wait=5     -> a long poll: the result, or 202 if not finished in 5 s

Run it with a worker beside it:

    DURABLESCHED_DB=reports.db uvicorn --factory examples.fastapi.app:main
    durablesched worker --app examples.fastapi.app:registry --db reports.db
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse, StreamingResponse

from durablesched import Scheduler, SQLiteStore, TaskFailed, TaskNotFoundError, TaskRegistry

registry = TaskRegistry()


@registry.task("reports.build")
def build_report(month: int, *, region: str = "all") -> dict[str, object]:
    """The slow work a request should not wait for (here: a few sums)."""
    return {"month": month, "region": region, "total": sum(range(month * 1000))}


def create_app(db: str) -> FastAPI:
    """The app on the database ``db`` (a path or URL): every request shares one scheduler,
    whose one waiting thread serves every handle the streams wait on."""
    scheduler = Scheduler(SQLiteStore(db), registry=registry)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        scheduler.close()  # the waiting thread and its watcher
        scheduler.store.close()

    app = FastAPI(title="reports", lifespan=lifespan)

    @app.post("/reports")
    async def enqueue(month: int, region: str = "all") -> dict[str, object]:
        handle = await scheduler.aenqueue(build_report, month, region=region)
        return {"id": handle.id, "events": f"/reports/{handle.id}/events"}

    @app.get("/reports/{task_id}/events")
    async def events(task_id: int) -> StreamingResponse:
        handle = scheduler.handle(task_id, build_report)

        async def stream() -> AsyncIterator[str]:
            yield _event("pending", {"id": task_id, "state": (await handle.astate()).value})
            try:
                result = await handle
            except TaskFailed as e:
                yield _event("failed", {"id": task_id, "error": e.error and e.error.message})
                return
            yield _event("done", {"id": task_id, "result": result})

        try:
            await handle.arecord()
        except TaskNotFoundError:
            raise HTTPException(404, f"no report {task_id}") from None
        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.get("/reports/{task_id}", response_model=None)
    async def long_poll(task_id: int, wait: float = 0.0) -> dict[str, object] | JSONResponse:
        handle = scheduler.handle(task_id, build_report)
        try:
            return {"id": task_id, "result": await handle.aresult(timeout=min(wait, 30.0))}
        except TimeoutError:
            state = (await handle.astate()).value
            return JSONResponse({"id": task_id, "state": state}, status_code=202)
        except TaskNotFoundError:
            raise HTTPException(404, f"no report {task_id}") from None
        except TaskFailed as e:
            raise HTTPException(500, f"report {task_id} failed: {e}") from None

    return app


def _event(name: str, data: object) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def main() -> FastAPI:
    """The app for ``uvicorn --factory``, on the database ``DURABLESCHED_DB`` names."""
    return create_app(os.environ.get("DURABLESCHED_DB", "reports.db"))
