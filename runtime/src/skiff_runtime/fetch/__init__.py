"""Model delivery: fetch a version's model from where users keep it (s3://, https://) into the pod's model
directory before the runtime starts, bounded in size and time, verified, and named by a content digest.

source (pure: what a URI means, the limits, the closed set of failure reasons) -> transfer (the only network I/O:
S3 with Signature V4, HTTPS, resumable with Range) -> archive (safe extraction) -> digest (what was loaded).
`python -m skiff_runtime.fetch` is the init step's entry point.
"""
