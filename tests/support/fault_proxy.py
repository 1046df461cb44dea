#!/usr/bin/env python3
"""An HTTP proxy that injects faults between an S3 client and its server (tests only).

    python3 fault_proxy.py --upstream 127.0.0.1:PORT --rules RULES.json --log FAULTS.log --port-file PORT.txt

It listens on a free loopback port (written to --port-file), forwards each
request to --upstream unchanged (the Host header too, so signatures still
match) and answers with the upstream's response, unless a rule of the rules
file matches the request. The file is read again before every request, so a
test changes the faults by rewriting it; counts start over when it changes.

    {"rules": [{"method": "PUT", "query": "partNumber=", "action": "slowdown", "every": 2}]}

A rule matches a request by "method", and substrings of the path ("path") and
query ("query"); among its matches it fires on the ones chosen by "nth" (a
list of 1-based numbers), "first" (the first N), "every" (the 1st, (1+K)th,
... match) or, with none of these, on all. Actions:

    slowdown  answer 503 with an S3 SlowDown error document (not forwarded)
    status    answer "status" with an S3 error document of "code" (not forwarded)
    reset     close the connection with a TCP reset, no response (before forwarding,
              or after it with "after": true: the request took effect, its answer is lost)
    truncate  forward, then send the headers and only "fraction" (default 0.5) of the
              body before closing
    delay     wait "seconds", then forward

Each fault fired is one line of --log: "ACTION METHOD PATH?QUERY".
"""
import argparse
import http.client
import json
import os
import socket
import socketserver
import struct
import threading
import time

MAX_HEAD = 64 << 10
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


class Rules:
    """The rules file, reread per request, and how often each rule has matched."""

    def __init__(self, path, log_path):
        self.path, self.log_path = path, log_path
        self.lock = threading.Lock()
        self.text, self.rules, self.matches = None, [], []

    def fault_for(self, method, path, query):
        with self.lock:
            try:
                with open(self.path) as f:
                    text = f.read()
            except FileNotFoundError:
                text = '{"rules": []}'
            if text != self.text:
                self.text, self.rules = text, json.loads(text or '{"rules": []}')["rules"]
                self.matches = [0] * len(self.rules)
            for index, rule in enumerate(self.rules):
                if rule.get("method", method) != method or rule.get("path", "") not in path:
                    continue
                if rule.get("query", "") not in query:
                    continue
                self.matches[index] += 1
                n = self.matches[index]
                if "nth" in rule:
                    fires = n in rule["nth"]
                elif "first" in rule:
                    fires = n <= rule["first"]
                elif "every" in rule:
                    fires = (n - 1) % rule["every"] == 0
                else:
                    fires = True
                if fires:
                    with open(self.log_path, "a") as log:
                        log.write("%s %s %s?%s\n" % (rule["action"], method, path, query))
                    return rule
            return None


def error_document(code, message):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message>'
            "<RequestId>FAULTPROXY</RequestId></Error>" % (code, message)).encode()


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        self.buffer = b""
        upstream = None
        try:
            while True:
                request = self.read_request()
                if request is None:
                    return
                method, target, headers, body = request
                path, _, query = target.partition("?")
                rule = self.server.rules.fault_for(method, path, query)
                action = rule["action"] if rule else None
                if action == "slowdown":
                    self.answer(503, "Slow Down", error_document("SlowDown", "Please reduce your request rate."))
                    continue
                if action == "status":
                    self.answer(rule["status"], "Injected", error_document(rule["code"], "Injected by fault_proxy."))
                    continue
                if action == "reset" and not rule.get("after"):
                    return self.reset()
                if action == "delay":
                    time.sleep(rule["seconds"])
                if upstream is None:
                    upstream = http.client.HTTPConnection(*self.server.upstream, timeout=60)
                upstream.request(method, target, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                if response.will_close:
                    upstream.close()
                    upstream = None
                if action == "reset":
                    return self.reset()
                self.forward(method, response, data, rule if action == "truncate" else None)
                if action == "truncate":
                    return
        except (ConnectionError, socket.timeout):
            return
        finally:
            if upstream is not None:
                upstream.close()

    def read_request(self):
        """(method, target, headers, body) of the next request, None when the client is done."""
        while b"\r\n\r\n" not in self.buffer:
            if len(self.buffer) > MAX_HEAD:
                raise ConnectionError("request head too large")
            chunk = self.request.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if ":" in line]
        length = int(dict((k.lower(), v) for k, v in headers).get("content-length", "0"))
        while len(self.buffer) < length:
            chunk = self.request.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        # http.client sends the Host and Content-Length it is given, and adds
        # Accept-Encoding only when absent: nothing signed changes.
        return method, target, dict(headers), body

    def answer(self, status, reason, body):
        head = "HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n" % (
            status, reason, len(body))
        self.request.sendall(head.encode() + body)

    def forward(self, method, response, data, truncate_rule):
        lines = ["HTTP/1.1 %d %s" % (response.status, response.reason)]
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                lines.append("%s: %s" % (name, value))
        length = response.getheader("Content-Length") if method == "HEAD" else str(len(data))
        if length is not None:
            lines.append("Content-Length: " + length)
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if truncate_rule:
            data = data[: int(len(data) * truncate_rule.get("fraction", 0.5))]
        self.request.sendall(head + (b"" if method == "HEAD" else data))

    def reset(self):
        # SO_LINGER with a zero timeout: close() sends RST instead of FIN (closed
        # here, before socketserver's own shutdown() could send a FIN first).
        self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.request.close()


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the S3 server")
    parser.add_argument("--rules", required=True, help="JSON rules file, reread per request")
    parser.add_argument("--log", required=True, help="one line per fault fired")
    parser.add_argument("--port-file", required=True, help="where to write the port listened on")
    args = parser.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    server = Server(("127.0.0.1", 0), Handler)
    server.upstream = (host, int(port))
    server.rules = Rules(args.rules, args.log)
    temporary = args.port_file + ".tmp"
    with open(temporary, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(temporary, args.port_file)  # whole, so a reader never sees half a number
    server.serve_forever()


if __name__ == "__main__":
    main()
