"""`python -m pipelines.train`: runs `pipelines.commands.train.main`."""

import sys

from pipelines.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
