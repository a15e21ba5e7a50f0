#!/usr/bin/env python3
"""What the web console's live updates cost a server: N open pages polling as console.js does,
against a real `example-sagas serve`, and the server's CPU time over the run.

A saga page reads the saga and the counts every 2 s, and its attempts, events and deliveries
only when the saga changed (its events, while it runs, at least every fifth time; its
deliveries every third time while one is pending); a list page reads a page of sagas, the sagas
needing attention and the counts every 5 s. The pages watch sagas that are still running (a
signal wait), so they never stop polling.

Usage: [ITEMS=N] scripts/bench-console-poll.py BINARY [PAGES] [SECONDS]
(ITEMS: the items of each watched saga, one branch each; 4 by default.)
Prints one line: pages, requests/s, server CPU % of one core, and that CPU with no page open."""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

binary = sys.argv[1]
pages = int(sys.argv[2]) if len(sys.argv) > 2 else 50
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
tmp = tempfile.mkdtemp()
server = subprocess.Popen(
    [binary, "serve", "--listen", "127.0.0.1:0", "--database-url", f"sqlite://{tmp}/saga.db",
     "--shop-database-url", f"sqlite://{tmp}/shop.db"],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "error"}, text=True)
base = None
for line in server.stdout:
    if line.startswith("listening on "):
        base = line.split()[-1]
        break


def call(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read() or b"null")


# A log with some history, and sagas that wait (so that their pages keep polling).
items = [{"sku": f"sku-{i}", "qty": 1} for i in range(int(os.environ.get("ITEMS", "4")))]
for i in range(200):
    call("/v1/sagas/place_order", {"order_id": f"o-{i}", "user": "ada", "amount": 10})
waiting = [call("/v1/sagas/fulfil_order", {"order_id": f"f-{i}", "user": "ada", "amount": 10,
                                           "needs_approval": True, "items": items})["id"]
           for i in range(10)]
time.sleep(2)


def cpu_seconds():
    with open(f"/proc/{server.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(n):
    stop = time.monotonic() + seconds
    count = [0]
    lock = threading.Lock()

    def saga_page(saga):
        polls = 0
        seen = None
        pending = False
        while time.monotonic() < stop:
            now = call(f"/v1/sagas/{saga}")
            call("/v1/counts")
            made = 2
            polls += 1
            changed = now != seen
            seen = now
            if changed:
                call(f"/v1/sagas/{saga}/attempts")
                made += 1
            if changed or (now["status"] not in ("COMPLETED", "COMPENSATED", "ABORTED")
                           and polls % 5 == 0):
                call(f"/v1/sagas/{saga}/events")
                made += 1
            if changed or (pending and polls % 3 == 0):
                deliveries = call(f"/v1/sagas/{saga}/deliveries")["deliveries"]
                pending = any(d["state"] == "pending" for d in deliveries)
                made += 1
            with lock:
                count[0] += made
            time.sleep(2)

    def list_page():
        while time.monotonic() < stop:
            for p in ["/v1/sagas?limit=50", "/v1/sagas?needs_attention=true&limit=10", "/v1/counts"]:
                call(p)
            with lock:
                count[0] += 3
            time.sleep(5)

    threads = [threading.Thread(target=saga_page, args=(waiting[i % len(waiting)],)) if i % 2 == 0
               else threading.Thread(target=list_page) for i in range(n)]
    before = cpu_seconds()
    started = time.monotonic()
    for t in threads:
        t.start()
    if not threads:
        time.sleep(seconds)
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    return count[0] / elapsed, (cpu_seconds() - before) / elapsed * 100


try:
    _, idle = measure(0)
    rate, busy = measure(pages)
    print(f"console-poll pages={pages} (half saga pages, half lists) requests_per_s={rate:.1f} "
          f"server_cpu_pct={busy:.2f} idle_server_cpu_pct={idle:.2f}")
finally:
    server.kill()
