"""The end-to-end encryption keys benchmark: ``python -m bench.e2e_keys``.

For each layout, ``single`` (the main process alone) and ``pair`` (main and a
reader worker, both serving the client API, claims spread over both), on a
fresh database:

* claims per second: one device uploads ``--keys`` one-time keys and a
  fallback key; ``--claimers`` concurrent clients claim until the fallback
  key comes back. Every one-time key must come back exactly once (the run
  fails otherwise: no target is set beyond no lost or repeated key);
* upload + query latency: a device uploads 10 one-time keys, another user
  queries its keys (p50 and p99 of each);
* /sync wake-up for a device list change: a user's /sync is parked; another
  user in a shared room uploads new device keys; the time until the parked
  /sync returns with them in ``device_lists.changed``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import aiohttp

from bench.cluster import Cluster
from bench.scenarios import Client, User, percentile

ALGORITHM = "signed_curve25519"


def one_time_keys(prefix: str, count: int) -> dict[str, Any]:
    return {
        f"{ALGORITHM}:{prefix}{i:07d}": {"key": f"{prefix}{i}", "signatures": {}}
        for i in range(count)
    }


def device_keys(user_id: str, device_id: str, curve: str) -> dict[str, Any]:
    return {
        "user_id": user_id,
        "device_id": device_id,
        "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
        "keys": {f"curve25519:{device_id}": curve, f"ed25519:{device_id}": "ed"},
        "signatures": {user_id: {f"ed25519:{device_id}": "sig"}},
    }


async def device_of(client: Client, base: str, user: User) -> str:
    return str((await client.call("GET", base, "/account/whoami", user))["device_id"])


async def measure_claims(
    client: Client, bases: list[str], target: User, device: str, claimer: User, args: Any
) -> dict[str, Any]:
    every_key = list(one_time_keys("k", args.keys).items())
    for start in range(0, args.keys, 1000):
        keys = dict(every_key[start : start + 1000])
        await client.call("POST", bases[0], "/keys/upload", target, {"one_time_keys": keys})
    fallback = {f"{ALGORITHM}:fallback": {"key": "fb", "fallback": True, "signatures": {}}}
    await client.call("POST", bases[0], "/keys/upload", target, {"fallback_keys": fallback})
    body = {"one_time_keys": {target.user_id: {device: ALGORITHM}}}
    claimed: list[str] = []
    done = asyncio.Event()

    async def claim_until_fallback(index: int) -> None:
        base = bases[index % len(bases)]
        while not done.is_set():
            answer = await client.call("POST", base, "/keys/claim", claimer, body)
            (key_id,) = answer["one_time_keys"][target.user_id][device]
            if key_id.endswith(":fallback"):
                done.set()
                return
            claimed.append(key_id)

    started = time.monotonic()
    await asyncio.gather(*(claim_until_fallback(i) for i in range(args.claimers)))
    seconds = time.monotonic() - started
    distinct = len(set(claimed))
    return {
        "claims_per_s": len(claimed) / seconds,
        "claimed": len(claimed),
        "repeated": len(claimed) - distinct,
        "lost": args.keys - distinct,
    }


async def measure_upload_query(
    client: Client, base: str, uploader: User, querier: User, rounds: int
) -> dict[str, float]:
    uploads, queries = [], []
    for i in range(rounds):
        started = time.monotonic()
        keys = one_time_keys(f"u{i}-", 10)
        await client.call("POST", base, "/keys/upload", uploader, {"one_time_keys": keys})
        uploads.append((time.monotonic() - started) * 1000)
        started = time.monotonic()
        body: dict[str, Any] = {"device_keys": {uploader.user_id: []}}
        await client.call("POST", base, "/keys/query", querier, body)
        queries.append((time.monotonic() - started) * 1000)
    return {
        "upload_p50_ms": percentile(uploads, 0.5),
        "upload_p99_ms": percentile(uploads, 0.99),
        "query_p50_ms": percentile(queries, 0.5),
        "query_p99_ms": percentile(queries, 0.99),
    }


async def measure_device_list_wakeup(
    client: Client, send_base: str, sync_base: str, alice: User, bob: User, rounds: int
) -> float:
    room = (await client.call("POST", send_base, "/createRoom", alice, {"preset": "public_chat"}))[
        "room_id"
    ]
    await client.call("POST", sync_base, f"/join/{room}", bob, {})
    alice_device = await device_of(client, send_base, alice)
    since = (await client.sync(sync_base, bob, None, 0, wide=False))["next_batch"]
    wakeups = []
    for i in range(rounds):
        # Let anything pending (presence, the join) go by first.
        while True:
            answer = await client.sync(sync_base, bob, since, 0, wide=False)
            if answer["next_batch"] == since:
                break
            since = answer["next_batch"]
        parked = asyncio.ensure_future(client.sync(sync_base, bob, since, 10_000, wide=False))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        keys = device_keys(alice.user_id, alice_device, f"curve{i}")
        await client.call("POST", send_base, "/keys/upload", alice, {"device_keys": keys})
        answer = await parked
        while alice.user_id not in answer["device_lists"]["changed"]:
            answer = await client.sync(sync_base, bob, answer["next_batch"], 10_000, wide=False)
        wakeups.append((time.monotonic() - started) * 1000)
        since = answer["next_batch"]
    return percentile(wakeups, 0.5)


async def run_layout(cluster: Cluster, args: Any) -> dict[str, Any]:
    bases = [cluster.url(name) for name in cluster.names]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        client = Client(session)
        target = await client.register(bases[0], "target")
        claimer = await client.register(bases[-1], "claimer")
        device = await device_of(client, bases[0], target)
        result = await measure_claims(client, bases, target, device, claimer, args)
        result.update(await measure_upload_query(client, bases[-1], target, claimer, args.rounds))
        result["wakeup_p50_ms"] = await measure_device_list_wakeup(
            client, bases[0], bases[-1], target, claimer, args.rounds
        )
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.e2e_keys", description=__doc__)
    parser.add_argument("--engine", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--layouts", default="single,pair")
    parser.add_argument("--keys", type=int, default=2000, help="one-time keys to claim")
    parser.add_argument("--claimers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    for layout in args.layouts.split(","):
        cluster = Cluster(layout, args.engine)
        try:
            cluster.start()
            results[layout] = asyncio.run(run_layout(cluster, args))
        finally:
            cluster.stop()
    ok = True
    print(f"engine {args.engine}, {args.keys} one-time keys, {args.claimers} claimers")
    print("layout  claims/s  lost  repeated  upload p50/p99 ms  query p50/p99 ms  wake-up p50 ms")
    for layout, r in results.items():
        ok = ok and r["lost"] == 0 and r["repeated"] == 0
        print(
            f"{layout:7} {r['claims_per_s']:8.0f}  {r['lost']:4}  {r['repeated']:8}"
            f"  {r['upload_p50_ms']:7.1f}/{r['upload_p99_ms']:<8.1f}"
            f"  {r['query_p50_ms']:6.1f}/{r['query_p99_ms']:<8.1f}  {r['wakeup_p50_ms']:6.1f}"
        )
    if "single" in results and "pair" in results:
        ratio = results["pair"]["claims_per_s"] / results["single"]["claims_per_s"]
        print(f"claims/s, 2 processes / 1: {ratio:.2f}")
    print("no lost or repeated key: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
