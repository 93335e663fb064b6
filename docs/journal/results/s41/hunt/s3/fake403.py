"""An endpoint that answers every S3 request 403 AccessDenied, as S3 does for wrong credentials."""
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code>'
        b'<Message>The AWS Access Key Id you provided does not exist in our records.</Message></Error>')

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_expect_100(self):
        return True  # answer the final status at once, as S3 does for a request it refuses
    def _deny(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n and "100-continue" not in (self.headers.get("Expect") or "").lower():
            self.rfile.read(n)
        self.close_connection = True
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(0 if self.command == "HEAD" else len(BODY)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD": self.wfile.write(BODY)
    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _deny
    def log_message(self, *a): pass

def start():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"
