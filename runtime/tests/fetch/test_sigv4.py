"""Signature V4 against AWS's own published examples (S3 API reference, "Examples: Signature Calculations")."""

from __future__ import annotations

import datetime

from skiff_runtime.fetch.sigv4 import EMPTY_SHA256, Credentials, object_path, sign

AWS_EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
WHEN = datetime.datetime(2013, 5, 24, tzinfo=datetime.UTC)
HOST = "examplebucket.s3.amazonaws.com"


def test_get_object_with_range_matches_aws_example() -> None:
    headers = sign(
        method="GET",
        host=HOST,
        path="/test.txt",
        query={},
        headers={"Range": "bytes=0-9"},
        payload_sha256=EMPTY_SHA256,
        credentials=AWS_EXAMPLE,
        region="us-east-1",
        now=WHEN,
    )
    assert headers["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["x-amz-date"] == "20130524T000000Z"


def test_list_objects_matches_aws_example() -> None:
    headers = sign(
        method="GET",
        host=HOST,
        path="/",
        query={"max-keys": "2", "prefix": "J"},
        headers={},
        payload_sha256=EMPTY_SHA256,
        credentials=AWS_EXAMPLE,
        region="us-east-1",
        now=WHEN,
    )
    assert headers["authorization"].endswith(
        "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
    )


def test_secret_never_in_repr() -> None:
    assert "EXAMPLEKEY" not in repr(AWS_EXAMPLE)
    assert "wJal" not in repr(AWS_EXAMPLE)


def test_object_path_escapes_like_s3() -> None:
    assert object_path("models", "a b/c+d.pdiparams") == "/models/a%20b/c%2Bd.pdiparams"
