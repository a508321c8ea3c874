"""Every link in a flow run's markdown artifacts lands on the content it names, checked against the
Prefect server the run reported to: a link opens an artifact's own page (``/artifacts/artifact/<id>``,
on this server's UI when it names one), not a key's history page one click short of it; the
artifact exists there, belongs to the same flow run, and is the one the link's text names (its key)."""

from __future__ import annotations

import re
import urllib.parse
import uuid
from typing import Any

#: A markdown link that is not an image (``![...]`` embeds a chart or a picture).
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")
ARTIFACT_PAGE = re.compile(r"/artifacts/artifact/([0-9a-f-]{36})")


def flow_run_artifacts(flow_run_id: Any) -> list[Any]:
    """Every artifact the flow run (its task runs included) made."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )


def assert_links_land(flow_run_id: Any) -> list[tuple[str, str]]:
    """Check every link of the flow run's markdown artifacts; return them as (from key, to key)."""
    import prefect.settings

    artifacts = flow_run_artifacts(flow_run_id)
    by_id = {artifact.id: artifact for artifact in artifacts}
    ui = urllib.parse.urlsplit(prefect.settings.PREFECT_UI_URL.value() or "")
    landed = []
    for artifact in (a for a in artifacts if a.type == "markdown"):
        for text, target in LINK.findall(artifact.data):
            where = urllib.parse.urlsplit(target)
            assert (where.scheme, where.netloc) in {("", ""), (ui.scheme, ui.netloc)}, (
                f"{artifact.key}: [{text}]({target}) leaves this server's UI ({ui.geturl()})"
            )
            page = ARTIFACT_PAGE.fullmatch(where.path)
            assert page, f"{artifact.key}: [{text}]({target}) does not open an artifact's own page"
            linked = by_id.get(uuid.UUID(page.group(1)))
            assert linked is not None, f"{artifact.key}: [{text}]({target}) names no artifact of this flow run"
            assert linked.key == text and linked.data, (artifact.key, text, linked.key)
            landed.append((artifact.key, linked.key))
    return landed
