"""`python -m pipelines.evaluate`: runs `pipelines.commands.evaluate.main`."""

import sys

from pipelines.commands.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
