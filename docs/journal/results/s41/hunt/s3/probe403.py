import os, time, threading, torch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import fake403
seen = []
orig = fake403.H._deny
def deny(self):
    seen.append((self.command, self.path, dict(self.headers)))
    orig(self)
fake403.H._deny = deny
fake403.H.do_GET = fake403.H.do_PUT = fake403.H.do_POST = fake403.H.do_DELETE = fake403.H.do_HEAD = deny
srv, ep = fake403.start()
import s3fs
fs = s3fs.S3FileSystem(key="k", secret="s", client_kwargs={"endpoint_url": ep}, config_kwargs={"retries": {"max_attempts": 1}, "read_timeout": 5, "connect_timeout": 5}, skip_instance_cache=True)
t = time.time()
try:
    fs.call_s3("put_object", Bucket="b", Key="a", Body=b"x" * 3000)
except Exception as e:
    print(type(e).__name__, e, time.time() - t)
for s in seen: print(s)
