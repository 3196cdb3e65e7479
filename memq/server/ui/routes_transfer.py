"""A memory out and in: export it as memq's document or DeerFlow's ``memory.json``, import a file
in either format in its place. The service's own operations (``export``, ``import_document``), so
the import is held to the same caps as ``memq import`` and ``PUT /v1/users/{id}/memory``: over
the fact cap, not JSON, or with no readable fact, it is refused in one line and nothing is
written."""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from fastapi.responses import RedirectResponse, Response

from memq.server.ids import ID
from memq.server.ui.access import AdminViewer, Changer
from memq.server.ui.render import path_segment, query

router = APIRouter()
USER = f"/users/{{user_id:{ID}}}"  # one percent-encoded segment: memq/server/ids.py
Format = Literal["memq", "deerflow"]
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def export_filename(user_id: str, agent: str | None, format: Format) -> str:
    """A file name that names the memory but holds nothing a file system or a header could
    misread: every run of other characters is one ``_`` (an id's exact spelling is inside)."""
    parts = [user_id] + ([agent] if agent else [])
    stem = ".".join(_UNSAFE.sub("_", part).strip("._")[:80] or "_" for part in parts)
    return f"{stem}.{format}.json"


@router.get(USER + "/export", name="ui_export")
def export(
    user_id: str,
    page: AdminViewer,
    agent: Annotated[str | None, Query()] = None,
    format: Annotated[Format, Query()] = "memq",
) -> Response:
    """The memory as a file to download, exactly what ``GET /v1/users/{id}/export`` answers."""
    agent_name = agent or None
    document = page.svc.export(page.principal, user_id, agent_name, format=format)
    name = export_filename(user_id, agent_name, format)
    return Response(
        json.dumps(document, ensure_ascii=False, indent=2),
        media_type="application/json",
        headers={"content-disposition": f'attachment; filename="{name}"'},
    )


@router.post(USER + "/import", name="ui_import")
def import_memory(
    user_id: str,
    page: Changer,
    document: Annotated[UploadFile, File()],
    agent: Annotated[str, Form()] = "",
    replace: Annotated[str, Form()] = "",
) -> RedirectResponse:
    """Replace the memory with the uploaded memq or DeerFlow file (the body cap of `memq serve`
    bounds its size before it is read)."""
    agent_name = agent or None
    _imported, cut = page.svc.import_document(
        page.principal, user_id, agent_name, document.file.read(), replace=bool(replace)
    )
    done = "imported-cut" if cut else "imported"
    url = f"{page.base}/users/{path_segment(user_id)}/memory"
    return RedirectResponse(url + query({"agent": agent_name, "done": done}), status_code=303)
