"""A sweep whose ``storage`` is a URI (``s3://bucket/prefix``, or any URI ``pyarrow.fs.FileSystem.from_uri``
understands): the rule, the probe before launch, and the mirror of bcrit's own files. No Ray here.

The rule (docs/cluster.md, "Storage as a URI"): Ray's files -- Tune's experiment (``<URI>/tune``) and each Ray
Train run's checkpoints (``<URI>/train/<trial_id>``) -- are written to the URI by Ray itself, from whichever node
runs the trial. bcrit's own files (spec.yaml, the tables and their parts, the Optuna journal, mlflow_parent.json,
the embedded MLflow store, analysis outputs) live in a local directory of the driver, `local_dir(uri)`, and
``bcrit sweep`` mirrors that directory to ``<URI>/bcrit/`` after each compaction of the tables and at the end
(`Mirror.push`). Every command given the URI first brings the local directory up to date from ``<URI>/bcrit/``
(`Mirror.pull`: what is missing locally or newer there), so ``--resume`` and ``analyze`` work on a machine that never
had the local copy. Only ``bcrit sweep`` writes to the URI.

The newer copy of a file wins, by its modification time on the machine that wrote it (`Mirror`).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import urllib.parse
import uuid

import pyarrow.fs as pafs

from orchestrator.errors import UserError

URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
MIRROR = "bcrit"  # bcrit's own files under <URI>/bcrit/
MANIFEST = ".bcrit-manifest.json"  # in <URI>/bcrit/: what was pushed (Mirror)
LOCAL_ROOT_ENV = "BCRIT_URI_CACHE"  # where the local directories of URI sweeps live (default ~/.cache/bcrit/uri)
CRED_FIX = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or give the nodes an instance role) for the "
    "bucket"
)
ENDPOINT_FIX = (
    "check the endpoint: for an S3-compatible server set AWS_ENDPOINT_URL_S3=http://HOST:PORT or add "
    "?endpoint_override=HOST:PORT&scheme=http to the URI"
)


def is_uri(storage: str) -> bool:
    """``s3://...``, ``gs://...``, ``file://...``: a URI rather than a path of this machine."""
    return bool(URI_RE.match(storage))


def join(uri: str, *parts: str) -> str:
    """``uri`` with path components appended before its query (``s3://b/p?endpoint_override=h`` + ``tune`` ->
    ``s3://b/p/tune?endpoint_override=h``)."""
    u = urllib.parse.urlsplit(uri)
    path = "/".join([u.path.rstrip("/"), *(p.strip("/") for p in parts)])
    return urllib.parse.urlunsplit((u.scheme, u.netloc, path, u.query, u.fragment))


def local_dir(uri: str, root: str | None = None) -> str:
    """The driver's local directory of a URI sweep: ``root`` (default ``$BCRIT_URI_CACHE``, else
    ``~/.cache/bcrit/uri``) / scheme / bucket / prefix -- the same on every machine for the same URI (its query, e.g.
    an endpoint, left out)."""
    u = urllib.parse.urlsplit(uri)
    root = root or os.environ.get(LOCAL_ROOT_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "bcrit", "uri")
    parts = [p for p in (u.netloc + "/" + u.path).split("/") if p and p not in (".", "..")]
    return os.path.join(os.path.abspath(root), u.scheme, *parts)


def _uri_help() -> str:
    return "use s3://BUCKET/PREFIX (gs://, abfs://, hdfs:// also work where pyarrow has them), or a directory path"


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


