#!/usr/bin/env python3
"""Tick → saga created latency of a schedule: one `example-sagas serve` process on DATABASE_URL,
a schedule of `place_order` every second for 60 s, then, for each tick, the saga's `created_at`
minus the tick's instant. Usage: scripts/schedule-latency.py DATABASE_URL WORKDIR (an empty
directory for the shop's database); SAGA_BIN names the binary (default target/release)."""
import datetime, json, os, statistics, subprocess, sys, time, urllib.request
db = sys.argv[1]; workdir = sys.argv[2]
binary = os.environ.get("SAGA_BIN", "target/release/example-sagas")
p = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0",
    "--database-url", db, "--shop-database-url", f"sqlite://{workdir}/shop.db"],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={"RUST_LOG": "error", "PATH": "/usr/bin:/bin"})
base = None
for line in p.stdout:
    if line.startswith("listening on "):
        base = line.split()[2]; break
def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read() or b"null")
time.sleep(1)
call("POST", "/v1/schedules", {"id": "bench", "saga": "place_order", "every": "1s", "overlap": "allow_all",
     "input": {"order_id": "b", "user": "ada", "amount": 1}})
time.sleep(62)
call("POST", "/v1/schedules/bench/pause")
runs = call("GET", "/v1/schedules/bench")["runs"]
def ms(t): return datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() * 1000
lat = []
for r in runs:
    s = call("GET", f"/v1/sagas/{r['saga_id']}")
    lat.append(ms(s["created_at"]) - ms(r["scheduled_at"]))
p.kill()
lat.sort()
q = statistics.quantiles(lat, n=100, method="inclusive")
print(f"ticks={len(lat)} p50={q[49]:.1f}ms p99={q[98]:.1f}ms max={max(lat):.1f}ms")
