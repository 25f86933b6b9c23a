#!/usr/bin/env python3
"""The VM lab's release server: https on 127.0.0.1:443 inside the guest.

Serves ROOT as GitHub serves kelp's releases: ROOT/kelp-dev/kelp/releases/
download/VERSION/FILE and latest/download/FILE, and redirects
releases/latest to releases/tag/VERSION, which is how install.sh finds the
newest version.

usage: releases.py ROOT VERSION CERT KEY
"""
import functools
import http.server
import ssl
import sys

root, version, cert, key = sys.argv[1:5]
releases = "/kelp-dev/kelp/releases"


class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        if path == releases + "/latest":
            self.send_response(302)
            self.send_header("Location", releases + "/tag/" + version)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path == releases + "/tag/" + version:
            body = version.encode() + b"\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()


server = http.server.ThreadingHTTPServer(("127.0.0.1", 443), functools.partial(Handler, directory=root))
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
