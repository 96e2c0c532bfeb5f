"""Writes N lines of 80 characters to stdout as fast as Python can (a dump, not a training log).
    python3 firehose.py N"""
import sys

sys.stdout.write(("x" * 79 + "\n") * int(sys.argv[1]))
sys.stdout.flush()
