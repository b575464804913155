"""runtime/stopping.py in a process of its own, sent SIGTERM as a node is: a stoppable call in the
main thread ends at once; one in another thread too, also when the first Stopped lands inside a
ctypes callback (where Python must drop it: it is handed over again, quietly); a thread that left
its stoppable call before the signal goes on unharmed; a stoppable call made after the signal is
refused at once. (Node processes in each state: test_shutdown.py.)
"""

from __future__ import annotations

import json
import signal
import sys

import pytest
from support import Proc

SCRIPT = r'''
import ctypes, json, signal, threading, time
from edge_llm_ros.runtime import stopping

signalled_at = []
def on_signal(signum, frame):
    signalled_at.append(time.monotonic())
    stopping.signalled(frame)
signal.signal(signal.SIGTERM, on_signal)

results, in_callback, outside_done_call = {}, threading.Event(), threading.Event()
libc = ctypes.CDLL(None)
compare_t = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)

@compare_t
def compare(a, b):  # C calls it: an exception raised in here cannot propagate, Python drops it
    in_callback.set()
    try:
        while True:
            sum(range(100))
    finally:
        results["left the callback"] = time.monotonic()

def work():
    pair = (ctypes.c_int * 2)(2, 1)
    libc.qsort(pair, 2, ctypes.sizeof(ctypes.c_int), compare)  # ends when Stopped lands in compare (dropped)
    while True:
        sum(range(1000))  # plain Python: where the Stopped handed over again lands

def worker():
    try:
        stopping.stoppable(work)
    except stopping.Stopped:
        results["worker stopped"] = time.monotonic()

def outside():
    stopping.stoppable(lambda: None)  # a stoppable call, over before the signal
    outside_done_call.set()
    while not signalled_at or time.monotonic() < signalled_at[0] + 1.0:
        sum(range(1000))
    results["outside"] = "finished"

threads = [threading.Thread(target=worker), threading.Thread(target=outside)]
for t in threads:
    t.start()
in_callback.wait(30)
outside_done_call.wait(30)
print("ready", flush=True)
try:
    stopping.stoppable(lambda: [sum(range(1000)) for _ in iter(int, 1)])
except stopping.Stopped:
    results["main stopped"] = time.monotonic()
for t in threads:
    t.join(10)
try:
    stopping.stoppable(lambda: None)
    results["after"] = "ran"
except stopping.Stopped:
    results["after"] = "refused"
results = {k: v - signalled_at[0] if isinstance(v, float) else v for k, v in results.items()}
print(json.dumps(results), flush=True)
'''


@pytest.mark.slow
def test_stoppable_calls_end_at_a_signal_in_every_thread_and_nothing_else_does():
    proc = Proc([sys.executable, "-c", SCRIPT])
    try:
        proc.wait_for_line("ready", 30)
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, proc.output
    finally:
        proc.stop()
    results = json.loads(proc.output.splitlines()[-1])
    assert results["main stopped"] < 0.5, results  # raised by the signal handler itself
    # the first Stopped landed in the ctypes callback and was dropped; the next one, REDELIVER_S later, ended the call
    assert results["left the callback"] < 0.5 and results["left the callback"] < results["worker stopped"] < 1.0, results
    assert results["outside"] == "finished" and results["after"] == "refused", results
    assert "Exception ignored" not in proc.output and "Traceback" not in proc.output, proc.output
