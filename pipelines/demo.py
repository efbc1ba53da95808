"""`python -m pipelines.demo`: runs `pipelines.commands.demo.main`."""

import sys

from pipelines.commands.demo import main

if __name__ == "__main__":
    sys.exit(main())
