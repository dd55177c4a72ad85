"""A fork server that takes one run and ends without answering (``test_launcher``)."""

import sys

print('{"ready": 0}', flush=True)
sys.stdin.readline()