class Mirror:
    """bcrit's files of a URI sweep: the local directory ``local`` <-> ``<uri>/bcrit/``.

    ``<uri>/bcrit/`` holds a manifest (`MANIFEST`): each file's size and the local modification time (ns) it had
    when pushed. A push uploads the files whose (size, mtime) differ from the manifest, then the manifest; a pull
    downloads the files of the manifest that are missing locally or older here (and gives each the pushed mtime):
    the newer copy wins, on the driver's clock (S3's own times have one-second resolution)."""

    def __init__(self, uri: str, local: str | None = None):
        self.uri = uri
        self.local = os.path.abspath(local or local_dir(uri))
        self._fs = None
        self._root = ""

    @property
    def fs(self):
        if self._fs is None:
            fs, path = resolve(self.uri)
            self._fs, self._root = fs, f"{path}/{MIRROR}"
        return self._fs

    def manifest(self) -> dict[str, list[int]]:
        """relative path -> [size, mtime_ns] of what ``<uri>/bcrit/`` holds ({} when nothing was pushed)."""
        fs = self.fs
        key = f"{self._root}/{MANIFEST}"
        if fs.get_file_info(key).type != pafs.FileType.File:
            return {}
        with fs.open_input_stream(key) as f:
            return json.loads(f.read().decode())

    def _local(self) -> dict[str, list[int]]:
        out = {}
        for d, _, files in os.walk(self.local):
            for name in files:
                if ".tmp-" in name or name.startswith(".bcrit-"):  # a part being written; a probe
                    continue
                p = os.path.join(d, name)
                st = os.stat(p)
                out[os.path.relpath(p, self.local).replace(os.sep, "/")] = [st.st_size, st.st_mtime_ns]
        return out

    def push(self) -> int:
        """Upload the local files that changed since the last push; returns how many."""

        old, now = self.manifest(), self._local()
        sent = [rel for rel, stat in sorted(now.items()) if old.get(rel) != stat]
        for rel in sent:
            with (
                open(os.path.join(self.local, rel), "rb") as src,
                self.fs.open_output_stream(f"{self._root}/{rel}") as dst,
            ):
                dst.write(src.read())
        if sent or set(old) - set(now):
            self._write_manifest({**old, **now})
        return len(sent)

    def _write_manifest(self, manifest: dict[str, list[int]]) -> None:
        with self.fs.open_output_stream(f"{self._root}/{MANIFEST}") as f:
            f.write(json.dumps(manifest, sort_keys=True).encode())

    def remove(self, prefix: str) -> int:
        """Delete the pushed files under ``prefix`` (relative, e.g. ``parts/<trial_id>/``) at the URI and from the
        manifest, so that a pull no longer brings back what was removed here; returns how many."""
        old = self.manifest()
        gone = [rel for rel in old if rel.startswith(prefix)]
        for rel in gone:
            try:
                self.fs.delete_file(f"{self._root}/{rel}")
            except FileNotFoundError:
                pass
        if gone:
            self._write_manifest({k: v for k, v in old.items() if k not in gone})
        return len(gone)

    def pull(self) -> int:
        """Download the pushed files that are missing here or older here; returns how many."""
        here, n = self._local(), 0
        for rel, (size, mtime_ns) in sorted(self.manifest().items()):
            mine = here.get(rel)
            if mine is not None and (mine == [size, mtime_ns] or mine[1] > mtime_ns):
                continue
            path = os.path.join(self.local, *rel.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{os.getpid()}"
            with self.fs.open_input_stream(f"{self._root}/{rel}") as src, open(tmp, "wb") as dst:
                dst.write(src.read())
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
            os.replace(tmp, path)
            n += 1
        return n


def exists(uri: str, *parts: str) -> bool:
    """Whether a file ``<uri>/<parts>`` exists."""
    fs, path = resolve(uri)
    return fs.get_file_info("/".join([path, *parts])).type == pafs.FileType.File


def glob_names(uri: str, sub: str) -> list[str]:
    """Names of the files directly in ``<uri>/<sub>`` (empty when absent)."""
    fs, path = resolve(uri)
    info = fs.get_file_info(pafs.FileSelector(f"{path}/{sub}", allow_not_found=True))
    return [i.base_name for i in info if i.type == pafs.FileType.File]


def remove_dirs(uri: str, *subs: str) -> None:
    """Delete ``<uri>/<sub>`` for each sub (absent ones are fine)."""
    fs, path = resolve(uri)
    for sub in subs:
        fs.delete_dir_contents(f"{path}/{sub}", missing_dir_ok=True)


# --- proposed (hang 2) ---
GCS_RETRY_S = 4.0  # gs://: how long google-cloud-cpp retries a call (it ends at its next backoff: 4.2-5.4 s measured)

S3_REQUEST_TIMEOUT_S = 5.0

S3_CONNECT_TIMEOUT_S = 3.0

FIRST_CONTACT_S = 12.0  # hard deadline of the first round trip (probe, fetch), whatever the SDK does underneath

GCS_CRED_FIX = (
    "set GOOGLE_APPLICATION_CREDENTIALS=/path/to/key.json (or run `gcloud auth application-default login`; on GCE/GKE "
    "give the nodes a service account), and check that Google Cloud can be reached from here"
)

GCS_NET_FIX = (
    "check the network to storage.googleapis.com (or the server in ?endpoint_override=HOST:PORT&scheme=http) "
    "and the credentials (GOOGLE_APPLICATION_CREDENTIALS)"
)


def _is_gcs(uri: str) -> bool:
    return urllib.parse.urlsplit(uri).scheme.lower() in ("gs", "gcs")


def filesystem(uri: str):
    """``(pyarrow FileSystem, path in it)`` of a URI, its network waits bounded; one UserError line for a URI pyarrow
    cannot use. The URI's query options keep working (``?endpoint_override=``, ``scheme=``, ``region=``, ...), and
    so do the environment's (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, ``AWS_REGION``, credentials): pyarrow
    reads them as before.

    - ``gs://``: ``retry_limit_seconds=GCS_RETRY_S`` is added to the query unless the URI sets it (pyarrow's GCS
      option; the default is google-cloud-cpp's, minutes, and it retries even a missing credential).
    - ``s3://``: the S3FileSystem from_uri built is rebuilt from its own options (its pickling state) with
      ``connect_timeout``, ``request_timeout`` (a stall timeout: no byte for that long, not a cap on a transfer) and
      2 attempts -- the query cannot carry these.
    """
    u = urllib.parse.urlsplit(uri)
    target = uri
    if _is_gcs(uri) and "retry_limit_seconds" not in urllib.parse.parse_qs(u.query):
        query = f"{u.query}&" if u.query else ""
        target = urllib.parse.urlunsplit(
            (u.scheme, u.netloc, u.path, f"{query}retry_limit_seconds={GCS_RETRY_S:g}", u.fragment)
        )
    try:
        fs, path = pafs.FileSystem.from_uri(target)
    except ValueError as e:  # ArrowInvalid: a URI pyarrow cannot use (unknown scheme or query option)
        raise UserError(f"storage {uri!r} is not a URI pyarrow.fs can open ({_first_line(e)}); {_uri_help()}") from None
    except OSError as e:  # s3:// without region or endpoint: from_uri asks AWS for the bucket's region
        raise UserError(explain(uri, e)) from None
    if isinstance(fs, pafs.S3FileSystem):
        options = dict(fs.__reduce__()[1][0])  # what from_uri derived: endpoint, scheme, region, ...
        if options.get("connect_timeout", -1) < 0:
            options["connect_timeout"] = S3_CONNECT_TIMEOUT_S
        if options.get("request_timeout", -1) < 0:
            options["request_timeout"] = S3_REQUEST_TIMEOUT_S
        fs = pafs.S3FileSystem(**options, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2))
    return fs, path.rstrip("/")


