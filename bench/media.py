"""The media repository's speed and memory, against copying the same file on
the same disk in the same run.

    python -m bench.media [--engine sqlite|postgres] [--runs-1mb 15] [--runs-50mb 5]

Launches the main process and a media worker (``media_instance: media1``) as
OS processes, registers a user, then measures:

* upload and download throughput of 1 MB and 50 MB files (median of the runs),
  each as a ratio to copying the file on the disk the media store is on
  (``shutil.copyfile`` then ``fsync``, as an upload ends; a download is
  written to that disk and synced too). Target: download ratio at least 0.3;
* thumbnail latency: a thumbnail made on demand (a size not made after the
  upload) of a 2000x1500 JPEG and a 1000x1000 PNG, and a thumbnail already
  made (median of the runs);
* the media worker's resident memory idle, and its peak (sampled every 10 ms,
  and the kernel's high-water mark) during a 100 MB upload and a 100 MB
  download: the bodies are streamed, so the peak stays near idle.

Prints the figures and PASS/FAIL; asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import shutil
import statistics
import time

from PIL import Image

from bench.cluster import Cluster
from tests.harness.blocking_http import http_request
from tests.harness.process_memory import RssSampler

MB = 1024 * 1024


class MediaBench:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.main = cluster.url("main")
        self.media = cluster.url("media1")
        self.work_dir = os.path.join(cluster.dir, "data")  # the media store's disk
        code, body = http_request(
            self.main,
            "POST",
            "/_matrix/client/v3/register",
            json.dumps({"username": "bench", "password": "pw", "auth": {"type": "m.login.dummy"}}),
            {"Content-Type": "application/json"},
        )
        assert code == 200, body
        self.token = json.loads(body)["access_token"]

    def auth(self, **headers: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **headers}

    def make_file(self, size: int) -> str:
        path = os.path.join(self.work_dir, f"source-{size}")
        with open(path, "wb") as f:
            for _ in range(size // MB):
                f.write(secrets.token_bytes(MB))
        return path

    def copy(self, source: str) -> float:
        target = source + ".copy"
        start = time.perf_counter()
        shutil.copyfile(source, target)
        with open(target, "rb+") as f:
            os.fsync(f.fileno())
        elapsed = time.perf_counter() - start
        os.unlink(target)
        return elapsed

    def upload(
        self, source: str, content_type: str = "application/octet-stream"
    ) -> tuple[float, str]:
        size = os.path.getsize(source)
        with open(source, "rb") as f:
            start = time.perf_counter()
            code, body = http_request(
                self.media,
                "POST",
                "/_matrix/media/v3/upload",
                f,
                self.auth(**{"Content-Type": content_type, "Content-Length": str(size)}),
            )
            elapsed = time.perf_counter() - start
        assert code == 200, body
        return elapsed, json.loads(body)["content_uri"]

    def download(self, uri: str, size: int) -> float:
        target = os.path.join(self.work_dir, "downloaded")
        with open(target, "wb") as sink:
            start = time.perf_counter()
            code, _ = http_request(
                self.media,
                "GET",
                "/_matrix/client/v1/media/download/" + uri.removeprefix("mxc://"),
                headers=self.auth(),
                sink=sink,
            )
            sink.flush()
            os.fsync(sink.fileno())
            elapsed = time.perf_counter() - start
        assert code == 200 and os.path.getsize(target) == size, code
        os.unlink(target)
        return elapsed

    def thumbnail(self, uri: str, query: str) -> float:
        start = time.perf_counter()
        code, body = http_request(
            self.media,
            "GET",
            "/_matrix/client/v1/media/thumbnail/" + uri.removeprefix("mxc://") + "?" + query,
            headers=self.auth(),
        )
        elapsed = time.perf_counter() - start
        assert code == 200, body[:200]
        return elapsed


def _image(fmt: str, width: int, height: int) -> bytes:
    # Noise, so the encoders have real work (a flat image compresses to nothing).
    image = Image.frombytes("RGB", (width, height), secrets.token_bytes(width * height * 3))
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


def _rate(size: int, seconds: float) -> float:
    return size / MB / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--runs-1mb", type=int, default=15)
    parser.add_argument("--runs-50mb", type=int, default=5)
    parser.add_argument("--runs-thumbnail", type=int, default=7)
    args = parser.parse_args()

    cluster = Cluster(
        "media",
        args.engine,
        {"media_instance": "media1", "media": {"max_upload_size": "200M"}},
    )
    try:
        cluster.start()
        bench = MediaBench(cluster)
        print(f"media bench: {args.engine}, store in {bench.work_dir}")
        print(
            f"{'file':>6} {'copy MB/s':>10} {'upload MB/s':>12} {'ratio':>6}"
            f" {'download MB/s':>14} {'ratio':>6}"
        )
        download_ratios = []
        for size, runs in ((MB, args.runs_1mb), (50 * MB, args.runs_50mb)):
            source = bench.make_file(size)
            copies, uploads, downloads = [], [], []
            for _ in range(runs):
                # Interleaved, so a change in load hits all three alike.
                copies.append(bench.copy(source))
                elapsed, uri = bench.upload(source)
                uploads.append(elapsed)
                downloads.append(bench.download(uri, size))
            copy_rate = _rate(size, statistics.median(copies))
            up_rate = _rate(size, statistics.median(uploads))
            down_rate = _rate(size, statistics.median(downloads))
            download_ratios.append(down_rate / copy_rate)
            print(
                f"{size // MB:>4}MB {copy_rate:>10.0f} {up_rate:>12.0f} {up_rate / copy_rate:>6.2f}"
                f" {down_rate:>14.0f} {down_rate / copy_rate:>6.2f}"
            )
            os.unlink(source)
        hwm_after_transfers = RssSampler(cluster.processes["media1"].pid).status_kb("VmHWM")
        worst = min(download_ratios)
        print(f"download ratio >= 0.3: {'PASS' if worst >= 0.3 else 'FAIL'} (worst {worst:.2f})")

        print("thumbnail latency (ms, median):")
        for fmt, content_type, width, height in (
            ("JPEG", "image/jpeg", 2000, 1500),
            ("PNG", "image/png", 1000, 1000),
        ):
            path = os.path.join(bench.work_dir, "image")
            with open(path, "wb") as f:
                f.write(_image(fmt, width, height))
            on_demand, cached = [], []
            for _ in range(args.runs_thumbnail):
                _, uri = bench.upload(path, content_type)
                # Not made after the upload: animated variants are made on
                # demand (a still image gives a still thumbnail).
                on_demand.append(bench.thumbnail(uri, "width=320&height=240&animated=true"))
                cached.append(bench.thumbnail(uri, "width=320&height=240&animated=true"))
            made, reused = statistics.median(on_demand), statistics.median(cached)
            print(
                f"  {fmt} {width}x{height}: made on demand {made * 1000:.1f},"
                f" already made {reused * 1000:.1f}"
            )

        pid = cluster.processes["media1"].pid
        source = bench.make_file(100 * MB)
        time.sleep(1.0)
        idle = RssSampler(pid).status_kb("VmRSS")
        with RssSampler(pid) as during_upload:
            _, uri = bench.upload(source)
        with RssSampler(pid) as during_download:
            bench.download(uri, 100 * MB)
        hwm = RssSampler(pid).status_kb("VmHWM")
        up_peak, down_peak = during_upload.peak_kb, during_download.peak_kb
        print(
            f"media worker RSS: idle {idle / 1024:.1f} MB; peak during a 100 MB upload"
            f" {up_peak / 1024:.1f} MB (+{(up_peak - idle) / 1024:.1f});"
            f" during its download {down_peak / 1024:.1f} MB"
            f" (+{(down_peak - idle) / 1024:.1f})"
        )
        print(
            f"media worker high-water mark: {hwm_after_transfers / 1024:.1f} MB after the"
            f" 1 MB and 50 MB transfers, {hwm / 1024:.1f} MB at the end (thumbnails decode"
            " whole images)"
        )
        os.unlink(source)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
