#!/usr/bin/env python3
"""A plain OpenAI-compatible client, the peer of `kvgen bench URL --peer-remote`: N streamed
completion requests at once (one thread each, Python's standard library only), each the prompt
"Once upon a time" with max_tokens TOKENS, greedy, end-of-generation ignored where the server
has that option: the requests kvgen's remote sessions send. Prints one JSON line:
{"tokens": reply events with text, "seconds": first request to last reply's end}.

    scripts/openai_load.py URL MODEL SESSIONS TOKENS
"""
import json
import sys
import threading
import time
import urllib.request

url, model, n, tokens = sys.argv[1].rstrip("/"), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": tokens, "stream": True,
                   "temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0, "repeat_penalty": 1, "seed": 24301,
                   "cache_prompt": True, "ignore_eos": True}).encode()
counts = [0] * n
errors = []


def run(i):
    try:
        req = urllib.request.Request(url + "/completions", data=body,
                                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                ev = json.loads(data)
                if ev["choices"][0].get("text"):
                    counts[i] += 1
    except Exception as e:  # reported, and the run fails
        errors.append(str(e))


t0 = time.monotonic()
threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
seconds = time.monotonic() - t0
if errors:
    sys.stderr.write("openai_load: %s\n" % errors[0])
    sys.exit(1)
print(json.dumps({"tokens": sum(counts), "seconds": seconds}))