def resolve(uri: str):
    """``(pyarrow FileSystem, path in it)`` of a URI (:func:`filesystem`); one UserError line for one that pyarrow
    cannot use."""
    return filesystem(uri)


def unreachable_fix(uri: str) -> str:
    return GCS_NET_FIX if _is_gcs(uri) else f"{ENDPOINT_FIX}; or check the network and the credentials"


def within(seconds: float, uri: str, fn, *args):
    """``fn(*args)`` with a hard deadline: a storage that has not answered in ``seconds`` is one UserError line
    (the call is left to finish in a daemon thread; the command ends). Whatever ``fn`` raises is raised here."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    worker = threading.Thread(target=run, name="bcrit-storage-contact", daemon=True)
    worker.start()
    worker.join(seconds)  # Ctrl-C still interrupts this wait (it does not interrupt a pyarrow call)
    if worker.is_alive():
        raise UserError(f"storage {uri!r}: no answer within {seconds:g} s; {unreachable_fix(uri)}")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _gcs_why(text: str) -> str:
    """The useful words of a google-cloud-cpp Status (its first line runs to hundreds of characters)."""
    curl = re.search(r"CURL error \[\d+\]=([^\n]+?)(?: error_info=|$)", text)
    if "OAuth2 access token" in text:
        return "no access token" + (f": {curl.group(1).strip()}" if curl else "")
    if curl:
        return curl.group(1).strip()
    m = re.search(r"Status\((\w+): ([^\n]{0,120})", text)
    return f"{m.group(1)}: {m.group(2)}" if m else _first_line(Exception(text))


def explain(uri: str, e: BaseException) -> str:
    """One line saying what an error of the storage means and how to fix it."""
    text = str(e)
    bucket = urllib.parse.urlsplit(uri).netloc
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text or "bucket does not exist" in text:
        mb = f"gcloud storage buckets create gs://{bucket}" if _is_gcs(uri) else f"aws s3 mb s3://{bucket}"
        return f"storage {uri!r}: bucket {bucket!r} does not exist; create it ({mb}) or fix the URI"
    if _is_gcs(uri):
        why = _gcs_why(text)
        if "OAuth2 access token" in text or "UNAUTHENTICATED" in text:
            return f"storage {uri!r}: no usable Google Cloud credentials ({why}); {GCS_CRED_FIX}"
        if "PERMISSION_DENIED" in text:
            return f"storage {uri!r}: access refused ({why}); give the credentials' account access to gs://{bucket}"
        if "UNAVAILABLE" in text or "CURL error" in text or "DEADLINE_EXCEEDED" in text:
            return f"storage {uri!r}: Google Cloud Storage cannot be reached ({why}); {GCS_NET_FIX}"
        return f"storage {uri!r} cannot be written and read back ({why}); check the URI, network and credentials"
    if any(k in text for k in ("NETWORK_CONNECTION", "curlCode", "Could not connect", "Could not resolve host")):
        return f"storage {uri!r}: the storage endpoint cannot be reached ({_first_line(e)}); {ENDPOINT_FIX}"
    if any(
        k in text
        for k in ("ACCESS_DENIED", "AccessDenied", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "credential")
    ):
        return f"storage {uri!r}: access refused ({_first_line(e)}); {CRED_FIX}"
    why = _first_line(e)
    return f"storage {uri!r} cannot be written and read back ({why}); check the URI, endpoint and credentials"


def probe(uri: str) -> None:
    """Write a small object under the URI, read it back and delete it; one UserError line naming the fix if any
    step fails (missing bucket, unreachable endpoint, refused credentials) or no answer comes within
    ``FIRST_CONTACT_S``. Run before anything launches."""
    within(FIRST_CONTACT_S, uri, _probe, uri)


def _probe(uri: str) -> None:
    fs, path = resolve(uri)
    token = uuid.uuid4().hex
    key = f"{path}/.bcrit-probe-{token}"
    try:
        with fs.open_output_stream(key) as f:
            f.write(token.encode())
        with fs.open_input_stream(key) as f:
            seen = f.read().decode()
        fs.delete_file(key)
    except OSError as e:
        raise UserError(explain(uri, e)) from None
    if seen != token:
        raise UserError(f"storage {uri!r} returned other bytes than were written; check the URI and endpoint")


def fetch(uri: str) -> str:
    """The local directory of a URI sweep, brought up to date from ``<uri>/bcrit/`` (`Mirror.pull`), for the
    commands that read a sweep (``bcrit analyze URI``). One UserError line when the URI cannot be read (within
    ``FIRST_CONTACT_S``) or holds no bcrit sweep."""
    m = Mirror(uri)
    try:
        if not within(FIRST_CONTACT_S, uri, m.manifest):  # the first round trip: bounded whatever the SDK does
            raise UserError(f"{uri}: holds no bcrit sweep (nothing in {join(uri, MIRROR)}/); check the URI")
        n = m.pull()
    except OSError as e:
        raise UserError(explain(uri, e)) from None
    print(f"[bcrit] {join(uri, MIRROR)}/ -> {m.local} ({n} files fetched)", file=sys.stderr)
    return m.local
