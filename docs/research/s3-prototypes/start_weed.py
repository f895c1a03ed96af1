"""Start `weed mini` on 127.0.0.1 with free ports; print the S3 endpoint and pid."""
import os, socket, subprocess, sys, time, urllib.request, json

def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s); ports.append(s.getsockname()[1])
    for s in socks: s.close()
    return ports

data = sys.argv[1] if len(sys.argv) > 1 else "/tmp/s3research/weeddata"
os.makedirs(data, exist_ok=True)
p = free_ports(8)
names = ["master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
         "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc"]
args = ["/tmp/s3research/bin/weed", "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
        "-master.telemetry=false", "-bucket=test"] + [f"-{k}={v}" for k, v in zip(names, p)]
env = dict(os.environ, AWS_ACCESS_KEY_ID="testkey", AWS_SECRET_ACCESS_KEY="testsecret")
t0 = time.time()
log = open(os.path.join(data, "weed.log"), "w")
proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
s3 = f"http://127.0.0.1:{p[6]}"
ok = False
while time.time() - t0 < 60:
    try:
        urllib.request.urlopen(s3 + "/", timeout=1)
        ok = True
    except urllib.error.HTTPError as e:
        ok = True  # 403 = answering
    except Exception:
        pass
    if ok: break
    time.sleep(0.1)
t_http = time.time() - t0
print(json.dumps({"pid": proc.pid, "endpoint": s3, "http_up_s": round(t_http, 2), "cmd": " ".join(args)}))
