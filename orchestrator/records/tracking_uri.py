"""The MLflow tracking URI checked before launch: a SQLite file bcrit can create, or a server that answers."""

from __future__ import annotations

from analysis.sources.mlflow_uri import TrackingUriError, check_tracking_uri
from orchestrator.errors import UserError


def check_tracking(uri: str) -> None:
    """The tracking URI must be usable now: a SQLite file we can create, or a server that answers within seconds."""
    try:
        check_tracking_uri(uri, create=True, what="tracking.mlflow_uri")
    except TrackingUriError as e:
        raise UserError(f"{e} (or unset tracking.mlflow_uri to use the embedded SQLite store)") from None
