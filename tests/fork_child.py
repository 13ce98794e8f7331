"""A runtime/forks.py server for tests/test_forks.py: each child sleeps until signalled."""
import sys
import time

from actorjet.runtime import forks

if __name__ == "__main__":
    sys.exit(forks.serve(sys.argv[1:], lambda run_dir: None, lambda run_dir: time.sleep(120)))
