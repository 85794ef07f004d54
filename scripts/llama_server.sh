#!/usr/bin/env bash
# An OpenAI-compatible server for kvgen's remote models: the server of the PyPI package
# llama-cpp-python (it builds llama.cpp from source), in a virtual environment of its own.
#   scripts/llama_server.sh install          create the environment (once; a few minutes on 2 cores,
#                                            then cached: the environment and pip's wheel cache)
#   scripts/llama_server.sh ready            exit 0 when the environment is installed
#   scripts/llama_server.sh start PORT [GGUF] serve GGUF (default: the default model) on 127.0.0.1:PORT,
#                                            in the background; returns once it answers
#   scripts/llama_server.sh stop PORT        stop the server started on PORT
#   scripts/llama_server.sh kill PORT        kill it at once (SIGKILL: connections drop mid-reply)
# KVGEN_SERVER_VENV: where the environment lives (default ~/.cache/kvgen/llama-server).
set -euo pipefail
# a sanitizer run's preloads are for kvgen's processes, not for Python
unset LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${KVGEN_SERVER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgen/llama-server}
version=0.3.36
run_dir=${TMPDIR:-/tmp}/kvgen-llama-server

cmd=${1:-}
case "$cmd" in
install)
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import llama_cpp.server, llama_cpp; assert llama_cpp.__version__ == '$version'" 2>/dev/null; then
    echo "llama_server: llama-cpp-python $version already in $venv"
    exit 0
  fi
  mkdir -p "$(dirname "$venv")"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
  echo "llama_server: building llama-cpp-python $version into $venv (CPU only)"
  # the CPU build without llama.cpp's own tools, tests and examples: the Python server only
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \
    "$venv/bin/python" -m pip install -q "llama-cpp-python[server]==$version"
  ;;
ready)
  [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import llama_cpp.server" 2>/dev/null
  ;;
start)
  port=${2:?port}
  model=${3:-${KVGEN_MODEL:-$here/models/SmolLM2-135M-Instruct.Q4_1.gguf}}
  mkdir -p "$run_dir"
  log="$run_dir/$port.log"
  # --logits_all: prompt log-probabilities (echo) for choice scoring; one thread: CI shares its
  # two cores with the tests
  "$venv/bin/python" -m llama_cpp.server --model "$model" --host 127.0.0.1 --port "$port" \
    --n_ctx 4096 --n_threads "${KVGEN_SERVER_THREADS:-1}" --logits_all true --interrupt_requests false >"$log" 2>&1 &
  echo $! >"$run_dir/$port.pid"
  for _ in $(seq 1 300); do
    if "$venv/bin/python" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/v1/models', timeout=1)" 2>/dev/null; then
      exit 0
    fi
    if ! kill -0 "$(cat "$run_dir/$port.pid")" 2>/dev/null; then
      echo "llama_server: the server on port $port exited; its log:" >&2
      tail -n 20 "$log" >&2
      exit 1
    fi
    sleep 0.2
  done
  echo "llama_server: no answer on port $port after 60 s" >&2
  exit 1
  ;;
stop | kill)
  port=${2:?port}
  pidf="$run_dir/$port.pid"
  [ -f "$pidf" ] || exit 0
  pid=$(cat "$pidf")
  if [ "$cmd" = kill ]; then kill -9 "$pid" 2>/dev/null || true; else kill "$pid" 2>/dev/null || true; fi
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidf"
  ;;
*)
  sed -n '2,12p' "$0" >&2
  exit 2
  ;;
esac
