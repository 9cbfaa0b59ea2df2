"""The student's web routes, served by the app's own server (no Gradio page, no model):

    GET  /poll                  type the class code (or /poll?code=ABC123 -> /poll/ABC123)
    GET  /poll/<code>           the poll page for phones (a clear page for an unknown or expired code)
    GET  /poll/<code>/state     JSON: the question on screen, the device's own answer (?device=...)
    POST /poll/<code>/answer    JSON {"question": id, "choice": i, "device": token} -> the new state

`python app.py` passes them to Gradio's FastAPI app: `demo.launch(app_kwargs=poll_app_kwargs())`.
There are no teacher routes: the teacher steers from the lesson (app/lesson/poll_panel.py) with the poll's key.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from app.poll.store import PollError, PollNotFound, PollStore, default_store, normal_code
from app.poll.student import join_page, message_page, student_page, student_state

MAX_BODY_BYTES = 1024   # an answer is ~100 bytes
NO_STORE = {"Cache-Control": "no-store"}


def _refusal(err: PollError) -> JSONResponse:
    return JSONResponse({"error": str(err)}, status_code=err.status, headers=NO_STORE)


async def _body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes | None:
    """The request body, or None when it is over `limit` bytes (read no further than that)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        return None
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            return None
    return bytes(data)


def poll_router(store: PollStore | None = None) -> APIRouter:
    """The routes above over `store` (default: the app's store, opened at the first request)."""
    router = APIRouter()
    get_store = (lambda: store) if store is not None else default_store

    @router.get("/poll", response_class=HTMLResponse)
    def join(request: Request, code: str = ""):
        if code:
            return RedirectResponse(f"{request.url.path.rstrip('/')}/{normal_code(code)}", status_code=303)
        return HTMLResponse(join_page(), headers=NO_STORE)

    @router.get("/poll/{code}", response_class=HTMLResponse)
    def page(request: Request, code: str):
        home = request.url.path.rstrip("/").rsplit("/", 1)[0] or "/poll"
        try:
            state = student_state(get_store(), code, None)
        except PollNotFound:
            return HTMLResponse(message_page("No poll with this code", f"There is no class poll “{normal_code(code)}”. "
                                             "Check the code on the projector and type it again.", home),
                                status_code=404, headers=NO_STORE)
        if state["status"] == "expired":
            return HTMLResponse(message_page("This poll has expired", f"Class poll {state['code']} is over (codes "
                                             "last 3 hours). Ask your teacher for the new code.", home),
                                status_code=410, headers=NO_STORE)
        return HTMLResponse(student_page(state), headers=NO_STORE)

    @router.get("/poll/{code}/state")
    def state(code: str, device: str = ""):
        try:
            return JSONResponse(student_state(get_store(), code, device[:64] or None), headers=NO_STORE)
        except PollError as err:
            return _refusal(err)

    @router.post("/poll/{code}/answer")
    async def answer(request: Request, code: str):
        raw = await _body(request)
        if raw is None:
            return JSONResponse({"error": f"an answer is at most {MAX_BODY_BYTES} bytes"}, status_code=413,
                                headers=NO_STORE)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return JSONResponse({"error": "the body must be JSON: {\"question\": id, \"choice\": i, \"device\": "
                                          "token}"}, status_code=400, headers=NO_STORE)
        if not isinstance(body, dict):
            return JSONResponse({"error": "the body must be a JSON object"}, status_code=400, headers=NO_STORE)
        store, device = get_store(), body.get("device")
        try:
            await run_in_threadpool(store.answer, code, device, body.get("question"), body.get("choice"))
            return JSONResponse({"ok": True, "state": await run_in_threadpool(student_state, store, code, device)},
                                headers=NO_STORE)
        except PollError as err:
            return _refusal(err)

    return router


def poll_app_kwargs(store: PollStore | None = None) -> dict:
    """Keyword arguments for `demo.launch(app_kwargs=...)`: Gradio passes them to its FastAPI app, whose
    `routes` then start with the poll's."""
    return {"routes": list(poll_router(store).routes)}
