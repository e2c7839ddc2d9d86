"""`python -m skiff_runtime.fetch`: the init step that puts a version's model into the pod before the runtime
starts. Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN: the
Secret the InferenceModel names) and SKIFF_OCI_DOCKER_CONFIG (the .dockerconfigjson of spec.storage.oci.secretName),
never from arguments. On failure it writes `{"reason", "message"}` to the
termination log (the operator reads it into status as ModelFetchFailed) and exits 1; bad arguments exit 2. On
success it writes the result (`{"uri", "digest", "files", "bytes", "reused"}`) there too: the operator reports the
digest in status and pins it, for later pods, in a ConfigMap they read as SKIFF_FETCH_PIN (`{"uri", "digest"}`:
it binds only the URI it names), so that a changed object at the same URI is refused (ChecksumMismatch) rather than
served, and the pod template never changes to carry it. --expect-digest pins by hand."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from skiff_runtime.fetch.delivery import fetch_model
from skiff_runtime.fetch.oci import OciAccess, registry_credentials
from skiff_runtime.fetch.sigv4 import Credentials
from skiff_runtime.fetch.source import FetchError, FetchReason, Limits, OciSource, S3Source, parse_source
from skiff_runtime.fetch.transfer import S3Endpoint, Transport

PIN_ENV = "SKIFF_FETCH_PIN"  # the operator's digest pin ConfigMap's key for this version, {"uri", "digest"}
DOCKER_CONFIG_ENV = "SKIFF_OCI_DOCKER_CONFIG"  # a .dockerconfigjson: the oci:// registry's login


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m skiff_runtime.fetch", description=__doc__)
    p.add_argument("--uri", required=True, help="s3://bucket/prefix, https://host/path (a file or an archive) or "
                   "oci://registry/repository:tag|@sha256:digest")  # fmt: skip
    p.add_argument("--dest", required=True, type=Path, help="the model directory to fill")
    p.add_argument("--sha256", default=env("SKIFF_FETCH_SHA256") or None, help="https://: the file's sha256 (hex)")
    p.add_argument("--s3-endpoint", default=env("SKIFF_S3_ENDPOINT"), help="scheme://host[:port]; default AWS's")
    p.add_argument("--s3-region", default=env("AWS_REGION", "us-east-1"))
    p.add_argument("--ca-file", default=env("SKIFF_FETCH_CA_FILE") or None, help="CA bundle for https")
    p.add_argument("--oci-insecure", action="store_true", default=env("SKIFF_OCI_INSECURE") == "1",
                   help="oci://: speak plain http to the registry (a registry that has no TLS)")  # fmt: skip
    p.add_argument("--max-bytes", type=int, default=int(env("SKIFF_FETCH_MAX_BYTES", str(Limits.max_bytes))))
    p.add_argument("--timeout", type=float, default=float(env("SKIFF_FETCH_TIMEOUT", str(Limits.deadline_seconds))))
    p.add_argument("--expect-digest", default=None, help="refuse a model whose content digest differs (sha256:...)")
    p.add_argument("--pin", default=env(PIN_ENV) or None, help=f'{{"uri", "digest"}} (${PIN_ENV}): --expect-digest '
                   "for that URI only")  # fmt: skip
    p.add_argument("--termination-log", type=Path, default=Path("/dev/termination-log"))
    return p


def pinned_digest(pin: str | None, uri: str) -> str | None:
    """The digest `pin` (`{"uri", "digest"}`, JSON) holds for `uri`; None without a pin or for a pin of another URI
    (the version moved to a new one). A pin that cannot be read refuses the fetch: it never passes unverified."""
    if pin is None:
        return None
    try:
        held = json.loads(pin)
    except ValueError:
        held = None
    if (
        not isinstance(held, dict)
        or not isinstance(held.get("uri"), str)
        or not str(held.get("digest")).startswith("sha256:")
    ):
        raise FetchError(
            FetchReason.CHECKSUM_MISMATCH,
            f'the digest pin ${PIN_ENV} is not {{"uri", "digest": "sha256:..."}}, so the model cannot be '
            "verified: delete the version's key from the model's digest ConfigMap (the operator writes it again)",
        )
    return str(held["digest"]) if held["uri"] == uri else None


def _credentials() -> Credentials | None:
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        return None
    return Credentials(key, secret, os.environ.get("AWS_SESSION_TOKEN") or None)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    limits = Limits(max_bytes=args.max_bytes, deadline_seconds=args.timeout)

    def log(line: str) -> None:
        print(f"fetch: {line}", file=sys.stderr, flush=True)

    try:
        source = parse_source(args.uri, args.sha256)
        expected = args.expect_digest or pinned_digest(args.pin, args.uri)
        endpoint = None
        if isinstance(source, S3Source):
            url = args.s3_endpoint or f"https://s3.{args.s3_region}.amazonaws.com"
            endpoint = S3Endpoint(url.rstrip("/"), args.s3_region, _credentials())
        oci = OciAccess(args.oci_insecure)
        if isinstance(source, OciSource) and os.environ.get(DOCKER_CONFIG_ENV):
            oci = OciAccess(args.oci_insecure, registry_credentials(os.environ[DOCKER_CONFIG_ENV], source.registry))
        result = fetch_model(
            args.uri,
            source,
            args.dest,
            limits=limits,
            transport=Transport(limits, args.ca_file),
            endpoint=endpoint,
            oci=oci,
            expected=expected,
            log=log,
        )
        if expected is not None and result.digest != expected:
            shutil.rmtree(args.dest, ignore_errors=True)  # never leave it for the runtime, nor for a retry to reuse
            raise FetchError(
                FetchReason.CHECKSUM_MISMATCH,
                f"the model at this URI changed: its digest is {result.digest}, the version runs {expected}; "
                "publish the new model at a new URI and point the version (or a new one) at it",
            )
    except FetchError as error:
        log(f"failed: {error}")
        with contextlib.suppress(OSError):
            args.termination_log.write_text(json.dumps({"reason": str(error.reason), "message": error.message}))
        return 2 if error.reason is FetchReason.INVALID_URI else 1
    print(json.dumps(asdict(result)))
    with contextlib.suppress(OSError):
        args.termination_log.write_text(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
