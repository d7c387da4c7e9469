"""Is an MLflow tracking URI usable, checked in a few seconds before anything depends on it?

MLflow itself retries an unreachable server for minutes and creates a SQLite file (and its directory) on first
touch; both are wrong for a user mistake. `check_tracking_uri` answers in at most ``timeout`` seconds and
touches nothing.
"""

from __future__ import annotations

import os
import urllib.parse

from analysis.core.bcrit_error import BcritError

# schemes of the databases MLflow's SQLAlchemy store accepts; the file store is refused by MLflow 3
DB_SCHEMES = ("postgresql", "mysql", "mssql")
TIMEOUT_S = 3.0


class TrackingUriError(BcritError):
    """An unusable tracking URI; the message is one line naming the URI, the problem and the fix."""


def sqlite_path(uri: str) -> str | None:
    """The database file of a ``sqlite:///PATH`` URI (None for other URIs)."""
    if not uri.startswith("sqlite:///"):
        return None
    return uri[len("sqlite:///") :]


def check_tracking_uri(uri: str, *, create: bool, what: str = "tracking URI", timeout: float = TIMEOUT_S) -> None:
    """Raise TrackingUriError unless ``uri`` is usable now. ``create``: the caller will write a new store, so a
    SQLite file may be missing if its directory is writable; otherwise the database must already exist."""
    if not isinstance(uri, str) or not uri.strip():
        raise TrackingUriError(f"{what} must be a URI such as sqlite:///PATH/mlflow.db or http://HOST:PORT")
    path = sqlite_path(uri)
    if path is not None:
        directory = os.path.dirname(path) or "."
        if os.path.isdir(path):
            raise TrackingUriError(f"{what} {uri!r}: {path} is a directory, not a SQLite database file")
        if os.path.exists(path):
            if not os.access(path, os.R_OK | (os.W_OK if create else 0)):
                raise TrackingUriError(f"{what} {uri!r}: {path} is not readable/writable by this user")
            return
        if not create:
            raise TrackingUriError(
                f"{what} {uri!r}: no database at {path} (deleted or never written); pass the URI of the store the "
                "sweep was tracked in"
            )
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
            raise TrackingUriError(f"{what} {uri!r}: directory {directory!r} is missing or not writable")
        return
    scheme = urllib.parse.urlparse(uri).scheme.split("+")[0]
    if scheme in ("http", "https"):
        _check_server(uri, what, timeout)
        return
    if scheme in DB_SCHEMES or scheme == "databricks":
        return  # reachability is the database driver's business; it fails with its own message
    if scheme in ("", "file") or uri.startswith(("/", ".")):
        raise TrackingUriError(
            f"{what} {uri!r}: MLflow 3 refuses the file store; use sqlite:///PATH/mlflow.db or an http:// server"
        )
    raise TrackingUriError(
        f"{what} {uri!r}: unknown scheme {scheme!r}; use sqlite:///PATH/mlflow.db, http(s)://HOST:PORT, or a "
        f"database URI ({', '.join(DB_SCHEMES)})"
    )


def _check_server(uri: str, what: str, timeout: float) -> None:
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as r:  # noqa: S310 - http(s) only
            if r.status >= 400:
                raise OSError(f"HTTP {r.status}")
    except Exception as e:  # noqa: BLE001 - any failure means unreachable
        reason = getattr(e, "reason", None) or e
        raise TrackingUriError(
            f"{what} {uri!r} is unreachable ({reason}); start the MLflow server or pass another --tracking-uri"
        ) from None
