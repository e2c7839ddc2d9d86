"""Reads the pods' own metrics: the model's Deployments, ReplicaSets and Pods are listed (label-selected), and each
pod whose owner chain reaches a version's Deployment is read at its pod IP (skiff_operator.scrape decides which)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

import aiohttp

from skiff_operator import names
from skiff_operator.contract import METRICS_PORT
from skiff_operator.kinds import DEPLOYMENT, POD, REPLICA_SET
from skiff_operator.kube.client import Client
from skiff_operator.observed import MetricsScrape
from skiff_operator.prometheus import Counts, ExpositionError, ExpositionReader, LineTooLong, PageTooLarge, add
from skiff_operator.scrape import (
    MAX_LINE_BYTES,
    MAX_PAGE_BYTES,
    SCRAPE_CONCURRENCY,
    SCRAPE_TIMEOUT_S,
    Refusal,
    ScrapeFailure,
    deployment_uids,
    metrics_targets,
)
from skiff_operator.spec import InferenceModel

_log = logging.getLogger(__name__)


class Pods(Client):
    """Scrapes the metrics of a model's pods."""

    metrics_port = METRICS_PORT  # where scrape_metrics reads pods (the runtime contract's; a test serves elsewhere)

    async def scrape_metrics(self, model: InferenceModel, versions: Collection[str]) -> MetricsScrape:
        """The inference counters of each of `versions`, summed over its running pods, read straight from each
        pod's metrics port at its pod IP (not through the API server's pod proxy: docs/canary.md says why). Only
        pods whose owner chain reaches the version's Deployment uid are read (scrape.metrics_targets): the model's
        Deployments, ReplicaSets and Pods are listed at once, label-selected."""
        namespace = model.ref.namespace
        selector = f"{names.MODEL_LABEL}={names.fit_name(model.ref.name)}"
        wanted = [v for v in model.spec.versions if v.name in versions]
        deployment_names = {names.fit_name(v.name): names.deployment_name(model.ref.name, v.name) for v in wanted}
        versions_by_label = {names.fit_name(v.name): v.name for v in wanted}
        deployments, replica_sets, pods = await asyncio.gather(
            *(self._list(k.api_version, k.kind, namespace, selector) for k in (DEPLOYMENT, REPLICA_SET, POD))
        )
        uids = deployment_uids(deployments, deployment_names, model.ref.uid)
        targets = metrics_targets(pods, replica_sets, uids, versions_by_label)
        return await scrape_targets(targets, self.metrics_port, versions)


async def scrape_targets(
    targets: Collection[tuple[str, str, str]],
    port: int,
    versions: Collection[str],
    *,
    timeout_s: float = SCRAPE_TIMEOUT_S,
) -> MetricsScrape:
    """GET http://<ip>:<port>/metrics of every target (SCRAPE_CONCURRENCY at once); per version the sum, or why a
    pod failed, in the operator's own words (scrape.Refusal): a pod's reply never reaches status or an Event."""
    limit = asyncio.Semaphore(SCRAPE_CONCURRENCY)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True),  # one request per pod: nothing to keep alive
        cookie_jar=aiohttp.DummyCookieJar(),  # a pod's Set-Cookie is not kept (nor sent to the next pod)
        headers={"Accept-Encoding": "identity"},
        auto_decompress=False,  # a compressed body is refused, never inflated
        max_field_size=4096,
        max_headers=32,
        trust_env=False,  # no proxy, no ~/.netrc
    )
    async with session:
        pages = await asyncio.gather(*(_scrape(session, limit, ip, port, timeout_s) for _, _, ip in targets))
    per_version: dict[str, list[Counts]] = {version: [] for version in versions}
    problems: dict[str, str] = {}
    for (version, pod, ip), page in zip(targets, pages, strict=True):
        if isinstance(page, Counts):
            per_version.setdefault(version, []).append(page)
        else:
            problems.setdefault(version, f"pod {pod} ({_host(ip)}:{port}): {page}")
    read = {v: len(counts) for v, counts in per_version.items()}
    return MetricsScrape({v: add(counts) for v, counts in per_version.items()}, problems, read)


async def _scrape(
    session: aiohttp.ClientSession, limit: asyncio.Semaphore, ip: str, port: int, timeout_s: float
) -> Counts | Refusal:
    """One pod's counters, or why they could not be read. Never raises (but for cancellation): whatever one pod
    does fails that pod's read, not the reconcile."""
    async with limit:
        try:
            async with asyncio.timeout(timeout_s):  # connect, headers and the whole body
                url = f"http://{_host(ip)}:{port}/metrics"
                async with session.get(url, allow_redirects=False) as response:
                    return await _read_page(response)
        except TimeoutError:
            return Refusal(ScrapeFailure.TIMED_OUT)
        except LineTooLong:
            return Refusal(ScrapeFailure.LINE_TOO_LONG)
        except PageTooLarge:
            return Refusal(ScrapeFailure.PAGE_TOO_LARGE)
        except ExpositionError:
            return Refusal(ScrapeFailure.NOT_PROMETHEUS)
        except aiohttp.ClientConnectionError as error:
            connected = not isinstance(error, aiohttp.ClientConnectorError)
            return Refusal(ScrapeFailure.BROKEN if connected else ScrapeFailure.UNREACHABLE)
        except Exception as error:  # a malformed reply (aiohttp.ClientResponseError, ...) or anything else
            _log.warning("metrics of %s:%s unreadable: %s", _host(ip), port, type(error).__name__)
            return Refusal(ScrapeFailure.BROKEN)


async def _read_page(response: aiohttp.ClientResponse) -> Counts | Refusal:
    """The counters of a reply, refused before the body when its headers already say no: a redirect (never
    followed: it could point anywhere), another status, a compressed body, a Content-Length over the cap."""
    if 300 <= response.status < 400:
        return Refusal(ScrapeFailure.REDIRECT)
    if response.status != 200:  # the one status that carries a page
        return Refusal(ScrapeFailure.HTTP_STATUS, response.status)
    if response.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity"):
        return Refusal(ScrapeFailure.COMPRESSED)
    if response.content_length is not None and response.content_length > MAX_PAGE_BYTES:
        return Refusal(ScrapeFailure.PAGE_TOO_LARGE)
    reader = ExpositionReader(MAX_PAGE_BYTES, MAX_LINE_BYTES)
    async for chunk in response.content.iter_any():  # the cap holds while streaming, with or without a length
        reader.feed(chunk)
    return reader.close()


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip
