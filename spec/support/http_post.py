#!/usr/bin/env python3
"""A plain HTTP request to an OpenAI-compatible server, as a client without kvgen makes it:
POSTs the JSON body read from a file and prints the reply's text (completions) or message
content (chat completions), nothing else. Used by spec/remote_spec.lua as the reference.

    python3 spec/support/http_post.py URL BODY_FILE
"""
import json
import sys
import urllib.request

url, body_file = sys.argv[1], sys.argv[2]
with open(body_file, "rb") as f:
    body = f.read()
req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=120) as r:
    reply = json.load(r)
choice = reply["choices"][0]
text = choice["message"]["content"] if "message" in choice else choice["text"]
sys.stdout.write(text)
